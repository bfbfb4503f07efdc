//! What to export where: [`TelemetryConfig`], read from the standard
//! OpenTelemetry environment variables or built in code.

use std::fmt;
use std::time::Duration;

use std::borrow::Cow;

use spot_worker_settings::{Setting, Source, table};

use crate::appinsights::AppInsightsConnectionString;
use crate::error::TelemetryError;

/// The OpenTelemetry default for `OTEL_METRIC_EXPORT_INTERVAL`.
pub const DEFAULT_METRIC_EXPORT_INTERVAL: Duration =
    Duration::from_millis(table::METRIC_EXPORT_INTERVAL.default);
/// The OpenTelemetry default for `OTEL_EXPORTER_OTLP_TIMEOUT`.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_millis(table::OTLP_TIMEOUT.default);

/// How telemetry is set up: logging, and which backends (if any) receive
/// spans and metrics.
///
/// With neither `otlp_endpoint` nor `app_insights_connection_string`, only
/// logs are written (to stderr) and [`Metrics`](crate::Metrics) are no-ops.
/// Both backends may be set at once.
///
/// `Debug` redacts the Application Insights connection string.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// `service.name` of the resource (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// Extra resource attributes, on top of those from
    /// `OTEL_RESOURCE_ATTRIBUTES` (for example the VM's name from IMDS).
    pub resource_attributes: Vec<(String, String)>,
    /// `tracing-subscriber` `EnvFilter` directives for the stderr log
    /// (`RUST_LOG`, default `info`). Spans below this level are not exported.
    pub log_filter: String,
    /// Write logs as JSON lines (`SPOT_WORKER_LOG_FORMAT=json`) rather than
    /// human-readable text.
    pub json_logs: bool,
    /// Base URL of an OTLP/HTTP collector, e.g. `http://localhost:4318`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`); `/v1/traces` and `/v1/metrics` are
    /// appended. Headers come from `OTEL_EXPORTER_OTLP_HEADERS`.
    pub otlp_endpoint: Option<String>,
    /// Application Insights connection string
    /// (`APPLICATIONINSIGHTS_CONNECTION_STRING`). Contains a secret.
    pub app_insights_connection_string: Option<String>,
    /// How often metrics are pushed (`OTEL_METRIC_EXPORT_INTERVAL`, ms).
    pub metric_export_interval: Duration,
    /// Upper bound of one export request, including retries
    /// (`OTEL_EXPORTER_OTLP_TIMEOUT`, ms).
    pub export_timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            service_name: table::SERVICE_NAME.default.to_string(),
            resource_attributes: Vec::new(),
            log_filter: table::LOG_FILTER.default.to_string(),
            json_logs: false,
            otlp_endpoint: None,
            app_insights_connection_string: None,
            metric_export_interval: DEFAULT_METRIC_EXPORT_INTERVAL,
            export_timeout: DEFAULT_EXPORT_TIMEOUT,
        }
    }
}

impl fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The parsed form redacts the key; an unparsable string is hidden whole.
        let app_insights = self.app_insights_connection_string.as_deref().map(|raw| {
            AppInsightsConnectionString::parse(raw)
                .map(|cs| cs.to_string())
                .unwrap_or_else(|_| "<redacted>".to_owned())
        });
        f.debug_struct("TelemetryConfig")
            .field("service_name", &self.service_name)
            .field("resource_attributes", &self.resource_attributes)
            .field("log_filter", &self.log_filter)
            .field("json_logs", &self.json_logs)
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("app_insights_connection_string", &app_insights)
            .field("metric_export_interval", &self.metric_export_interval)
            .field("export_timeout", &self.export_timeout)
            .finish()
    }
}

