//! A worker whose handler will not stop when told to, and the proof that
//! its process exits anyway (`tests/it/worker_exit.rs` runs it): within the
//! drain budget plus a second of a notice, its message released, and
//! nothing written by the abandoned handler after the release.
//!
//! ```sh
//! STUBBORN_HANDLER=blocking cargo run --example stubborn
//! ```
//!
//! `STUBBORN_HANDLER` chooses how the handler ignores its cancellation:
//!
//! - `blocking` (default): blocking code on the blocking pool, sleeping in
//!   a loop for `STUBBORN_WRITE_AFTER_MS` (default 6000), then writing the
//!   result `<message id>.json` through the job's fenced store
//!   ([`Job::results`]); the handler awaits it;
//! - `never_yields`: an async handler that blocks its worker thread in a
//!   loop for 60 s and never awaits.
//!
//! Everything else is the settings every spot-worker shares (as for
//! `examples/primes.rs`). Unlike that example, `main` is the plain
//! `#[tokio::main]` a user would write: dropping its runtime waits for the
//! blocking pool, and the worker (made by `Setup`, so owning the process)
//! ends the process regardless.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use spot_worker::settings::{Source, table};
use spot_worker::storage::ResultStore;
use spot_worker::{HandlerError, Job, Setup, handler_fn};

/// Logged when a handler starts (the test waits for it).
const STARTED: &str = "stubborn handler started";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let settings = Source::from_env()?;
    let setup = Setup::from_source(&settings).context("setting up")?;
    let container = settings.get(&table::RESULTS_CONTAINER)?;
    let results: Arc<dyn ResultStore> = Arc::new(setup.storage.result_store(&container)?);
    let mode = std::env::var("STUBBORN_HANDLER").unwrap_or_else(|_| "blocking".to_owned());
    let write_after = Duration::from_millis(
        std::env::var("STUBBORN_WRITE_AFTER_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(6000),
    );
    let worker = setup.worker()?;
    let report = match mode.as_str() {
        "blocking" => {
            worker
                .run(handler_fn(move |job: Job| {
                    let results = job.results(Arc::clone(&results));
                    async move {
                        tracing::info!(message_id = %job.id(), "{STARTED}");
                        let name = format!("{}.json", job.id());
                        let runtime = tokio::runtime::Handle::current();
                        tokio::task::spawn_blocking(move || {
                            // Never looks at the job's cancellation.
                            let until = std::time::Instant::now() + write_after;
                            while std::time::Instant::now() < until {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            let written = runtime.block_on(results.put_new(&name, b"{}"));
                            tracing::warn!(?written, "the stubborn handler wrote its result");
                        })
                        .await?;
                        Ok::<(), HandlerError>(())
                    }
                }))
                .await?
        }
        "never_yields" => {
            worker
                .run(handler_fn(|job: Job| async move {
                    tracing::info!(message_id = %job.id(), "{STARTED}");
                    // Blocks this worker thread; never awaits.
                    std::thread::sleep(Duration::from_secs(60));
                    Ok::<(), HandlerError>(())
                }))
                .await?
        }
        other => anyhow::bail!("STUBBORN_HANDLER={other:?}: expected blocking or never_yields"),
    };
    tracing::info!(trigger = %report.drain.trigger, released = report.stats.released, "stopped");
    Ok(())
}
