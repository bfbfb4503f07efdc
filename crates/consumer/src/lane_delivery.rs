//! A delivery of a job with a deadline, the consumer's side of it: the
//! claim on the job before the handler runs (tried again after a lost race,
//! an old copy deleted, a begun move finished), the check of a job while it
//! runs, and the move to another lane where the job is let go. What each
//! step means for the lanes is the [`LanePlugin`](super::LanePlugin)'s.

use std::sync::Arc;
use std::time::Duration;

use spot_worker_decisions::cadence::Interruption;
use spot_worker_decisions::lanes::Lane;
use spot_worker_envelope::Carried;
use spot_worker_storage::CheckpointStore;
use time::OffsetDateTime;

use super::Consumer;
use super::finish::delivery_tail;
use super::in_flight::Delivery;
use super::lane_plugin::{Claim, LaneMove, LanePlugin, MoveSettings, SwitchPart};
use super::lane_state::{LaneDelivery, LaneStart};
use super::outcome::DeliveryOutcome;

/// How often a claim is tried again after losing a race for the record.
const CLAIM_ATTEMPTS: u32 = 4;

/// What a lane step needs: the delivery's lane state, the plugin and the
/// checkpoint store the lane records are kept in.
struct LaneParts<'a> {
    lane: Arc<LaneDelivery>,
    plugin: &'a Arc<dyn LanePlugin>,
    store: &'a Arc<dyn CheckpointStore>,
}

impl Consumer {
    /// What a lane step of `delivery` needs; `None` (the step is skipped)
    /// without any of it.
    fn lane_parts(&self, delivery: &Delivery) -> Option<LaneParts<'_>> {
        Some(LaneParts {
            lane: Arc::clone(delivery.lane.as_ref()?),
            plugin: self.lanes.as_ref()?,
            store: self.checkpoints.as_ref()?,
        })
    }

    /// Claims the job for this delivery, or settles an old copy or a begun
    /// move instead (as the lane plugin says); needs lanes and a checkpoint
    /// store, else it runs.
    pub(super) async fn lane_arrival(&self, delivery: &mut Delivery) -> LaneStart {
        let Some(LaneParts {
            lane,
            plugin,
            store,
        }) = self.lane_parts(delivery)
        else {
            return LaneStart::Run;
        };
        let key = delivery.leftover.key().to_owned();
        for _ in 0..CLAIM_ATTEMPTS {
            let claim = plugin
                .claim(store, &lane.job(&key, &delivery.message))
                .await;
            match claim {
                Claim::Run => return LaneStart::Run,
                Claim::Conflict => continue,
                Claim::LaterReceive => return self.lost_to_later_receive(delivery).await,
                Claim::Poisoning => return LaneStart::Poisoning,
                Claim::StoreDown(error) => return LaneStart::StoreDown(error),
                Claim::Stale { poisoned } => {
                    self.delete_stale(delivery, poisoned).await;
                    return LaneStart::Settled;
                }
                Claim::CompleteMove(to) => {
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
        let Some(LaneParts {
            lane,
            plugin,
            store,
        }) = self.lane_parts(delivery)
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
        let key = delivery.leftover.key().to_owned();
        let how = MoveSettings {
            encoding: self.config.encoding,
            settle_timeout: self.config.settle_timeout,
        };
        let moved = plugin
            .move_job(store, how, &lane.job(&key, &delivery.message), to, carried)
            .await;
        let outcome = match moved {
            LaneMove::Moved => DeliveryOutcome::Moved,
            LaneMove::Superseded => DeliveryOutcome::Superseded,
            LaneMove::Stayed => return false,
        };
        if outcome == DeliveryOutcome::Moved && tail.redone_ms > 0 {
            plugin.sample(SwitchPart::LostWork, Duration::from_millis(tail.redone_ms));
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

    /// While a job with a deadline runs, the plugin's check of it (the
    /// lanes: on regular capacity, whether it is ahead of its line by two
    /// switches); when the check names a lane, asks the handler to stop
    /// (it saves, as on a drain) and has the delivery move the job there.
    pub(super) fn watch_running_lane(
        &self,
        delivery: &Delivery,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (Some(lane), Some(plugin)) = (&delivery.lane, &self.lanes) else {
            return None;
        };
        let token = delivery.job_token.clone();
        let check = plugin.watch_running(
            lane.envelope.deadline,
            Arc::clone(&delivery.clock),
            token.clone(),
            self.config.encoding,
        )?;
        let lane = Arc::clone(lane);
        Some(tokio::spawn(async move {
            if let Some((to, reason)) = check.await {
                lane.request(to, reason);
                token.cancel();
            }
        }))
    }

    /// Where a job with a deadline that is let go (released) goes: the
    /// lane the plugin picks, from its progress as of its last save.
    pub(super) fn lane_at_release(&self, delivery: &Delivery) -> Option<Lane> {
        let (lane, plugin) = (delivery.lane.as_ref()?, self.lanes.as_ref()?);
        Some(plugin.lane_at_release(lane.envelope.deadline, &delivery.clock))
    }

    /// Marks the lane record of a job that finished: a copy of it that
    /// turns up later is discarded unrun. A failure is logged.
    pub(super) async fn finish_lane(&self, delivery: &Delivery) {
        let (Some(_), Some(finish), Some(store)) =
            (&delivery.lane, &self.lane_finish, &self.checkpoints)
        else {
            return;
        };
        self.settle_call(
            "mark the job's lane record finished",
            finish.finish(store, delivery.leftover.key()),
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
        let Some(LaneParts {
            lane,
            plugin,
            store,
        }) = self.lane_parts(delivery)
        else {
            return Some(true);
        };
        self.settle_call(
            "mark the job's lane record poisoned",
            plugin.poison(store, &lane.job(delivery.leftover.key(), &delivery.message)),
        )
        .await
    }

    /// Samples the queue wait of a message's first delivery (insertion to
    /// receive) for d.
    pub(super) fn sample_queue_wait(&self, delivery: &Delivery) {
        let (Some(_), Some(plugin)) = (&delivery.lane, &self.lanes) else {
            return;
        };
        if delivery.message.dequeue_count != 1 {
            return;
        }
        if let Some(inserted) = delivery.message.inserted_at {
            let waited = OffsetDateTime::now_utc() - inserted;
            if let Ok(waited) = Duration::try_from(waited) {
                plugin.sample(SwitchPart::QueueWait, waited);
            }
        }
    }

    /// Samples the restore and start-up of a delivery that resumes a job
    /// from its checkpoint, as its handler starts.
    pub(super) fn sample_resume(&self, delivery: &Delivery, restore: Duration) {
        let (Some(_), Some(plugin)) = (&delivery.lane, &self.lanes) else {
            return;
        };
        let waiting = delivery.clock.now().waiting;
        plugin.sample(SwitchPart::Restore, restore);
        plugin.sample(SwitchPart::StartUp, waiting.saturating_sub(restore));
    }
}
