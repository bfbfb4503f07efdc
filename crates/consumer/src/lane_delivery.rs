//! A delivery of a job with a deadline ([`lanes`](spot_worker_lanes)): its
//! claim on the job's lane record before the handler runs, the check of a
//! job running on regular capacity (back to Spot once ahead of its line by
//! two switches), and the move to the other lane where the job is let go.

use std::sync::Arc;
use std::time::Duration;

use spot_worker_decisions::cadence::Interruption;
use spot_worker_decisions::lanes::{Lane, Phase};
use time::OffsetDateTime;

use spot_worker_lanes::{
    Arrival, Carried, LaneRecord, LaneRecords, MoveJob, Moved, Part, ReadRecord, arrival,
    progress_of, waits_for_spot,
};
use spot_worker_storage::StorageError;
use spot_worker_storage::store_unreachable;

use super::Consumer;
use super::finish::delivery_tail;
use super::in_flight::Delivery;
use super::lane_state::LaneStart;
use super::outcome::DeliveryOutcome;

/// How often a claim is tried again after losing a race for the record.
const CLAIM_ATTEMPTS: u32 = 4;

impl Consumer {
    fn records(&self) -> Option<LaneRecords> {
        self.checkpoints
            .as_ref()
            .map(|store| LaneRecords::new(Arc::clone(store)))
    }

    /// Claims the job for this delivery, or settles an old copy or a begun
    /// move instead (see [`lanes`](spot_worker_lanes)'s record); needs lanes and
    /// a checkpoint store, else it runs.
    pub(super) async fn lane_arrival(&self, delivery: &mut Delivery) -> LaneStart {
        let (Some(lane), Some(records), Some(lanes)) =
            (delivery.lane.clone(), self.records(), &self.lanes)
        else {
            return LaneStart::Run;
        };
        let key = delivery.leftover.key().to_owned();
        let key = key.as_str();
        let envelope = &lane.envelope;
        let held = delivery.message.dequeue_count;
        for _ in 0..CLAIM_ATTEMPTS {
            let read = match records.read_fenced(key).await {
                Ok(read) => read,
                Err(error) if store_unreachable(&error) => return LaneStart::StoreDown(error),
                Err(error) => {
                    tracing::error!(%error, "the job's lane record does not read; running it without the record's check");
                    return LaneStart::Run;
                }
            };
            let verdict = arrival(
                read.record.as_ref(),
                envelope.generation,
                delivery.message.id.as_str(),
                envelope.moved_from.as_deref(),
            );
            match verdict {
                Arrival::Run | Arrival::Claim => {
                    let claim = match (&verdict, &read.record) {
                        // A redelivery of the live message claims it again,
                        // as this receive: a mover that read the record
                        // before (its hold ran out) then fails to write its
                        // intent, and one that reads it after sees this
                        // receive and moves nothing.
                        (Arrival::Run, Some(record)) => {
                            if record.held > held {
                                return self.lost_to_later_receive(delivery).await;
                            }
                            LaneRecord {
                                held,
                                updated_at: OffsetDateTime::now_utc(),
                                ..record.clone()
                            }
                        }
                        _ => LaneRecord::claimed_by(
                            delivery.message.id.as_str(),
                            envelope,
                            lanes.lane,
                            held,
                            read.record.as_ref(),
                        ),
                    };
                    match records.write(key, &read, &claim).await {
                        Ok(etag) => {
                            lane.set_record(ReadRecord {
                                record: Some(claim),
                                etag: Some(etag),
                            });
                            return LaneStart::Run;
                        }
                        Err(StorageError::Conflict { .. }) => continue,
                        Err(error) if store_unreachable(&error) => {
                            return LaneStart::StoreDown(error);
                        }
                        Err(error) => {
                            tracing::error!(%error, "the job's lane record cannot be written; running it without the record's check");
                            return LaneStart::Run;
                        }
                    }
                }
                Arrival::Poisoning => return LaneStart::Poisoning,
                Arrival::Stale => {
                    let poisoned = read.record.as_ref().is_some_and(|r| r.poisoned);
                    self.delete_stale(delivery, poisoned).await;
                    return LaneStart::Settled;
                }
                Arrival::CompleteMove(to) => {
                    tracing::info!(
                        to = to.as_str(),
                        "a move of this job was begun and not finished; finishing it"
                    );
                    lane.set_record(read);
                    if self.move_on(delivery, to, None).await {
                        return LaneStart::Settled;
                    }
                    // Not sent: look again, and claim it to run here (or
                    // find that another receive did).
                    continue;
                }
            }
        }
        // Never run without a claim: the message reappears after its hold.
        delivery.stop_renewing().await;
        tracing::warn!(
            "the job's lane record kept changing under this delivery; not run now, it reappears after its hold"
        );
        LaneStart::Settled
    }

