//! The read of a redelivered message's attempt record before its handler
//! runs, retried while the store cannot be reached: the record may say an
//! earlier delivery gave the message up and was moving it to the poison
//! queue ([`Poisoning`](spot_worker_storage::attempts::Poisoning)), and a job given up on
//! must not run again because one read failed.

use spot_worker_storage::store_unreachable;

use super::Consumer;
use super::in_flight::Delivery;
use spot_worker_storage::attempts::ReadAttempts;

/// Reads of the record a delivery tries before it hands the message back.
const READ_TRIES: u32 = 4;

/// What the read found.
pub(super) enum RecordRead {
    /// The record (empty if there is none).
    Read(ReadAttempts),
    /// It does not read, and waiting will not change that (it does not
    /// parse): the delivery goes on without it, as if it were the first.
    Unread,
    /// The store could not be reached in [`READ_TRIES`] tries: the message
    /// is handed back uncounted, like a wait for the checkpoint store.
    Unreachable(String),
    /// The lease was lost or the worker is shutting down.
    Interrupted,
}

impl Consumer {
    /// Reads `delivery`'s attempt record (see the module documentation).
    pub(super) async fn read_record_before_run(&self, delivery: &Delivery) -> RecordRead {
        let id = &delivery.message.id;
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            let read = tokio::select! {
                biased;
                () = delivery.lease.lost() => return RecordRead::Interrupted,
                () = delivery.job_token.cancelled() => return RecordRead::Interrupted,
                read = tokio::time::timeout(self.config.settle_timeout, self.attempts.read(id)) => read,
            };
            let error = match read {
                Ok(Ok(read)) => return RecordRead::Read(read),
                Ok(Err(error)) if store_unreachable(&error) => error.to_string(),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "the attempt record does not read; going on without it");
                    return RecordRead::Unread;
                }
                Err(_) => format!(
                    "reading the attempt record timed out after {:?}",
                    self.config.settle_timeout
                ),
            };
            if attempt >= READ_TRIES {
                return RecordRead::Unreachable(format!(
                    "reading the attempt record failed: {error}"
                ));
            }
            let delay = self.backoff(attempt);
            tracing::warn!(%error, retry_in = ?delay, "reading the attempt record failed; retrying (this does not count as a failure)");
            tokio::select! {
                biased;
                () = delivery.lease.lost() => return RecordRead::Interrupted,
                () = delivery.job_token.cancelled() => return RecordRead::Interrupted,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}
