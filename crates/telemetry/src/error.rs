//! The crate's one error type, so callers match on what went wrong rather
//! than on strings from the OpenTelemetry crates.

use std::time::Duration;

use crate::appinsights::AppInsightsConnectionStringError;

/// Everything that can go wrong while configuring, installing, flushing or
/// shutting down telemetry.
///
/// No variant ever carries the Application Insights instrumentation key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// A setting could not be read, or has a value this crate cannot use.
    #[error(transparent)]
    Setting(#[from] spot_worker_settings::SettingError),

    /// `OTEL_EXPORTER_OTLP_PROTOCOL` asks for a transport this crate does not
    /// ship (only `http/protobuf` is built in, to keep gRPC out of the tree).
    #[error("unsupported OTLP protocol {0:?}: only \"http/protobuf\" is supported")]
    UnsupportedProtocol(String),

    /// The log filter (`RUST_LOG` or [`TelemetryConfig::log_filter`](crate::TelemetryConfig::log_filter))
    /// does not parse.
    #[error("invalid log filter: {0}")]
    InvalidLogFilter(String),

    /// The Application Insights connection string does not parse.
    #[error("invalid Application Insights connection string: {0}")]
    InvalidConnectionString(#[from] AppInsightsConnectionStringError),

    /// An exporter or its HTTP client could not be built.
    #[error("building the {exporter} exporter failed: {reason}")]
    ExporterBuild {
        /// `"otlp"`, `"app_insights"` or `"http_client"`.
        exporter: &'static str,
        /// The underlying error, as text.
        reason: String,
    },

    /// A global tracing subscriber was already installed in this process.
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInitialized(String),

    /// A flush or shutdown did not finish within its time budget; whatever
    /// was still being exported may be lost.
    #[error("telemetry {operation} did not finish within {timeout:?}")]
    Timeout {
        /// `"flush"` or `"shutdown"`.
        operation: &'static str,
        /// The budget that ran out.
        timeout: Duration,
    },

    /// A flush or shutdown finished in time but an exporter reported a
    /// failure (for example the collector answered with an error status).
    #[error("telemetry {operation} failed: {reason}")]
    Export {
        /// `"flush"` or `"shutdown"`.
        operation: &'static str,
        /// The underlying error, as text.
        reason: String,
    },
}
