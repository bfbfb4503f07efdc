//! The example worker: counts the primes in ranges taken from a queue,
//! checkpointing as it goes, and survives Spot evictions.
//!
//! ```sh
//! cargo run --release --example primes
//! ```
//!
//! A message `{"job_id":"j1","start":0,"end":50000000}` counts the primes in
//! `[start, end)` in chunks, checkpointing the cursor and the partial count
//! after each, then writes the blob `j1.json` = `{"job_id":"j1","primes":N}`
//! (create-only) to the container `results`.
//!
//! Configuration is the environment contract every spot-worker shares (see
//! `spot_worker::setup`): `AZURE_STORAGE_CONNECTION_STRING` (or
//! `SPOT_WORKER_STORAGE_ACCOUNT_URL` with a managed identity and
//! `AZURE_CLIENT_ID`), `SPOT_WORKER_QUEUE` (default `jobs`),
//! `SPOT_WORKER_MESSAGE_ENCODING`, `SPOT_WORKER_IMDS_ENDPOINT`,
//! `SPOT_WORKER_HEALTH_ADDR`, `SPOT_WORKER_CONCURRENCY`; telemetry from the
//! standard `OTEL_*` variables and `APPLICATIONINSIGHTS_CONNECTION_STRING`.
//! `SPOT_WORKER_RESULTS_CONTAINER` renames the results container.
//!
//! This file only wires: the job lives in `spot-worker-primes`, the worker
//! in `spot-worker-runtime`.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use spot_worker::setup::AzureSetup;
use spot_worker::storage::ResultStore;
use spot_worker::telemetry::{self, TelemetryConfig};
use spot_worker_primes::PrimesConfig;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let telemetry = telemetry::init(TelemetryConfig::from_env()?).context("starting telemetry")?;
    let setup = AzureSetup::from_env().context("reading the configuration")?;
    let container = std::env::var("SPOT_WORKER_RESULTS_CONTAINER")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "results".to_owned());
    let results: Arc<dyn ResultStore> = Arc::new(setup.storage.result_store(&container)?);
    let warmup_results = Arc::clone(&results);
    let worker = setup
        .worker()?
        .with_telemetry(telemetry)
        // The results container must exist and be writable before any job
        // runs, or a finished job could not record its result.
        .with_warmup(move || {
            let results = Arc::clone(&warmup_results);
            async move { Ok(results.prepare().await?) }
        });
    let report = worker
        .run(spot_worker_primes::handler(
            results,
            PrimesConfig::default(),
        ))
        .await
        .context("running the worker")?;
    tracing::info!(
        trigger = %report.shutdown.trigger,
        notice_to_drained_ms = report.shutdown.notice_to_drained.as_millis() as u64,
        processed = report.stats.succeeded,
        released = report.stats.released,
        "stopped"
    );
    Ok(())
}
