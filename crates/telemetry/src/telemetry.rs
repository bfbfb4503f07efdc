//! [`Telemetry`]: the built providers, the tracing layer that feeds them,
//! the [`Metrics`] handle, and flush/shutdown with a hard time bound.

use std::fmt;
use std::time::Duration;

use opentelemetry::InstrumentationScope;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::registry::LookupSpan;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::export;
use crate::metrics::Metrics;

/// Name and version of this crate's instrumentation scope.
const SCOPE_NAME: &str = "spot-worker";

/// Target prefixes (with `::` or `_` after them, so `hyper_util` and
/// `opentelemetry_sdk` count) whose spans are never exported: the
/// exporters' own HTTP stack. Exporting them would make every export produce telemetry
/// that needs exporting.
const EXPORTER_TARGETS: [&str; 5] = ["opentelemetry", "reqwest", "hyper", "h2", "rustls"];

/// Built telemetry: providers for the configured backends plus the
/// [`Metrics`] recorded into them.
///
/// Get one from [`init`](crate::init) (installs globals) or
/// [`Telemetry::build`] (installs nothing). Call [`shutdown`](Self::shutdown)
/// before the process exits, or buffered spans and metrics are lost.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    metrics: Metrics,
    otlp: bool,
    app_insights: bool,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("otlp", &self.otlp)
            .field("app_insights", &self.app_insights)
            .finish_non_exhaustive()
    }
}

/// The tracing layer returned by [`Telemetry::layer`].
type OtelLayer<S> = Filtered<
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
    FilterFn,
    S,
>;

impl Telemetry {
    /// Builds exporters and providers for `config` without installing
    /// anything global, so several can coexist in one process (tests).
    ///
    /// Pair it with [`layer`](Self::layer) on a subscriber of your own; the
    /// config's log settings are not used here.
    pub fn build(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let providers = export::build(config)?;
        let metrics = match &providers.meter {
            Some(provider) => Metrics::new(&provider.meter_with_scope(scope())),
            None => Metrics::noop(),
        };
        Ok(Self {
            tracer_provider: providers.tracer,
            meter_provider: providers.meter,
            metrics,
            otlp: config.otlp_endpoint.is_some(),
            app_insights: config.app_insights_connection_string.is_some(),
        })
    }

    /// A `tracing` layer that turns spans into OpenTelemetry spans for the
    /// configured backends; `None` (a layer that does nothing) when spans are
    /// not exported. Spans from the exporters' own HTTP stack are skipped.
    ///
    /// Each call returns a new layer feeding the same provider.
    pub fn layer<S>(&self) -> Option<OtelLayer<S>>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        let provider = self.tracer_provider.as_ref()?;
        let filter: FilterFn = FilterFn::new(not_exporter_internal);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer_with_scope(scope()))
                .with_filter(filter),
        )
    }

    /// The metrics handle (a cheap clone); no-op when metrics are not
    /// exported.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Whether spans and metrics go to an OTLP collector.
    pub fn exports_otlp(&self) -> bool {
        self.otlp
    }

    /// Whether spans and metrics go to Application Insights.
    pub fn exports_app_insights(&self) -> bool {
        self.app_insights
    }

    pub(crate) fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.tracer_provider.as_ref()
    }

    pub(crate) fn meter_provider(&self) -> Option<&SdkMeterProvider> {
        self.meter_provider.as_ref()
    }

    /// Exports every finished span and the current metrics now, waiting at
    /// most `timeout`. Spans still open are not included.
    ///
    /// On [`TelemetryError::Timeout`] the export goes on in the background
    /// (bounded by [`TelemetryConfig::export_timeout`]) but nothing waits
    /// for it.
    pub async fn flush(&self, timeout: Duration) -> Result<(), TelemetryError> {
        let mut jobs: Vec<Job> = Vec::new();
        if let Some(provider) = self.tracer_provider.clone() {
            jobs.push(Box::new(move || provider.force_flush()));
        }
        if let Some(provider) = self.meter_provider.clone() {
            jobs.push(Box::new(move || provider.force_flush()));
        }
        run_bounded("flush", timeout, jobs).await
    }

    /// Flushes and stops the exporters, waiting at most `timeout` in total
    /// (spans and metrics are shut down in parallel, each within the same
    /// budget). A slow or unreachable backend costs at most `timeout`.
    ///
    /// Meant for the drain path: pass what is left of the eviction notice.
    pub async fn shutdown(self, timeout: Duration) -> Result<(), TelemetryError> {
        let mut jobs: Vec<Job> = Vec::new();
        if let Some(provider) = self.tracer_provider {
            jobs.push(Box::new(move || provider.shutdown_with_timeout(timeout)));
        }
        if let Some(provider) = self.meter_provider {
            jobs.push(Box::new(move || provider.shutdown_with_timeout(timeout)));
        }
        run_bounded("shutdown", timeout, jobs).await
    }

    /// [`shutdown`](Self::shutdown) for code that cannot await (a `Drop`, a
    /// synchronous `main`): it blocks the calling thread, inside an async
    /// runtime or not, for at most about `timeout`.
    pub fn shutdown_blocking(self, timeout: Duration) -> Result<(), TelemetryError> {
        let failed = |reason: String| TelemetryError::Export {
            operation: "shutdown",
            reason,
        };
        // A thread of its own: a runtime cannot be entered from inside
        // another, and the caller's may be one. The wait needs no timer or
        // I/O driver, only an executor.
        let waiting = std::thread::Builder::new()
            .name("spot-worker-telemetry-shutdown-blocking".to_owned())
            .spawn(move || {
                let executor = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .map_err(|error| failed(format!("could not start an executor: {error}")))?;
                executor.block_on(self.shutdown(timeout))
            })
            .map_err(|error| failed(format!("could not start a thread: {error}")))?;
        waiting
            .join()
            .unwrap_or_else(|_| Err(failed("the exporter panicked".to_owned())))
    }
}

