//! One delivery, from receive to settle: decode the body, check the job's
//! checkpoint (the one read of it, handed on to the handler; none where
//! [`pre_read`](super::pre_read) says nothing read could matter;
//! [`pre_check`](super::pre_check) reads it), admit or refuse it, run the
//! handler under a renewed lease, and hand the ending to
//! [`finish`](super::finish), which carries out what
//! [`settlement`](super::settlement) decides.

use std::sync::Arc;

use spot_worker_decisions::goodput::{split_stamp, stamp_progress};
use spot_worker_decisions::lanes::Lane;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use spot_worker_envelope::Envelope;
use spot_worker_storage::QueueMessage;
use spot_worker_storage::{CheckpointNotes, SaveClock};

use super::Consumer;
use super::handler::{HandlerError, MessageHandler, Permanent};
use super::in_flight::{AbortOnDrop, Delivery};
use super::job::{EarlierRead, Job};
use super::lane_state::{LaneDelivery, LaneStart};
use super::lease::{Lease, Renewal};
use super::panics::{HandlerPart, catching};
use super::pre_check::PreCheck;
use super::pre_read::{PreRead, pre_read};
use super::record_read::RecordRead;
use super::release_note::ReleaseNote;
use super::settlement::{Admission, Arrival, Completion, Ending, Limits, PoisonCause, admit};
use super::signals::DrainSignals;
use spot_worker_storage::Leftover;
use spot_worker_storage::attempts::ReadAttempts;

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
        if self.is_probe(&message) {
            return self.take_probe(&message).await;
        }
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
        // A deadline travels in an envelope around the body: the handler
        // reads the body as the producer sent it.
        let (decoded, envelope) = match self.config.encoding.decode(&message.body) {
            Ok(bytes) => match open_envelope(bytes) {
                Ok((body, envelope)) => (Ok(body), envelope),
                Err(error) => (Err(error), None),
            },
            Err(error) => (Err(error.to_string()), None),
        };
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
        // A job keyed by its first message's id keeps that key on the
        // messages that carry it on after a move.
        let carried_key = envelope.as_ref().and_then(|e| e.key.clone());
        let keyed_by_message_id = body_key.is_none() && carried_key.is_none();
        let key = body_key
            .or(carried_key)
            .unwrap_or_else(|| message.id.to_string());
        let lane = match (envelope, &decoded) {
            (Some(envelope), Ok(body)) => Some(Arc::new(LaneDelivery::new(envelope, body.clone()))),
            _ => None,
        };
        let mut delivery = Delivery {
            message,
            lease,
            job_token,
            leftover: Arc::new(Leftover::new(key.clone(), keyed_by_message_id)),
            renewal: Some(renewal),
            hurry: signals.release.clone(),
            note,
            clock: Arc::new(SaveClock::new(received_at)),
            handler_started: false,
            lane,
        };
        if self
            .lanes
            .as_ref()
            .is_some_and(|lanes| lanes.lane() == Lane::Regular)
        {
            delivery.clock.on_regular_capacity();
        }
        if delivery.lane.is_some() {
            delivery.clock.track_progress(None);
            self.sample_queue_wait(&delivery);
        }
        if let Some(panicked) = panicked {
            return self.panicked(delivery, &signals, &panicked).await;
        }
        // A key where the workers keep their own records would read and
        // write one of them as the job's checkpoint: poisoned, with the
        // reason, before anything touches it (its lane record too).
        if let Some(reserved) = spot_worker_storage::reserved_job_key(&key) {
            delivery.lane = None;
            let cause =
                PoisonCause::Reserved(format!("the job key {key:?}: {}", reserved.explain()));
            return self.poison(delivery, cause, 0).await;
        }
        // The record matters before the handler on a redelivery: it may say
        // an earlier delivery was moving the message to the poison queue
        // (then that is finished, and nothing runs), and it serves the
        // crash-loop guard and the count of earlier deliveries that ended
        // with no outcome (`no_outcome`). A first delivery costs no read.
        // One that does not parse leaves the guard out of this delivery,
        // rather than counting every recorded outcome as missing; one whose
        // store cannot be reached is waited out.
        let (earlier, record_unread) = if delivery.message.dequeue_count > 1 {
            match self.read_record_before_run(&delivery).await {
                RecordRead::Read(read) => (self.count_no_outcome(&delivery, read).await, false),
                RecordRead::Unread => (ReadAttempts::default(), true),
                RecordRead::Unreachable(error) => {
                    return self
                        .wait_out_store(delivery, &signals, error, ReadAttempts::default())
                        .await;
                }
                RecordRead::Interrupted => {
                    let notes = CheckpointNotes::default();
                    return self
                        .finish(
                            delivery,
                            &signals,
                            Ending::Dropped,
                            &notes,
                            ReadAttempts::default(),
                        )
                        .await;
                }
            }
        } else {
            (ReadAttempts::default(), false)
        };
        if let Some(poisoning) = earlier.attempts.poisoning.clone() {
            return self.finish_poisoning(delivery, poisoning).await;
        }
        let mut earlier_read = EarlierRead::default();
        let reads = pre_read(
            delivery.message.dequeue_count,
            keyed_by_message_id,
            marker.is_some(),
        );
        let read_started = Instant::now();
        let pre_check = match reads {
            PreRead::Nothing => PreCheck::NotCompleted(None),
            PreRead::Checkpoint | PreRead::CheckpointAndMarker => {
                self.check_completed(&key, &delivery).await
            }
        };
        let restore = read_started.elapsed();
        let mut resumed = false;
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
                // The job's time so far, as the checkpoint it resumes from
                // carries it.
                let stamp = latest.as_ref().and_then(|stored| stored.stamp.as_deref());
                if let Some(ledger) = stamp.and_then(|stamp| split_stamp(stamp).1) {
                    delivery.clock.carry(ledger);
                }
                if delivery.lane.is_some() {
                    delivery
                        .clock
                        .track_progress(stamp.and_then(stamp_progress));
                }
                resumed = latest.is_some();
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
                return self
                    .wait_out_store(delivery, &signals, error, earlier)
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
        let body = match (admit(&arrival, self.limits_for(&delivery)), decoded) {
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
        match self.lane_arrival(&mut delivery).await {
            LaneStart::Run => {}
            LaneStart::Settled => return,
            LaneStart::Poisoning => {
                return self
                    .poison(delivery, PoisonCause::Tombstoned, failures)
                    .await;
            }
            LaneStart::StoreDown(error) => {
                let notes = CheckpointNotes::default();
                notes.note(&error);
                let error = format!("reading the job's lane record failed: {error}");
                let ending = Ending::Failed {
                    error: &error,
                    permanent: false,
                };
                return self
                    .finish(delivery, &signals, ending, &notes, earlier)
                    .await;
            }
        }
        if resumed {
            self.sample_resume(&delivery, restore);
        }
        let notes = Arc::new(CheckpointNotes::for_job(key.clone()));
        let handler_fence = fence.clone();
        let job = Job {
            id: delivery.message.id.clone(),
            key,
            dequeue_count: delivery.message.dequeue_count,
            // Known without a read on a first delivery, or from the read
            // of a redelivery.
            failures: (!record_unread
                || delivery.message.dequeue_count > self.config.max_deliveries)
                .then_some(failures),
            attempts: self.attempts.clone(),
            carried_failures: delivery
                .lane
                .as_ref()
                .map_or(0, |lane| lane.envelope.carried.failures),
            inserted_at: delivery.message.inserted_at,
            body,
            cancelled: delivery.job_token.clone(),
            fence,
            deadline: signals.deadline.subscribe(),
            checkpoints: self.checkpoints.clone(),
            notes: Arc::clone(&notes),
            earlier_read,
            leftover: Arc::clone(&delivery.leftover),
            clock: Arc::clone(&delivery.clock),
            cadence: Arc::clone(&self.cadence),
            due: delivery.lane.as_ref().map(|lane| lane.envelope.deadline),
            lane: self.lanes.as_ref().map(|lanes| lanes.lane()),
        };
        // Job time: what the interruption rates are per (see `cadence`),
        // counted as it accrues, so a crash loses at most an hour of it.
        let running = self.cadence.running_job();
        delivery.handler_started = true;
        let watch = self
            .watch_running_lane(&delivery)
            .map(|task| AbortOnDrop(task.abort_handle()));
        let result = self.run_handler(handler, job, &delivery, &signals).await;
        drop(watch);
        delivery.clock.handler_ended();
        drop(running);
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
}

/// The body of decoded message bytes, and the envelope around it if the
/// message carries a deadline; `Err` says why a header does not read.
fn open_envelope(bytes: Vec<u8>) -> Result<(Vec<u8>, Option<Envelope>), String> {
    match Envelope::unwrap(&bytes) {
        Ok((None, _)) => Ok((bytes, None)),
        Ok((Some(envelope), body)) => Ok((body.to_vec(), Some(envelope))),
        Err(error) => Err(error.to_string()),
    }
}
