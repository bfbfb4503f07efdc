//! One delivery, from receive to settle: decode the body, check the job's
//! checkpoint (the one read of it, handed on to the handler; none on a
//! first delivery keyed by the message id, where it cannot exist), admit or
//! refuse it, run the handler under a renewed lease,
//! and carry out what [`settlement`](super::settlement) decides.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{Checkpoint, CheckpointNotes, StoredCheckpoint, store_unreachable};
use crate::error::StorageError;
use crate::queue::QueueMessage;

use super::Consumer;
use super::attempts::ReadAttempts;
use super::backoff::retry_delay;
use super::handler::{CheckpointRead, EarlierRead, HandlerError, Job, MessageHandler, Permanent};
use super::lease::{Lease, Renewal};
use super::settlement::{
    Admission, Arrival, Completion, Departure, Ending, Limits, PoisonCause, Settlement, admit,
    checkpoint_may_exist, settle,
};
use super::signals::DrainSignals;
use super::stats::bump;

/// What the completed-checkpoint check found.
enum PreCheck {
    /// No completed checkpoint (or no store): what the store returned (an
    /// in-progress checkpoint and its ETag, or none), for the handler.
    NotCompleted(CheckpointRead),
    /// Completed, with the result the checkpoint holds.
    Completed(serde_json::Value),
    /// The lease was lost or the worker is shutting down.
    Interrupted,
    /// The store failed in a way that waiting will not fix.
    Failed(StorageError),
}

/// Everything one delivery holds while it is processed.
pub(super) struct Delivery {
    pub(super) message: QueueMessage,
    pub(super) lease: Arc<Lease>,
    /// The handler's token: cancelled by wind-down, release or a lost lease.
    pub(super) job_token: CancellationToken,
    renewal: Option<Renewal>,
}

impl Delivery {
    /// Stops renewing the lease (at once if `job_token` is cancelled).
    pub(super) async fn stop_renewing(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop(&self.job_token).await;
        }
    }
}

impl Consumer {
    pub(super) fn limits(&self) -> Limits {
        Limits {
            max_failures: self.config.max_failures,
            max_deliveries: self.config.max_deliveries,
        }
    }