    /// Deletes an old copy of a job unrun (of a job that was `poisoned`:
    /// it stays poisoned).
    async fn delete_stale(&self, delivery: &mut Delivery, poisoned: bool) {
        delivery.stop_renewing().await;
        if self.settled_lease(delivery) && self.delete(&delivery.lease).await {
            self.settled(DeliveryOutcome::Superseded);
            if poisoned {
                tracing::warn!(
                    "a copy of a poisoned job left by a move; deleted without running it (the job stays poisoned: requeue its poison record to run it again)"
                );
            } else {
                tracing::info!(
                    "an older copy of a job moved between lanes; deleted without running it"
                );
            }
            let _ = self.attempts.forget(&delivery.message.id).await;
        }
    }

    /// A later receive of this delivery's message claimed the job: this
    /// delivery's hold ran out before it started, and the message is that
    /// receive's now. Runs nothing, settles nothing.
    async fn lost_to_later_receive(&self, delivery: &mut Delivery) -> LaneStart {
        delivery.stop_renewing().await;
        tracing::warn!(
            "a later receive of this message claimed the job before this delivery started it; not run here"
        );
        LaneStart::Settled
    }

    /// Moves the delivery's job to lane `to` (send, then delete); whether
    /// its message is gone from this lane. `kind` is the interruption a
    /// release that moves the job counts for the checkpoint interval.
    pub(super) async fn move_on(
        &self,
        delivery: &mut Delivery,
        to: Lane,
        kind: Option<Interruption>,
    ) -> bool {
        let (Some(lane), Some(records), Some(lanes)) =
            (delivery.lane.clone(), self.records(), &self.lanes)
        else {
            return false;
        };
        let tail = delivery_tail(delivery);
        let earlier = match tokio::time::timeout(
            self.config.settle_timeout,
            self.attempts.read(&delivery.message.id),
        )
        .await
        {
            Ok(Ok(read)) => read.attempts,
            _ => {
                tracing::warn!(
                    "could not read the attempt record before a move; the job's earlier failures and tails are not carried on"
                );
                Default::default()
            }
        };
        let envelope = &lane.envelope;
        let carried = Carried {
            failures: envelope.carried.failures.saturating_add(earlier.failures),
            deliveries: envelope
                .carried
                .deliveries
                .saturating_add(delivery.message.dequeue_count.saturating_sub(earlier.looks)),
            tails: envelope.carried.tails.plus(&earlier.goodput).plus(&tail),
        };
        let read = match lane.take_record() {
            Some(read) => read,
            None => match records.read_fenced(delivery.leftover.key()).await {
                Ok(read) => read,
                Err(error) => {
                    tracing::warn!(%error, "could not read the job's lane record; it stays in this lane");
                    return false;
                }
            },
        };
        let key = delivery.leftover.key().to_owned();
        let job = MoveJob {
            key: &key,
            message: &delivery.message.id,
            held: delivery.message.dequeue_count,
            envelope,
            body: &lane.body,
            from: lanes.lane,
            to,
            carried,
        };
        let sent = tokio::time::timeout(
            self.config.settle_timeout,
            lanes.send_moved(&records, self.config.encoding, &job, read),
        )
        .await
        .unwrap_or_else(|_| Moved::NotSent("it took longer than the settle timeout".into()));
        let outcome = match sent {
            Moved::Sent(id) => {
                tracing::info!(to = to.as_str(), new_message = %id, "the job moved to the {} lane", to.as_str());
                DeliveryOutcome::Moved
            }
            Moved::Stale => DeliveryOutcome::Superseded,
            Moved::NotSent(reason) => {
                tracing::warn!(%reason, "the job could not move to the {} lane; it stays in this one", to.as_str());
                return false;
            }
        };
        if outcome == DeliveryOutcome::Moved && tail.redone_ms > 0 {
            lanes
                .switch_cost
                .sample(Part::LostWork, Duration::from_millis(tail.redone_ms));
        }
        delivery.stop_renewing().await;
        if self.settled_lease(delivery) && self.delete(&delivery.lease).await {
            self.settled(outcome);
            if let Some(kind) = kind {
                self.cadence.note(kind);
            }
        }
        // Its record is of no use any more, whether or not the delete
        // landed: a copy that reappears is an old one.
        let _ = self.attempts.forget(&delivery.message.id).await;
        true
    }

