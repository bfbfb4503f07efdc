//! Telemetry for spot-worker queue workers: `tracing` spans and
//! OpenTelemetry metrics, exported over OTLP/HTTP and/or to Azure
//! Application Insights, with logs on stderr.
//!
//! - [`TelemetryConfig::from_env`] reads the standard OpenTelemetry
//!   variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, ...) and
//!   `APPLICATIONINSIGHTS_CONNECTION_STRING`.
//! - [`init`] installs the global subscriber (stderr logs + OpenTelemetry
//!   layer) and meter provider and returns a [`Telemetry`];
//!   [`Telemetry::build`] does the same without globals. A worker built on
//!   the `spot-worker` facade gets this from its one set-up call
//!   (`spot_worker::Setup`), with its storage.
//! - [`message_span`] opens the per-message span following the messaging
//!   semantic conventions; [`Metrics`] records the worker's metrics.
//! - [`Telemetry::shutdown`] flushes within a hard time bound, so a dead
//!   collector cannot eat the 30 s eviction notice;
//!   [`Telemetry::shutdown_blocking`] is the same where nothing can await.
//!
//! ```
//! use std::time::Duration;
//! use spot_worker_telemetry::{TelemetryConfig, init, message_span};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), spot_worker_telemetry::TelemetryError> {
//! // In a worker: `TelemetryConfig::from_env()?`. No backend here, so only
//! // logs are written and metrics are no-ops.
//! let telemetry = init(TelemetryConfig::default().with_service_name("orders-worker"))?;
//! let metrics = telemetry.metrics();
//!
//! let span = message_span("orders", "7d0c1f2e", 1);
//! {
//!     let _entered = span.enter();
//!     tracing::info!("handling message");
//! }
//! metrics.handler_succeeded("orders", Duration::from_millis(42));
//! metrics.set_ready(true);
//!
//! telemetry.shutdown(Duration::from_secs(5)).await?;
//! # Ok(())
//! # }
//! ```

mod appinsights;
pub mod attributes;
mod checkpoint_gauges;
mod config;
mod error;
mod export;
mod keeper_gauges;
mod lane_metrics;
mod logging;
mod metrics;
pub mod names;
mod outcomes;
mod source_slot;
mod span;
mod telemetry;
mod worker_time;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

pub use appinsights::{
    AppInsightsConnectionString, AppInsightsConnectionStringError, DEFAULT_INGESTION_ENDPOINT,
};
pub use checkpoint_gauges::{CheckpointEstimates, INTERRUPTION_KINDS};
pub use config::{DEFAULT_EXPORT_TIMEOUT, DEFAULT_METRIC_EXPORT_INTERVAL, TelemetryConfig};
pub use error::TelemetryError;
pub use keeper_gauges::ProtectionState;
pub use lane_metrics::{DEADLINE_OUTCOMES, LANES};
pub use metrics::Metrics;
pub use outcomes::{
    CheckpointOutcome, EVENT_TYPES, JobTimeKind, LeaseOutcome, MessageOutcome, StorageRefusal,
    values,
};
pub use span::{
    ERROR_TYPE, MESSAGING_BATCH_MESSAGE_COUNT, MESSAGING_DEQUEUE_COUNT, MESSAGING_DESTINATION_NAME,
    MESSAGING_MESSAGE_ID, MESSAGING_OPERATION_NAME, MESSAGING_OPERATION_TYPE, MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_VALUE, OperationType, message_span, receive_span, record_error, settle_span,
};
pub use telemetry::Telemetry;
pub use worker_time::WORKER_PHASES;

/// Re-exported so callers can name `Meter` (for [`Metrics::new`]) without
/// depending on a matching `opentelemetry` version themselves.
pub use opentelemetry;

/// Installs the stderr logs alone, exactly as [`init`] writes them (the
/// filter, text or JSON, colours only when stderr is a terminal and
/// `NO_COLOR` is unset or empty), for a program that exports nothing: the
/// `spot-worker` command's other subcommands log as its `run` does.
///
/// Fails like [`init`] for a bad filter or a global subscriber already set.
///
/// ```
/// use spot_worker_telemetry::{TelemetryConfig, init_logs};
///
/// init_logs(&TelemetryConfig::default().with_log_filter("warn"))?;
/// tracing::warn!("on stderr, without colours unless it is a terminal");
/// assert!(init_logs(&TelemetryConfig::default()).is_err(), "installed once");
/// # Ok::<(), spot_worker_telemetry::TelemetryError>(())
/// ```
pub fn init_logs(config: &TelemetryConfig) -> Result<(), TelemetryError> {
    let filter = logging::env_filter(config)?;
    tracing_subscriber::registry()
        .with(filter)
        .with(logging::fmt_layer(config))
        .try_init()
        .map_err(|error| TelemetryError::AlreadyInitialized(error.to_string()))
}

/// Installs telemetry for the whole process: a global `tracing` subscriber
/// (stderr logs filtered by [`TelemetryConfig::log_filter`], plus the
/// OpenTelemetry layer when a backend is configured) and the global tracer
/// and meter providers.
///
/// Fails with [`TelemetryError::AlreadyInitialized`] if a global subscriber
/// is already set, and with a typed error for a bad filter or connection
/// string; nothing global is changed on failure.
pub fn init(config: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let filter = logging::env_filter(&config)?;
    let telemetry = Telemetry::build(&config)?;
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(logging::fmt_layer(&config))
        .with(telemetry.layer())
        .try_init();
    if let Err(error) = installed {
        // Dropping the providers runs a blocking final export; keep that
        // off the caller's (possibly async) thread.
        let _ = std::thread::Builder::new()
            .name("spot-worker-telemetry-drop".to_owned())
            .spawn(move || drop(telemetry));
        return Err(TelemetryError::AlreadyInitialized(error.to_string()));
    }
    if let Some(provider) = telemetry.tracer_provider() {
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    if let Some(provider) = telemetry.meter_provider() {
        opentelemetry::global::set_meter_provider(provider.clone());
    }
    // Flags only: endpoints may carry credentials, connection strings do.
    tracing::info!(
        service.name = %config.service_name,
        otlp = telemetry.exports_otlp(),
        app_insights = telemetry.exports_app_insights(),
        "telemetry initialised"
    );
    Ok(telemetry)
}
