//! One delivery, from receive to settle: decode the body, check the job's
//! checkpoint (the one read of it, handed on to the handler; none where
//! [`pre_read`](super::pre_read) says nothing read could matter), admit or
//! refuse it, run the handler under a renewed lease,
//! and carry out what [`settlement`](super::settlement) decides.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::checkpoint::{Checkpoint, CheckpointNotes, StoredCheckpoint, store_unreachable};
use crate::error::StorageError;
use crate::queue::QueueMessage;

use super::Consumer;
use super::attempts::ReadAttempts;
use super::backoff::retry_delay;
use super::handler::{CheckpointRead, EarlierRead, HandlerError, Job, MessageHandler, Permanent};
use super::lease::{Lease, Renewal};
use super::leftover::Leftover;
use super::outcome::DeliveryOutcome;
use super::panics::{HandlerPart, catching, panic_error};
use super::pre_read::{PreRead, pre_read};
use super::release_note::ReleaseNote;
use super::settlement::{
    Admission, Arrival, Completion, Departure, Ending, Limits, PoisonCause, Settlement, admit,
    settle,
};
use super::signals::DrainSignals;

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

/// Everything one delivery holds while it is processed.
pub(super) struct Delivery {
    pub(super) message: QueueMessage,
    pub(super) lease: Arc<Lease>,
    /// The handler's token: cancelled by wind-down, release or a lost lease.
    pub(super) job_token: CancellationToken,
    /// The job's own checkpoint as this delivery knows it, removed after a
    /// success when nobody can use it.
    pub(super) leftover: Arc<Leftover>,
    renewal: Option<Renewal>,
    /// Cancelled at the release stage: from then on settling no longer
    /// waits for a renewal in flight.
    hurry: CancellationToken,
    /// Records a release on shutdown in the attempt record.
    pub(super) note: ReleaseNote,
}

