//! Building the OpenTelemetry tracer and meter providers with an exporter
//! per configured backend (OTLP/HTTP, Application Insights, or both).
//!
//! Exports run on the SDK's own background threads (batch span processor,
//! periodic metric reader), not on the caller's async runtime, so the HTTP
//! client is reqwest's blocking one, which brings its own I/O thread.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::appinsights::{self, AppInsightsConnectionString};
use crate::config::TelemetryConfig;
use crate::error::TelemetryError;

/// The providers, present only when at least one backend is configured.
pub(crate) struct Providers {
    pub(crate) tracer: Option<SdkTracerProvider>,
    pub(crate) meter: Option<SdkMeterProvider>,
}

pub(crate) fn build(config: &TelemetryConfig) -> Result<Providers, TelemetryError> {
    // Parse before building anything, so a bad string fails without side effects.
    let app_insights = config
        .app_insights_connection_string
        .as_deref()
        .map(AppInsightsConnectionString::parse)
        .transpose()?;
    if config.otlp_endpoint.is_none() && app_insights.is_none() {
        return Ok(Providers {
            tracer: None,
            meter: None,
        });
    }

    let resource = resource(config);
    let client = http_client(config.export_timeout)?;
    let mut tracer = SdkTracerProvider::builder().with_resource(resource.clone());
    let mut meter = SdkMeterProvider::builder().with_resource(resource);

    if let Some(endpoint) = &config.otlp_endpoint {
        let base = endpoint.trim().trim_end_matches('/');
        let otlp_error =
            |error: opentelemetry_otlp::ExporterBuildError| TelemetryError::ExporterBuild {
                exporter: "otlp",
                reason: error.to_string(),
            };
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(config.export_timeout)
            .build()
            .map_err(otlp_error)?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(config.export_timeout)
            .build()
            .map_err(otlp_error)?;
        tracer = tracer.with_batch_exporter(spans);
        meter = meter.with_reader(
            PeriodicReader::builder(metrics)
                .with_interval(config.metric_export_interval)
                .build(),
        );
    }

    if let Some(connection_string) = &app_insights {
        let exporter = appinsights::exporter(connection_string, client).map_err(|reason| {
            TelemetryError::ExporterBuild {
                exporter: "app_insights",
                reason,
            }
        })?;
        tracer = tracer.with_batch_exporter(exporter.clone());
        meter = meter.with_reader(
            PeriodicReader::builder(exporter)
                .with_interval(config.metric_export_interval)
                .build(),
        );
    }

    Ok(Providers {
        tracer: Some(tracer.build()),
        meter: Some(meter.build()),
    })
}

/// `service.name` from the config wins over `OTEL_SERVICE_NAME`; the rest
/// of the environment (`OTEL_RESOURCE_ATTRIBUTES`) is kept.
fn resource(config: &TelemetryConfig) -> Resource {
    Resource::builder()
        .with_attributes(
            config
                .resource_attributes
                .iter()
                .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
        )
        .with_service_name(config.service_name.clone())
        .build()
}

/// One client for every exporter. Its own timeout bounds each request, so
/// a collector that accepts connections but never answers cannot hold an
/// export thread forever.
fn http_client(timeout: Duration) -> Result<reqwest::blocking::Client, TelemetryError> {
    let build_error = |reason: String| TelemetryError::ExporterBuild {
        exporter: "http_client",
        reason,
    };
    // The blocking client starts a Tokio runtime of its own; building it on
    // a fresh thread keeps that legal when the caller is inside a runtime.
    std::thread::Builder::new()
        .name("spot-worker-telemetry-client".to_owned())
        .spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()
        })
        .map_err(|error| build_error(error.to_string()))?
        .join()
        .map_err(|_| build_error("the thread building the HTTP client panicked".to_owned()))?
        .map_err(|error| build_error(error.to_string()))
}