    pub(super) async fn process<H: MessageHandler>(
        self,
        message: QueueMessage,
        received_at: Instant,
        handler: Arc<H>,
        job_token: CancellationToken,
        signals: DrainSignals,
        _slot: OwnedSemaphorePermit,
    ) {
        let lease = Lease::new(message.id.clone(), message.pop_receipt.clone());
        // Checkpoint writes stop when the delivery is no longer ours (the
        // renewal cancels this fence when it finds the lease lost) or handed
        // back (released), but not while winding down: that is when a
        // handler saves its progress.
        let fence = signals.release.child_token();
        // Renewed from the start, so that even moving a message to the
        // poison queue (several calls) happens under a lease.
        let renewal = Renewal::start(
            Arc::clone(&self.queue),
            Arc::clone(&lease),
            received_at,
            self.config.visibility_timeout,
            fence.clone(),
        );
        let delivery = Delivery {
            message,
            lease,
            job_token,
            renewal: Some(renewal),
        };
        let decoded = self.config.encoding.decode(&delivery.message.body);
        let body_key = decoded.as_ref().ok().and_then(|body| handler.job_key(body));
        let keyed_by_message_id = body_key.is_none();
        let key = body_key.unwrap_or_else(|| delivery.message.id.to_string());
        // The record matters before the handler only if the crash-loop guard
        // could fire: a first delivery costs no read.
        let earlier = if delivery.message.dequeue_count > self.config.max_deliveries {
            self.read_attempts(&delivery).await
        } else {
            ReadAttempts::default()
        };
        let mut earlier_read = EarlierRead::default();
        let pre_check = if checkpoint_may_exist(delivery.message.dequeue_count, keyed_by_message_id)
        {
            self.check_completed(&key, &delivery).await
        } else {
            PreCheck::NotCompleted(None)
        };
        let completion = match pre_check {
            PreCheck::Completed(result) => {
                let body = decoded.as_deref().unwrap_or_default();
                match handler.verify_completed(body, &result) {
                    Ok(()) => Completion::Completed,
                    Err(error) => Completion::CompletedDifferently(error.to_string()),
                }
            }
            PreCheck::NotCompleted(latest) => {
                earlier_read = EarlierRead::new(key.clone(), latest);
                Completion::NotCompleted
            }
            PreCheck::Interrupted => {
                return self
                    .finish(
                        delivery,
                        &signals,
                        Ending::Dropped,
                        &CheckpointNotes::default(),
                        earlier,
                    )
                    .await;
            }
            PreCheck::Failed(error) => {
                let error = format!("reading the checkpoint {key} failed: {error}");
                let ending = Ending::Failed {
                    error: &error,
                    permanent: false,
                };
                return self
                    .finish(
                        delivery,
                        &signals,
                        ending,
                        &CheckpointNotes::default(),
                        earlier,
                    )
                    .await;
            }
        };
        let undecodable = decoded.as_ref().err().map(ToString::to_string);
        let arrival = Arrival {
            dequeue_count: delivery.message.dequeue_count,
            completion,
            undecodable: undecodable.as_deref(),
            attempts: &earlier.attempts,
        };
        let failures = earlier.attempts.failures;
        let body = match (admit(&arrival, self.limits()), decoded) {
            (Admission::Run, Ok(body)) => body,
            (Admission::DeleteCompleted, _) => {
                return self.delete_completed(delivery).await;
            }
            (Admission::Poison(cause), _) => {
                return self.poison(delivery, cause, failures).await;
            }
            // `admit` never runs a body that did not decode.
            (Admission::Run, Err(error)) => {
                let cause = PoisonCause::Undecodable(error.to_string());
                return self.poison(delivery, cause, failures).await;
            }
        };
        let notes = Arc::new(CheckpointNotes::default());
        let job = Job {
            id: delivery.message.id.clone(),
            key,
            dequeue_count: delivery.message.dequeue_count,
            // Known without a read on a first delivery, or when the
            // crash-loop guard read the record.
            failures: (delivery.message.dequeue_count <= 1
                || delivery.message.dequeue_count > self.config.max_deliveries)
                .then_some(failures),
            attempts: self.attempts.clone(),
            inserted_at: delivery.message.inserted_at,
            body,
            cancelled: delivery.job_token.clone(),
            fence,
            deadline: signals.deadline.subscribe(),
            checkpoints: self.checkpoints.clone(),
            notes: Arc::clone(&notes),
            earlier_read,
        };
        let result = self.run_handler(&*handler, job, &delivery, &signals).await;
        let error_text = match &result {
            Some(Err(error)) => Some(error.to_string()),
            _ => None,
        };
        let ending = match (&result, &error_text) {
            (Some(Ok(())), _) => Ending::Succeeded,
            (Some(Err(error)), Some(text)) => Ending::Failed {
                error: text,
                permanent: Permanent::is_in(error.as_ref()),
            },
            _ => Ending::Dropped,
        };
        self.finish(delivery, &signals, ending, &notes, earlier)
            .await;
    }

    /// Runs the handler until it returns, the worker releases, or the lease
    /// is lost; `None` if it was dropped.
    async fn run_handler<H: MessageHandler>(
        &self,
        handler: &H,
        job: Job,
        delivery: &Delivery,
        signals: &DrainSignals,
    ) -> Option<Result<(), HandlerError>> {
        // A panic is one more failed attempt: left to unwind, it would end
        // this task without settling, and a crash-looping message would
        // never reach the poison queue. Nothing the handler shares with the
        // consumer is left half-updated by it.
        let handle = AssertUnwindSafe(handler.handle(job)).catch_unwind();
        tokio::pin!(handle);
        // The handler comes first so a result that is ready is kept even if
        // a release arrived at the same moment. Winding down only cancels
        // its token: it still gets to save progress.
        tokio::select! {
            biased;
            result = &mut handle => {
                Some(result.unwrap_or_else(|panic| Err(panic_error(panic.as_ref()))))
            }
            () = signals.release.cancelled() => None,
            () = delivery.lease.lost() => {
                delivery.job_token.cancel();
                None
            }
        }
    }

