//! The stderr log layer: `tracing-subscriber`'s fmt output, text or JSON,
//! under an `EnvFilter`; colours only on a terminal, never with `NO_COLOR`.

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
    use std::io::IsTerminal;
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
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

/// Whether text logs get ANSI colours: only when stderr is a terminal (a
/// journal, a file or a pipe would keep the escape codes as text), and
/// never when `NO_COLOR` is set to anything but the empty string
/// (<https://no-color.org>).
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::use_colour;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        let rows = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (false, None, false),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, expected) in rows {
            assert_eq!(
                use_colour(terminal, no_color.map(OsStr::new)),
                expected,
                "terminal {terminal}, NO_COLOR {no_color:?}"
            );
        }
    }
}
