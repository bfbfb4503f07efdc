//! The example worker: counts the primes in ranges taken from a queue,
//! checkpointing as it goes, and survives Spot evictions.
//!
//! ```sh
//! cargo run --release --example primes
//! ```
//!
//! A message `{"job_id":"j1","start":0,"end":50000000}` counts the primes in
//! `[start, end)` in chunks, checkpointing the cursor and the partial count
//! when the worker's checkpoint interval says a save is due
//! (docs/checkpoint-interval.md) and when evicted, then writes the blob
//! `j1.json` = `{"job_id":"j1","start":0,"end":50000000,"primes":3001134}`
//! (create-only) to the container `results`. Locally, `spot-worker dev`
//! starts what it needs and prints its environment (docs/develop-locally.md).
//!
//! Configuration is the settings table every spot-worker shares (see
//! `spot_worker::settings` and `--help`): flags (`--queue orders`), the
//! environment (`SPOT_WORKER_QUEUE=orders`), the `SPOT_WORKER_CONFIG` file,
//! then the defaults. Storage by `AZURE_STORAGE_CONNECTION_STRING`, or
//! `SPOT_WORKER_STORAGE_ACCOUNT_URL` with the managed identity
//! `AZURE_CLIENT_ID`; telemetry from the standard `OTEL_*` variables and
//! `APPLICATIONINSIGHTS_CONNECTION_STRING`; `SPOT_WORKER_RESULTS_CONTAINER`
//! names the results container.
//!
//! It exits 0 after a drain that released everything (an eviction is not a
//! failure), 3 if the drain overran its deadline, 1 if it could not start;
//! and it cannot hang: within a second of the worker stopping it is gone,
//! whatever a handler still runs (see `Worker::owning_the_process`).
//!
//! This file only wires: the job lives in `spot-worker-primes`, the worker
//! in `spot-worker-runtime`.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use spot_worker::Setup;
use spot_worker::settings::{self, Source, table};
use spot_worker::storage::ResultStore;
use spot_worker_primes::PrimesConfig;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run());
    // Dropping the runtime would wait for the blocking pool: a chunk a
    // released job left running is not waited for (its writes are fenced).
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the worker; the exit status its report calls for.
async fn run() -> anyhow::Result<u8> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", settings::help(settings::SecretFlags::Accepted));
        return Ok(0);
    }
    let settings = Source::from_env()?.with_args(args)?;
    // Logs (always), telemetry (when configured) and storage.
    let setup = Setup::from_source(&settings).context("setting up")?;
    let container = settings.get(&table::RESULTS_CONTAINER)?;
    let results: Arc<dyn ResultStore> = Arc::new(setup.storage.result_store(&container)?);
    let warmup_results = Arc::clone(&results);
    let worker = setup
        .worker()?
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
        trigger = %report.drain.trigger,
        notice_to_drained_ms = report.drain.notice_to_drained.as_millis() as u64,
        processed = report.stats.succeeded,
        released = report.stats.released,
        "stopped"
    );
    Ok(u8::try_from(report.exit_code()).unwrap_or(1))
}
