//! The storage calls that carry out a settlement: delete, make visible
//! again, and keep the attempt record (moving to the poison queue is in
//! [`poisoning`](super::poisoning)). Each call has its own deadline, separate
//! from shutdown: settling must still happen while the worker drains.

use std::future::Future;
use std::time::Duration;

use spot_worker_storage::StorageError;
use spot_worker_storage::{MessageId, QueueMessage};

use super::Consumer;
use super::in_flight::Delivery;
use super::lease::Lease;
use super::outcome::DeliveryOutcome;
use super::release_note::{NOTE_DEADLINE, release_after_note, write_note};
use super::signals::DrainSignals;
use super::stats::bump;
use spot_worker_storage::attempts::{Attempts, ReadAttempts};

impl Consumer {
    /// Runs one settle call under its own deadline; `None` if it failed.
    pub(super) async fn settle_call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Option<T> {
        match tokio::time::timeout(self.config.settle_timeout, call).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(StorageError::LeaseLost { .. })) => {
                self.settled(DeliveryOutcome::LeaseLost);
                tracing::warn!(
                    what,
                    "lease lost before settling; another consumer has the message"
                );
                None
            }
            Ok(Err(error)) => {
                bump(&self.counters.settle_failures);
                tracing::warn!(what, %error, "settling failed; the message reappears after its visibility timeout");
                None
            }
            Err(_) => {
                bump(&self.counters.settle_failures);
                tracing::warn!(
                    what,
                    "settling timed out; the message reappears after its visibility timeout"
                );
                None
            }
        }
    }

    pub(super) async fn delete(&self, lease: &Lease) -> bool {
        let receipt = lease.receipt().await;
        self.settle_call("delete", self.queue.delete(&lease.id, &receipt))
            .await
            .is_some()
    }

    pub(super) async fn make_visible_after(&self, lease: &Lease, delay: Duration) -> bool {
        let receipt = lease.receipt().await;
        self.settle_call(
            "update visibility",
            self.queue.update_visibility(&lease.id, &receipt, delay),
        )
        .await
        .is_some()
    }

    /// The message's attempt record; empty (with a warning) if it cannot be
    /// read: then this delivery's outcome is decided as if it were the
    /// first, and the crash-loop guard stays the backstop.
    pub(super) async fn read_attempts(&self, delivery: &Delivery) -> ReadAttempts {
        self.try_read_attempts(delivery).await.unwrap_or_default()
    }

    /// The message's attempt record; `None` (with a warning) if it cannot
    /// be read.
    pub(super) async fn try_read_attempts(&self, delivery: &Delivery) -> Option<ReadAttempts> {
        let id = &delivery.message.id;
        self.settle_call("read the attempt record", self.attempts.read(id))
            .await
    }

    /// Writes the attempt record before the message becomes visible again,
    /// so the next delivery, on any VM, counts on from it.
    pub(super) async fn record_attempts(
        &self,
        delivery: &Delivery,
        read: &ReadAttempts,
        attempts: &Attempts,
    ) {
        let id = &delivery.message.id;
        self.settle_call(
            "write the attempt record",
            self.attempts.write(id, read, attempts),
        )
        .await;
    }

    /// Deletes the attempt record of a message that is gone. Only a
    /// redelivered message (or one whose dequeue count is unknown), or one
    /// whose release note was written, can have one; a note being written
    /// is waited for first, so it cannot bring the record back. A leftover
    /// record is harmless (message ids are never reused), so a failure is
    /// only logged.
    pub(super) async fn forget_attempts(&self, delivery: &mut Delivery) {
        let noted = delivery.note.written().await;
        if delivery.message.dequeue_count != 1 || noted {
            let id = &delivery.message.id;
            self.settle_call("delete the attempt record", self.attempts.forget(id))
                .await;
        }
    }

    /// The deadline of a release note: short, and never longer than any
    /// other settle call.
    pub(super) fn note_deadline(&self) -> Duration {
        NOTE_DEADLINE.min(self.config.settle_timeout)
    }

    /// Records a release of `id` in its attempt record (see
    /// [`release_note`](super::release_note)); whether it was recorded.
    pub(super) async fn note_release(&self, id: &MessageId) -> bool {
        write_note(&self.attempts, id, self.note_deadline()).await
    }

    /// Releases a delivery on shutdown: visible again at once, not
    /// counted, its release recorded in the attempt record. The note
    /// started at the wind-down (`noting`), or, if it did not (released
    /// with no wind-down before), is written now; the release waits for it
    /// only until the release stage (see
    /// [`release_note`](super::release_note)).
    pub(super) async fn release_noted(
        &self,
        delivery: &mut Delivery,
        noting: bool,
        signals: &DrainSignals,
    ) {
        let (note, id) = (&mut delivery.note, &delivery.message.id);
        let note = async {
            if noting {
                note.written().await
            } else {
                self.note_release(id).await
            }
        };
        // Not while this consumer's own receive is still out: it could take
        // the message straight back.
        let release = async {
            signals.intake_closed(self.config.settle_timeout).await;
            self.make_visible_after(&delivery.lease, Duration::ZERO)
                .await
        };
        let (noted, released) = release_after_note(note, &signals.release, release).await;
        if released {
            self.settled(DeliveryOutcome::Released);
            tracing::info!(
                recorded = noted,
                "released on shutdown (not counted as a failure)"
            );
        }
    }

    /// Makes messages visible again that were received but never started,
    /// one request each, all at once: during a drain every one counts. Each
    /// release is recorded in the message's attempt record beside it (never
    /// in front of it), so the crash-loop guard does not count it.
    pub(super) async fn release_unstarted(&self, messages: Vec<QueueMessage>) {
        let releases = messages.into_iter().map(|message| async move {
            let lease = Lease::new(message.id, message.pop_receipt);
            let (_, released) = tokio::join!(
                self.note_release(&lease.id),
                self.make_visible_after(&lease, Duration::ZERO)
            );
            if released {
                self.settled(DeliveryOutcome::Released);
            }
        });
        futures_util::future::join_all(releases).await;
    }
}