    /// While a job with a deadline runs on regular capacity, asks the rule
    /// every recheck whether it is ahead of its line by two switches; when
    /// it is, asks the handler to stop (it saves, as on a drain) and has
    /// the delivery move the job back to the Spot lane.
    pub(super) fn watch_running_lane(
        &self,
        delivery: &Delivery,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (Some(lane), Some(lanes)) = (&delivery.lane, &self.lanes) else {
            return None;
        };
        if lanes.lane != Lane::Regular {
            // A job running on Spot is never moved.
            return None;
        }
        let (lane, lanes) = (Arc::clone(lane), lanes.clone());
        let (clock, token) = (Arc::clone(&delivery.clock), delivery.job_token.clone());
        let encoding = self.config.encoding;
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(lanes.recheck) => {}
                }
                let deadline = lane.envelope.deadline;
                let progress = progress_of(
                    &deadline,
                    clock.saved_progress(),
                    Some(&clock.saved_ledger()),
                );
                let choice = lanes.choose(deadline, progress, Lane::Regular, Phase::Running);
                if waits_for_spot(choice.reason) && !lanes.spot_capacity.there() {
                    lanes.ask_for_spot(encoding).await;
                }
                if choice.lane == Lane::Spot {
                    tracing::info!(
                        reason = choice.reason.as_str(),
                        "ahead of its line by two switches: back to the Spot lane once it has saved"
                    );
                    lane.request(Lane::Spot, choice.reason);
                    token.cancel();
                    return;
                }
            }
        }))
    }

    /// Where a job with a deadline that is let go (released) goes: the
    /// lane the rule picks, from its progress as of its last save.
    pub(super) fn lane_at_release(&self, delivery: &Delivery) -> Option<Lane> {
        let (lane, lanes) = (delivery.lane.as_ref()?, self.lanes.as_ref()?);
        let deadline = lane.envelope.deadline;
        let progress = progress_of(
            &deadline,
            delivery.clock.saved_progress(),
            Some(&delivery.clock.saved_ledger()),
        );
        let choice = lanes.choose(deadline, progress, lanes.lane, Phase::Released);
        let slack = choice.standing.map(|s| s.slack_secs());
        tracing::info!(lane = choice.lane.as_str(), reason = choice.reason.as_str(), slack_s = ?slack, "the lane rule at the release");
        Some(choice.lane)
    }

    /// Marks the lane record of a job that finished: a copy of it that
    /// turns up later is discarded unrun. A failure is logged.
    pub(super) async fn finish_lane(&self, delivery: &Delivery) {
        let (Some(_), Some(records)) = (&delivery.lane, self.records()) else {
            return;
        };
        self.settle_call(
            "mark the job's lane record finished",
            records.finish(delivery.leftover.key()),
        )
        .await;
    }

    /// Marks the lane record of a job being poisoned poisoned (a
    /// tombstone): a copy a move left behind is then discarded unrun,
    /// while its poison record, requeued, runs. `Some(true)` once it is
    /// marked (or needs no mark: no lanes), `Some(false)` if this message
    /// is an old copy of the job, `None` if the record could not be
    /// written (logged).
    pub(super) async fn poison_lane(&self, delivery: &Delivery) -> Option<bool> {
        let (Some(lane), Some(records), Some(lanes)) =
            (&delivery.lane, self.records(), &self.lanes)
        else {
            return Some(true);
        };
        self.settle_call(
            "mark the job's lane record poisoned",
            records.poison(
                delivery.leftover.key(),
                delivery.message.id.as_str(),
                &lane.envelope,
                lanes.lane,
                delivery.message.dequeue_count,
            ),
        )
        .await
    }

    /// Samples the queue wait of a message's first delivery (insertion to
    /// receive) for d.
    pub(super) fn sample_queue_wait(&self, delivery: &Delivery) {
        let (Some(_), Some(lanes)) = (&delivery.lane, &self.lanes) else {
            return;
        };
        if delivery.message.dequeue_count != 1 {
            return;
        }
        if let Some(inserted) = delivery.message.inserted_at {
            let waited = OffsetDateTime::now_utc() - inserted;
            if let Ok(waited) = Duration::try_from(waited) {
                lanes.switch_cost.sample(Part::QueueWait, waited);
            }
        }
    }

    /// Samples the restore and start-up of a delivery that resumes a job
    /// from its checkpoint, as its handler starts.
    pub(super) fn sample_resume(&self, delivery: &Delivery, restore: Duration) {
        let (Some(_), Some(lanes)) = (&delivery.lane, &self.lanes) else {
            return;
        };
        let waiting = delivery.clock.now().waiting;
        lanes.switch_cost.sample(Part::Restore, restore);
        lanes
            .switch_cost
            .sample(Part::StartUp, waiting.saturating_sub(restore));
    }
}