fn not_exporter_internal(metadata: &tracing::Metadata<'_>) -> bool {
    let target = metadata.target();
    !EXPORTER_TARGETS.iter().any(|prefix| {
        target
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::") || rest.starts_with('_'))
    })
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE_NAME)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

type Job = Box<dyn FnOnce() -> OTelSdkResult + Send>;

enum Done {
    Job(Option<OTelSdkResult>),
    Deadline,
}

/// Runs each blocking SDK call on its own thread and waits for all of
/// them, but never past `timeout`.
///
/// The SDK's flush and shutdown block the calling thread and do not all
/// honour their timeout argument (the periodic metric reader waits a fixed
/// 5 s), so they run on plain threads and a watchdog thread ends the wait.
/// Plain threads and a Tokio channel keep this usable from any async
/// runtime (or one without a timer) and from a current-thread runtime,
/// where blocking the caller would also stall the exporter's I/O.
async fn run_bounded(
    operation: &'static str,
    timeout: Duration,
    jobs: Vec<Job>,
) -> Result<(), TelemetryError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let spawn_error = |error: std::io::Error| TelemetryError::Export {
        operation,
        reason: format!("could not start a thread: {error}"),
    };
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let pending = jobs.len();
    for job in jobs {
        let sender = sender.clone();
        std::thread::Builder::new()
            .name(format!("spot-worker-telemetry-{operation}"))
            .spawn(move || {
                // A panic inside the SDK reaches us as `None`, not as a hang.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).ok();
                let _ = sender.send(Done::Job(result));
            })
            .map_err(spawn_error)?;
    }
    std::thread::Builder::new()
        .name(format!("spot-worker-telemetry-{operation}-deadline"))
        .spawn(move || {
            std::thread::sleep(timeout);
            let _ = sender.send(Done::Deadline);
        })
        .map_err(spawn_error)?;

    let mut failure = None;
    for _ in 0..pending {
        match receiver.recv().await {
            Some(Done::Job(Some(Ok(())))) => {}
            Some(Done::Job(Some(Err(error)))) => {
                failure.get_or_insert_with(|| error.to_string());
            }
            Some(Done::Job(None)) => {
                failure.get_or_insert_with(|| "the exporter panicked".to_owned());
            }
            Some(Done::Deadline) | None => {
                return Err(TelemetryError::Timeout { operation, timeout });
            }
        }
    }
    match failure {
        None => Ok(()),
        Some(reason) => Err(TelemetryError::Export { operation, reason }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn bounded_run_reports_results_and_gives_up_at_the_deadline() {
        assert!(
            run_bounded("flush", Duration::from_secs(5), vec![])
                .await
                .is_ok()
        );

        let ok: Job = Box::new(|| Ok(()));
        assert!(
            run_bounded("flush", Duration::from_secs(5), vec![ok])
                .await
                .is_ok()
        );

        let failing: Job = Box::new(|| {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "collector said no".into(),
            ))
        });
        let error = run_bounded("flush", Duration::from_secs(5), vec![failing])
            .await
            .unwrap_err();
        assert!(
            matches!(&error, TelemetryError::Export { operation: "flush", reason } if reason.contains("collector said no")),
            "{error:?}"
        );

        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let hanging: Job = Box::new(move || {
            // Blocks until the test ends and drops `release`.
            let _ = stuck.recv();
            Ok(())
        });
        let started = Instant::now();
        let error = run_bounded("shutdown", Duration::from_millis(200), vec![hanging])
            .await
            .unwrap_err();
        assert!(matches!(
            error,
            TelemetryError::Timeout {
                operation: "shutdown",
                ..
            }
        ));
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(release);
    }

    #[tokio::test]
    async fn without_backends_everything_is_a_cheap_no_op() {
        let telemetry = Telemetry::build(&TelemetryConfig::default()).unwrap();
        assert!(!telemetry.exports_otlp() && !telemetry.exports_app_insights());
        assert!(telemetry.layer::<tracing_subscriber::Registry>().is_none());
        telemetry.metrics().message_failed("q");
        telemetry.flush(Duration::from_secs(1)).await.unwrap();
        telemetry.shutdown(Duration::from_secs(1)).await.unwrap();
        // Blocking, from inside a runtime (as a `Drop` would), is allowed.
        let telemetry = Telemetry::build(&TelemetryConfig::default()).unwrap();
        telemetry.shutdown_blocking(Duration::from_secs(1)).unwrap();
    }
}