impl TelemetryConfig {
    /// Reads the configuration from the process environment and the
    /// settings file (see [`spot_worker_settings`]).
    ///
    /// | setting | effect |
    /// | --- | --- |
    /// | `OTEL_SERVICE_NAME` | [`service_name`](Self::service_name) |
    /// | `RUST_LOG` | [`log_filter`](Self::log_filter) |
    /// | `SPOT_WORKER_LOG_FORMAT` | `json` or `text` |
    /// | `OTEL_EXPORTER_OTLP_ENDPOINT` | [`otlp_endpoint`](Self::otlp_endpoint) |
    /// | `OTEL_EXPORTER_OTLP_PROTOCOL` | must be unset or `http/protobuf` |
    /// | `OTEL_EXPORTER_OTLP_TIMEOUT` | [`export_timeout`](Self::export_timeout), ms |
    /// | `OTEL_METRIC_EXPORT_INTERVAL` | [`metric_export_interval`](Self::metric_export_interval), ms |
    /// | `APPLICATIONINSIGHTS_CONNECTION_STRING` | checked here, so a bad one fails fast |
    /// | `OTEL_SDK_DISABLED=true` | no exporter at all, logs only |
    ///
    /// `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_EXPORTER_OTLP_HEADERS` are read
    /// from the environment by the OpenTelemetry SDK when the exporters are
    /// built. Empty values count as unset.
    pub fn from_env() -> Result<Self, TelemetryError> {
        Self::from_source(&Source::from_env()?)
    }

    /// The telemetry settings from `source` (flags, environment, file,
    /// defaults).
    pub fn from_source(source: &Source) -> Result<Self, TelemetryError> {
        let log_format = source.get(&table::LOG_FORMAT)?;
        let json_logs = match log_format.to_ascii_lowercase().as_str() {
            "json" => true,
            "text" => false,
            _ => {
                return Err(source
                    .invalid(&table::LOG_FORMAT, "neither \"json\" nor \"text\"")
                    .into());
            }
        };
        let protocol = source.get(&table::OTLP_PROTOCOL)?;
        if protocol != table::OTLP_PROTOCOL.default {
            return Err(TelemetryError::UnsupportedProtocol(protocol.into_owned()));
        }
        let mut config = TelemetryConfig {
            service_name: source.get(&table::SERVICE_NAME)?.into_owned(),
            resource_attributes: Vec::new(),
            log_filter: source.get(&table::LOG_FILTER)?.into_owned(),
            json_logs,
            otlp_endpoint: None,
            app_insights_connection_string: None,
            metric_export_interval: millis(source, &table::METRIC_EXPORT_INTERVAL)?,
            export_timeout: millis(source, &table::OTLP_TIMEOUT)?,
        };
        if !source.get(&table::SDK_DISABLED)? {
            config.otlp_endpoint = source.get(&table::OTLP_ENDPOINT)?.map(Cow::into_owned);
            if let Some(cs) = source.get(&table::APP_INSIGHTS)? {
                AppInsightsConnectionString::parse(&cs)?;
                config.app_insights_connection_string = Some(cs.into_owned());
            }
        }
        Ok(config)
    }

    /// Sets [`service_name`](Self::service_name).
    pub fn with_service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// Adds one resource attribute to [`resource_attributes`](Self::resource_attributes).
    pub fn with_resource_attribute(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.resource_attributes.push((key.into(), value.into()));
        self
    }

    /// Sets [`log_filter`](Self::log_filter).
    pub fn with_log_filter(mut self, filter: impl Into<String>) -> Self {
        self.log_filter = filter.into();
        self
    }

    /// Sets [`json_logs`](Self::json_logs).
    pub fn with_json_logs(mut self, json: bool) -> Self {
        self.json_logs = json;
        self
    }

    /// Sets [`otlp_endpoint`](Self::otlp_endpoint).
    pub fn with_otlp_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.otlp_endpoint = Some(endpoint.into());
        self
    }

    /// Sets [`app_insights_connection_string`](Self::app_insights_connection_string);
    /// it is parsed (and rejected with a typed error) by [`init`](crate::init)
    /// and [`Telemetry::build`](crate::Telemetry::build).
    pub fn with_app_insights_connection_string(
        mut self,
        connection_string: impl Into<String>,
    ) -> Self {
        self.app_insights_connection_string = Some(connection_string.into());
        self
    }

    /// Sets [`metric_export_interval`](Self::metric_export_interval).
    pub fn with_metric_export_interval(mut self, interval: Duration) -> Self {
        self.metric_export_interval = interval;
        self
    }

    /// Sets [`export_timeout`](Self::export_timeout).
    pub fn with_export_timeout(mut self, timeout: Duration) -> Self {
        self.export_timeout = timeout;
        self
    }

    /// Whether spans and metrics leave the process at all.
    pub fn exports(&self) -> bool {
        self.otlp_endpoint.is_some() || self.app_insights_connection_string.is_some()
    }
}

