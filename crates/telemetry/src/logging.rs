//! The stderr log layer: `tracing-subscriber`'s fmt output, text or JSON,
//! under an `EnvFilter`.

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;

/// Parses [`TelemetryConfig::log_filter`]. An invalid filter is an error
/// rather than silently logging everything or nothing.
pub(crate) fn env_filter(config: &TelemetryConfig) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::builder()
        .parse(&config.log_filter)
        .map_err(|error| TelemetryError::InvalidLogFilter(error.to_string()))
}

/// The fmt layer writing to stderr, boxed because text and JSON layers are
/// different types.
pub(crate) fn fmt_layer<S>(config: &TelemetryConfig) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if config.json_logs {
        layer
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed()
    } else {
        layer.boxed()
    }
}