impl Delivery {
    /// Stops renewing the lease. A renewal in flight is waited for, so the
    /// settling call uses the pop receipt it brings (a job that finished
    /// while the worker winds down is then deleted, not redelivered), but
    /// only until the release stage: then it is abandoned at once. (The
    /// job's token is no use here: wind-down has cancelled it already.)
    pub(super) async fn stop_renewing(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop(&self.hurry).await;
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
        let note = ReleaseNote::watch(
            self.attempts.clone(),
            message.id.clone(),
            signals.wind_down.clone(),
            self.note_deadline(),
        );
        let decoded = self.config.encoding.decode(&message.body);
        // The handler's own reading of the body, before the delivery is
        // built around its key; a panic in it is settled as a failure once
        // the delivery exists.
        let identified = decoded
            .as_ref()
            .ok()
            .map(|body| -> Result<_, HandlerError> {
                let key = catching(HandlerPart::JobKey, || handler.job_key(body))?;
                let marker = catching(HandlerPart::CompletionMarker, || {
                    handler.completion_marker(body)
                })?;
                Ok((key, marker))
            })
            .transpose();
        let (body_key, marker, panicked) = match identified {
            Ok(found) => {
                let (key, marker) = found.unwrap_or((None, None));
                (key, marker, None)
            }
            Err(panicked) => (None, None, Some(panicked)),
        };
        let keyed_by_message_id = body_key.is_none();
        let key = body_key.unwrap_or_else(|| message.id.to_string());
        let delivery = Delivery {
            message,
            lease,
            job_token,
            leftover: Arc::new(Leftover::new(key.clone(), keyed_by_message_id)),
            renewal: Some(renewal),
            hurry: signals.release.clone(),
            note,
        };
        if let Some(panicked) = panicked {
            return self.panicked(delivery, &signals, &panicked).await;
        }
        // The record matters before the handler only if the crash-loop guard
        // could fire: a first delivery costs no read. One that cannot be
        // read leaves the guard out of this delivery, rather than counting
        // every recorded outcome as missing.
        let (earlier, record_unread) =
            if delivery.message.dequeue_count > self.config.max_deliveries {
                match self.try_read_attempts(&delivery).await {
                    Some(read) => (read, false),
                    None => (ReadAttempts::default(), true),
                }
            } else {
                (ReadAttempts::default(), false)
            };
        let mut earlier_read = EarlierRead::default();
        let reads = pre_read(
            delivery.message.dequeue_count,
            keyed_by_message_id,
            marker.is_some(),
        );
        let pre_check = match reads {
            PreRead::Nothing => PreCheck::NotCompleted(None),
            PreRead::Checkpoint | PreRead::CheckpointAndMarker => {
                self.check_completed(&key, &delivery).await
            }
        };
        match &pre_check {
            PreCheck::NotCompleted(latest) => {
                delivery
                    .leftover
                    .saw(latest.as_ref().map(|stored| &stored.checkpoint));
            }
            PreCheck::Completed(_) => delivery.leftover.saw_completed(),
            _ => {}
        }
        let pre_check = match (pre_check, &marker) {
            (PreCheck::NotCompleted(latest), Some(marker))
                if reads == PreRead::CheckpointAndMarker =>
            {
                self.check_marker(marker, &delivery, latest).await
            }
            (pre_check, _) => pre_check,
        };
        let completion = match pre_check {
            PreCheck::Completed(result) => {
                let body = decoded.as_deref().unwrap_or_default();
                let verified = catching(HandlerPart::VerifyCompleted, || {
                    handler.verify_completed(body, &result)
                });
                match verified {
                    Ok(Ok(())) => Completion::Completed,
                    Ok(Err(error)) => Completion::CompletedDifferently(error.to_string()),
                    Err(panicked) => return self.panicked(delivery, &signals, &panicked).await,
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
            PreCheck::StoreDown(error) => {
                let notes = CheckpointNotes::default();
                notes.note(&error);
                let error = format!("reading the checkpoint {key} failed: {error}");
                let ending = Ending::Failed {
                    error: &error,
                    permanent: false,
                };
                return self
                    .finish(delivery, &signals, ending, &notes, earlier)
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
            PreCheck::Unreachable(error) => {
                // An outage of the result store is waited out like one of
                // the checkpoint store: not the job's fault.
                let notes = CheckpointNotes::default();
                let _ = notes.unreachable.set(error.clone());
                let ending = Ending::Failed {
                    error: &error,
                    permanent: false,
                };
                return self
                    .finish(delivery, &signals, ending, &notes, earlier)
                    .await;
            }
        };
        let undecodable = decoded.as_ref().err().map(ToString::to_string);
        let arrival = Arrival {
            dequeue_count: delivery.message.dequeue_count,
            completion,
            undecodable: undecodable.as_deref(),
            attempts: &earlier.attempts,
            record_unread,
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
        let notes = Arc::new(CheckpointNotes::for_job(key.clone()));
        let handler_fence = fence.clone();
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
            leftover: Arc::clone(&delivery.leftover),
        };
        let result = self.run_handler(handler, job, &delivery, &signals).await;
        // The handler returned or was abandoned: whatever it left running
        // (blocking code that ignores cancellation) writes nothing more for
        // this delivery, which is settled from here on.
        handler_fence.cancel();
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
        handler: Arc<H>,
        job: Job,
        delivery: &Delivery,
        signals: &DrainSignals,
    ) -> Option<Result<(), HandlerError>> {
        // On a task of its own: a handler that never yields (blocking code
        // in an async fn) then holds only its own worker thread, and this
        // delivery can still be released. A panic is one more failed attempt
        // (see `panics`), whether it comes before the future is made or
        // inside it: left to unwind, it would end the delivery without
        // settling, and a crash-looping message would never reach the
        // poison queue.
        let span = tracing::Span::current();
        let task = tokio::spawn(
            async move {
                let future = catching(HandlerPart::HandleStart, || handler.handle(job))?;
                AssertUnwindSafe(future)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(panic_error(HandlerPart::Handle, panic.as_ref())))
            }
            .instrument(span),
        );
        // Dropped on every way out: a handler still running is dropped (at
        // its next await; blocking code runs on, fenced).
        let _abort = AbortOnDrop(task.abort_handle());
        tokio::pin!(task);
        // The handler comes first so a result that is ready is kept even if
        // a release arrived at the same moment. Winding down only cancels
        // its token: it still gets to save progress.
        tokio::select! {
            biased;
            joined = &mut task => Some(match joined {
                Ok(result) => result,
                Err(error) if error.is_panic() => {
                    Err(panic_error(HandlerPart::Handle, error.into_panic().as_ref()))
                }
                Err(error) => Err(format!("the handler's task ended: {error}").into()),
            }),
            () = signals.release.cancelled() => None,
            () = delivery.lease.lost() => {
                delivery.job_token.cancel();
                None
            }
        }
    }

    /// Settles a delivery whose handler code panicked before the handler
    /// ran (in `job_key` or `verify_completed`): a failure like any other.
    async fn panicked(&self, delivery: Delivery, signals: &DrainSignals, panicked: &HandlerError) {
        let error = panicked.to_string();
        let ending = Ending::Failed {
            error: &error,
            permanent: false,
        };
        let notes = CheckpointNotes::default();
        self.finish(delivery, signals, ending, &notes, ReadAttempts::default())
            .await;
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
        // Claimed before the stage is looked at: a note not started now
        // never starts, so nothing below races it for the record.
        let noting = delivery.note.close();
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
            fenced_by_peer: notes.fenced_on_own_key(),
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
                    self.settled(DeliveryOutcome::Retried);
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
                    self.settled(DeliveryOutcome::WaitedForPeer);
                }
            }
            Settlement::WaitForStore => {
                let delay = self.backoff(delivery.message.dequeue_count);
                tracing::warn!(error = store_unreachable.map(String::as_str).unwrap_or_default(), retry_in = ?delay, "the checkpoint store could not be reached; trying the message again later (not a failure)");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    self.settled(DeliveryOutcome::WaitedForStore);
                }
            }
            Settlement::Delete => {
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
                    self.settled(DeliveryOutcome::Succeeded);
                    tracing::debug!("handled and deleted");
                    self.forget_attempts(&mut delivery).await;
                    self.remove_leftover(&delivery).await;
                }
            }
            Settlement::Release => {
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) {
                    self.release_noted(&mut delivery, noting, signals).await;
                }
            }
            Settlement::Leave(why) => {
                delivery.stop_renewing().await;
                if delivery.lease.is_lost() {
                    self.settled(DeliveryOutcome::LeaseLost);
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
            self.settled(DeliveryOutcome::LeaseLost);
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
            self.settled(DeliveryOutcome::SkippedCompleted);
            tracing::info!("the job is completed already; deleted without running it");
            self.forget_attempts(&mut delivery).await;
            self.remove_leftover(&delivery).await;
        }
    }

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
                () = self.monitor.paused() => return PreCheck::StoreDown(error),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Aborts a handler's task when the delivery lets go of it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
