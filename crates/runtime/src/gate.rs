//! The warmup gate: nothing is taken from the queue until the eviction
//! watcher, storage and the application's own warmup say they are ready.
//!
//! Each check is retried with jittered backoff while it fails, and its last
//! error is shown in `/readyz`, so a worker whose storage or IMDS is down
//! sits idle, explains why, and starts by itself when they recover.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use spot_worker_consumer::HandlerError;
use spot_worker_imds::WatcherHealth;
use spot_worker_storage::{CheckpointStore, MessageQueue, ResultStore};
use tokio::sync::watch;

use crate::health::{Gate, Readiness};

/// The application's warmup: loads models, fills caches, checks its own
/// dependencies. Retried while it fails; its error is the same type as a
/// handler's (any error of the application's code).
pub type WarmupFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>> + Send + Sync>;

/// What the gate checks.
pub(crate) struct Checks {
    pub(crate) imds: Option<watch::Receiver<WatcherHealth>>,
    pub(crate) queue: Arc<dyn MessageQueue>,
    pub(crate) poison: Arc<dyn MessageQueue>,
    pub(crate) checkpoints: Option<Arc<dyn CheckpointStore>>,
    pub(crate) poison_bodies: Option<Arc<dyn ResultStore>>,
    /// The other lane's queue, for a worker with lanes: it sends jobs there.
    pub(crate) other_lane: Option<Arc<dyn MessageQueue>>,
    pub(crate) warmup: Option<WarmupFn>,
}

/// Opens the gates in order: IMDS, storage, warmup.
pub(crate) async fn open(checks: Checks, readiness: &watch::Sender<Readiness>) {
    match checks.imds {
        Some(health) => wait_for_imds(health, readiness).await,
        None => readiness.send_modify(|r| r.imds = Gate::Skipped),
    }
    retry_until_ok(
        readiness,
        |r| &mut r.storage,
        || async {
            checks.queue.prepare().await?;
            checks.poison.prepare().await?;
            if let Some(store) = &checks.checkpoints {
                store.prepare().await?;
            }
            if let Some(store) = &checks.poison_bodies {
                store.prepare().await?;
            }
            if let Some(queue) = &checks.other_lane {
                queue.prepare().await?;
            }
            Ok::<(), spot_worker_storage::StorageError>(())
        },
    )
    .await;
    match &checks.warmup {
        Some(warmup) => retry_until_ok(readiness, |r| &mut r.warmup, || warmup()).await,
        None => readiness.send_modify(|r| r.warmup = Gate::Skipped),
    }
}

/// Waits until the watcher knows this VM's name and has polled
/// successfully: the first Scheduled Events call can take two minutes, and
/// until it answers an eviction notice could go unseen. A configured name
/// (`SPOT_WORKER_VM_NAME`) is known from the start, so the gate never waits
/// for instance metadata then; the watcher still checks it when instance
/// metadata answers, and the worker stops on a mismatch.
async fn wait_for_imds(
    mut health: watch::Receiver<WatcherHealth>,
    readiness: &watch::Sender<Readiness>,
) {
    loop {
        let current = health.borrow_and_update().clone();
        if current.vm_name.is_some() && current.polls > 0 {
            readiness.send_modify(|r| r.imds = Gate::Passed);
            tracing::info!(
                vm_name = current.vm_name.as_deref(),
                "warmup gate: Scheduled Events watcher ready"
            );
            return;
        }
        let detail = current
            .last_error
            .unwrap_or_else(|| "waiting for the first Scheduled Events answer".to_owned());
        readiness.send_modify(|r| r.imds = Gate::Waiting(detail));
        if health.changed().await.is_err() {
            // The watcher is gone; nothing will change. Stay closed.
            return std::future::pending().await;
        }
    }
}

/// Runs `check` until it succeeds, showing its last error in the gate.
async fn retry_until_ok<F, Fut, E>(
    readiness: &watch::Sender<Readiness>,
    gate: impl Fn(&mut Readiness) -> &mut Gate,
    check: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    const FLOOR: Duration = Duration::from_millis(250);
    const CEILING: Duration = Duration::from_secs(10);
    let mut delay = FLOOR;
    readiness.send_modify(|r| *gate(r) = Gate::Waiting("checking".to_owned()));
    loop {
        match check().await {
            Ok(()) => {
                readiness.send_modify(|r| *gate(r) = Gate::Passed);
                return;
            }
            Err(error) => {
                let detail = error.to_string();
                tracing::warn!(error = %detail, retry_in_ms = delay.as_millis() as u64, "warmup gate: check failed; retrying");
                readiness.send_modify(|r| *gate(r) = Gate::Waiting(detail));
                let jittered = rand::rng().random_range(delay / 2..=delay);
                tokio::time::sleep(jittered).await;
                delay = (delay * 2).min(CEILING);
            }
        }
    }
}
