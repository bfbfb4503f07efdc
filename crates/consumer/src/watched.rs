//! The consumer's view of its checkpoint store's health: every request the
//! consumer and its handlers make goes through [`WatchedStore`], which
//! tells the [`StoreMonitor`] what it showed; the monitor publishes a
//! [`StoreHealth`] (`Consumer::store_health`) that the runtime turns into
//! readiness. While it is not healthy the consumer receives nothing and
//! probes the store with backoff ([`Consumer::wait_while_paused`]) until it
//! answers again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use spot_worker_storage::StorageError;
use spot_worker_storage::{Checkpoint, CheckpointStore, ETag, StoredCheckpoint, WritePrecondition};

use super::Consumer;
use super::signals::DrainSignals;
use super::store_health::{HealthState, Op, Seen, StoreHealth, assess, log_due};
use spot_worker_storage::backoff::retry_delay;

/// First delay between probes of a paused consumer.
const PROBE_FLOOR: Duration = Duration::from_secs(1);
/// Longest delay between probes: how long a store that answers again may
/// wait before the consumer notices.
const PROBE_CEILING: Duration = Duration::from_secs(30);

/// Decides and publishes the store's health from what requests showed.
#[derive(Debug)]
pub(crate) struct StoreMonitor {
    state: Mutex<HealthState>,
    health: watch::Sender<StoreHealth>,
    grace: Duration,
}

impl StoreMonitor {
    pub(crate) fn new(grace: Duration) -> Self {
        StoreMonitor {
            state: Mutex::default(),
            health: watch::channel(StoreHealth::Healthy).0,
            grace,
        }
    }

    /// Notes what one `op` request showed.
    fn observe<T>(&self, op: Op, result: &Result<T, StorageError>) {
        let seen = Seen::of(op, result);
        if seen == Seen::Nothing {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        *state = assess(&state, op, seen, Instant::now(), self.grace);
        let health = state.health.clone();
        drop(state);
        self.health.send_if_modified(|current| {
            let changed = *current != health;
            *current = health;
            changed
        });
    }

    /// The health now.
    pub(crate) fn current(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// A receiver of every change of health.
    pub(crate) fn subscribe(&self) -> watch::Receiver<StoreHealth> {
        self.health.subscribe()
    }

    /// Resolves once the store is not healthy (at once if it is not now).
    pub(crate) async fn paused(&self) {
        let mut health = self.subscribe();
        // The sender lives as long as `self`: an error cannot happen while
        // this future is borrowed from it.
        let _ = health.wait_for(|health| !health.is_healthy()).await;
    }
}

/// A checkpoint store whose every request is shown to a [`StoreMonitor`].
#[derive(Debug)]
pub(crate) struct WatchedStore {
    pub(crate) inner: Arc<dyn CheckpointStore>,
    pub(crate) monitor: Arc<StoreMonitor>,
}

#[async_trait]
impl CheckpointStore for WatchedStore {
    async fn prepare(&self) -> Result<(), StorageError> {
        let result = self.inner.prepare().await;
        self.monitor.observe(Op::Probe, &result);
        result
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        let result = self.inner.read(key).await;
        self.monitor.observe(Op::Read, &result);
        result
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        let result = self.inner.write(key, checkpoint, precondition, stamp).await;
        self.monitor.observe(Op::Write, &result);
        result
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let result = self.inner.delete(key).await;
        self.monitor.observe(Op::Delete, &result);
        result
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn spot_worker_storage::files::ChunkStore>> {
        self.inner.chunks()
    }
}

impl Consumer {
    /// While the checkpoint store refuses this worker or misses its
    /// container: receives nothing, logs why at error level once a minute,
    /// and probes the store ([`CheckpointStore::prepare`], which also
    /// re-creates a missing container where the role allows) with backoff
    /// until it answers. Returns `false` if told to stop first.
    pub(super) async fn wait_while_paused(&self, signals: &DrainSignals) -> bool {
        let Some(store) = &self.checkpoints else {
            return true;
        };
        let mut logged_at: Option<Instant> = None;
        let mut probes = 0u32;
        loop {
            let health = self.monitor.current();
            if health.is_healthy() {
                if logged_at.is_some() {
                    tracing::info!(
                        queue = self.queue.name(),
                        "the checkpoint store answers again; taking work"
                    );
                }
                return true;
            }
            if log_due(logged_at, Instant::now()) {
                tracing::error!(queue = self.queue.name(), reason = %health, "not taking work: {health}");
                logged_at = Some(Instant::now());
            }
            probes = probes.saturating_add(1);
            let delay = retry_delay(PROBE_FLOOR, PROBE_CEILING, probes, &*self.clock);
            tokio::select! {
                biased;
                _ = signals.stopping() => return false,
                () = tokio::time::sleep(delay) => {}
            }
            tokio::select! {
                biased;
                _ = signals.stopping() => return false,
                // Seen by the monitor: success makes the store healthy.
                _ = store.prepare() => {}
            }
        }
    }
}
