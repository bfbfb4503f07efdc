//! The reads before a handler runs, carried out: the job's checkpoint (is
//! it completed? what does the handler resume from?), retried while the
//! store cannot be reached. [`pre_read`](super::pre_read) decides which
//! reads a delivery needs; the result marker's read is in
//! [`marker`](super::marker).

use spot_worker_storage::StorageError;
use spot_worker_storage::{Checkpoint, StoredCheckpoint, store_unreachable};

use super::Consumer;
use super::in_flight::Delivery;
use super::job::CheckpointRead;

/// What the completed-checkpoint check found.
pub(super) enum PreCheck {
    /// No completed checkpoint (or no store): what the store returned (an
    /// in-progress checkpoint and its ETag, or none), for the handler.
    NotCompleted(CheckpointRead),
    /// Completed, with the result the checkpoint holds.
    Completed(serde_json::Value),
    /// The lease was lost or the worker is shutting down.
    Interrupted,
    /// The store failed in a way that waiting will not fix.
    Failed(StorageError),
    /// The store could not be read, and the consumer paused its intake for
    /// it (a refusal or a missing container that persists): hand the
    /// message back uncounted rather than hold its slot.
    StoreDown(StorageError),
    /// The result store could not be reached: waited out, uncounted.
    Unreachable(String),
}

impl Consumer {
    /// Whether the job's checkpoint is completed.
    ///
    /// A checkpoint store that is unavailable (a transient error, a
    /// refusal, its container missing) never pushes a message towards the
    /// poison queue: the read is retried with the retry backoff while the
    /// message stays leased, and the slot stays taken, so the consumer
    /// stops receiving work it could not start. Once the consumer pauses
    /// for a refusal or a missing container that persists, the message is
    /// handed back uncounted instead. Other errors (the checkpoint does
    /// not parse) will not go away by waiting and count as a failure.
    pub(super) async fn check_completed(&self, key: &str, delivery: &Delivery) -> PreCheck {
        let Some(store) = &self.checkpoints else {
            return PreCheck::NotCompleted(None);
        };
        let mut attempt = 0u32;
        loop {
            let read = tokio::select! {
                biased;
                () = delivery.lease.lost() => return PreCheck::Interrupted,
                () = delivery.job_token.cancelled() => return PreCheck::Interrupted,
                read = store.read(key) => read,
            };
            let error = match read {
                Ok(Some(StoredCheckpoint {
                    checkpoint: Checkpoint::Completed { result },
                    ..
                })) => {
                    return PreCheck::Completed(result);
                }
                Ok(latest) => return PreCheck::NotCompleted(latest),
                Err(error) if store_unreachable(&error) => error,
                Err(error) => return PreCheck::Failed(error),
            };
            attempt = attempt.saturating_add(1);
            let delay = self.backoff(attempt);
            tracing::warn!(%error, retry_in = ?delay, "reading the checkpoint failed; keeping the message leased and retrying (this does not count as a failure)");
            tokio::select! {
                biased;
                () = delivery.lease.lost() => return PreCheck::Interrupted,
                () = delivery.job_token.cancelled() => return PreCheck::Interrupted,
                () = self.monitor.paused() => return PreCheck::StoreDown(error),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}