/// A positive number of milliseconds, as the OpenTelemetry variables give.
fn millis(source: &Source, setting: &Setting<u64>) -> Result<Duration, TelemetryError> {
    match source.get(setting)? {
        0 => Err(source.invalid(setting, "must be greater than 0").into()),
        ms => Ok(Duration::from_millis(ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_settings::SettingError;
    use std::collections::HashMap;

    const KEY: &str = "00000000-1111-2222-3333-444444444444";

    fn from(vars: &[(&str, &str)]) -> Result<TelemetryConfig, TelemetryError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TelemetryConfig::from_source(&Source::from_lookup(move |name| vars.get(name).cloned())?)
    }

    #[test]
    fn empty_environment_gives_defaults() {
        let config = from(&[]).unwrap();
        assert_eq!(config, TelemetryConfig::default());
        assert!(!config.exports());
        assert_eq!(config.log_filter, "info");
        assert_eq!(config.metric_export_interval, Duration::from_secs(60));
    }

    #[test]
    fn reads_standard_variables() {
        let cs = format!("InstrumentationKey={KEY};IngestionEndpoint=https://example.com");
        let config = from(&[
            ("OTEL_SERVICE_NAME", "orders-worker"),
            ("RUST_LOG", "debug,hyper=warn"),
            ("SPOT_WORKER_LOG_FORMAT", "JSON"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &cs),
        ])
        .unwrap();
        assert_eq!(config.service_name, "orders-worker");
        assert_eq!(config.log_filter, "debug,hyper=warn");
        assert!(config.json_logs);
        assert_eq!(
            config.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        assert_eq!(config.metric_export_interval, Duration::from_secs(15));
        assert_eq!(config.export_timeout, Duration::from_millis(2500));
        assert_eq!(
            config.app_insights_connection_string.as_deref(),
            Some(cs.as_str())
        );
        assert!(config.exports());
    }

    #[test]
    fn empty_values_count_as_unset() {
        let config = from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", " "),
            ("RUST_LOG", ""),
        ])
        .unwrap();
        assert_eq!(config, TelemetryConfig::default());
    }

    #[test]
    fn sdk_disabled_turns_off_exporters() {
        let config = from(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ])
        .unwrap();
        assert!(!config.exports());
    }

    #[test]
    fn rejects_bad_values() {
        assert!(matches!(
            from(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
            Err(TelemetryError::UnsupportedProtocol(p)) if p == "grpc"
        ));
        assert!(matches!(
            from(&[("OTEL_METRIC_EXPORT_INTERVAL", "soon")]),
            Err(TelemetryError::Setting(SettingError::Invalid { setting, .. })) if setting == "OTEL_METRIC_EXPORT_INTERVAL"
        ));
        assert!(matches!(
            from(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")]),
            Err(TelemetryError::Setting(SettingError::Invalid { setting, .. })) if setting == "OTEL_EXPORTER_OTLP_TIMEOUT"
        ));
        assert!(matches!(
            from(&[("SPOT_WORKER_LOG_FORMAT", "xml")]),
            Err(TelemetryError::Setting(SettingError::Invalid { setting, .. })) if setting == "SPOT_WORKER_LOG_FORMAT"
        ));
        let error = from(&[(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "Authorization=AAD;InstrumentationKey=00000000-1111-2222-3333-444444444444",
        )])
        .unwrap_err();
        assert!(matches!(error, TelemetryError::InvalidConnectionString(_)));
        assert!(!error.to_string().contains(KEY));
    }

    #[test]
    fn debug_redacts_the_connection_string() {
        let parsable = TelemetryConfig::default().with_app_insights_connection_string(format!(
            "InstrumentationKey={KEY};IngestionEndpoint=https://example.com"
        ));
        let shown = format!("{parsable:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("https://example.com"), "{shown}");
        let garbage =
            TelemetryConfig::default().with_app_insights_connection_string(format!("{KEY};;=x=y"));
        let shown = format!("{garbage:?}");
        assert!(!shown.contains(KEY), "{shown}");
    }
}