    /// Decides and carries out the settlement of a delivery whose handler
    /// has stopped (or never started).
    async fn finish(
        &self,
        mut delivery: Delivery,
        signals: &DrainSignals,
        ending: Ending<'_>,
        notes: &CheckpointNotes,
        earlier: ReadAttempts,
    ) {
        let shutting_down = signals.wind_down.is_cancelled();
        let lease_lost = delivery.lease.is_lost();
        let store_unreachable = notes.unreachable.get();
        // The record is read when it decides something: after a failure that
        // is not shutdown's doing, while its store can be reached.
        let record = if matches!(ending, Ending::Failed { .. })
            && !shutting_down
            && !lease_lost
            && store_unreachable.is_none()
        {
            self.read_attempts(&delivery).await
        } else {
            earlier
        };
        let departure = Departure {
            ending,
            lease_lost,
            shutting_down,
            fenced_by_peer: notes.conflict.get().is_some(),
            store_unreachable: store_unreachable.is_some(),
            attempts: &record.attempts,
        };
        match settle(&departure, self.limits()) {
            Settlement::Poison(cause) => {
                let failures = match &cause {
                    PoisonCause::Failed { failures, .. } => *failures,
                    _ => record.attempts.failures,
                };
                self.poison(delivery, cause, failures).await;
            }
            Settlement::Retry { attempts } => {
                self.record_attempts(&delivery, &record, &attempts).await;
                let delay = self.backoff(attempts.failures);
                tracing::warn!(error = attempts.last_error.as_deref().unwrap_or_default(), failures = attempts.failures, retry_in = ?delay, "handler failed; will retry");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    bump(&self.counters.retried);
                }
            }
            Settlement::WaitForPeer { attempts } => {
                self.record_attempts(&delivery, &record, &attempts).await;
                let delay = self.backoff(attempts.waits);
                tracing::info!(retry_in = ?delay, waits = attempts.waits, "another holder of this job wrote newer progress; checking again later (not a failure)");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    bump(&self.counters.waited_for_peer);
                }
            }
            Settlement::WaitForStore => {
                let delay = self.backoff(delivery.message.dequeue_count);
                tracing::warn!(error = store_unreachable.map(String::as_str).unwrap_or_default(), retry_in = ?delay, "the checkpoint store could not be reached; trying the message again later (not a failure)");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    bump(&self.counters.waited_for_store);
                }
            }
            Settlement::Delete => {
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
                    bump(&self.counters.succeeded);
                    tracing::debug!("handled and deleted");
                    self.forget_attempts(&delivery).await;
                }
            }
            Settlement::Release => {
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self
                        .make_visible_after(&delivery.lease, std::time::Duration::ZERO)
                        .await
                {
                    bump(&self.counters.released);
                    tracing::info!("released on shutdown (not counted as a failure)");
                }
            }
            Settlement::Leave(why) => {
                delivery.stop_renewing().await;
                if delivery.lease.is_lost() {
                    bump(&self.counters.leases_lost);
                    tracing::warn!("{why}; nothing written");
                } else {
                    tracing::error!("{why}; leaving the message to its visibility timeout");
                }
            }
        }
    }

    /// Whether the lease survived until settling; counts it if not.
    fn settled_lease(&self, delivery: &Delivery) -> bool {
        if delivery.lease.is_lost() {
            bump(&self.counters.leases_lost);
            tracing::warn!(
                "lease lost before settling; the message belongs to another consumer now"
            );
            return false;
        }
        true
    }

    /// The retry delay after the `n`th recorded failure or wait.
    fn backoff(&self, n: u32) -> std::time::Duration {
        retry_delay(
            self.config.retry_backoff_base,
            self.config.retry_backoff_max,
            n,
        )
    }

    /// Deletes a message whose job is completed, without running it.
    async fn delete_completed(&self, mut delivery: Delivery) {
        delivery.stop_renewing().await;
        if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
            bump(&self.counters.skipped_completed);
            tracing::info!("the job is completed already; deleted without running it");
            self.forget_attempts(&delivery).await;
        }
    }

    /// Whether the job's checkpoint is completed.
    ///
    /// A checkpoint store that is unavailable (a transient error, or
    /// `NotFound` while its container is missing) never pushes a message
    /// towards the poison queue: the read is retried with the retry backoff
    /// while the message stays leased, and the slot stays taken, so the
    /// consumer stops receiving work it could not start. Other errors (the
    /// store refuses the request, or the checkpoint does not parse) will
    /// not go away by waiting and count as a failure.
    async fn check_completed(&self, key: &str, delivery: &Delivery) -> PreCheck {
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
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// The failure a panicking handler counts as.
fn panic_error(payload: &(dyn Any + Send)) -> HandlerError {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not text");
    format!("handler panicked: {message}").into()
}
