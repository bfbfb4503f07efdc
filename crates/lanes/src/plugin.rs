//! How the lanes plug into the queue consumer: [`Lanes`] is the consumer's
//! [`LanePlugin`] (the claim on a job's lane record before it runs, the
//! move to the other lane, the check of a job running on regular
//! capacity, the lane at a release, the tombstone of a poisoned job, the
//! samples of d), and [`FinishRecords`] the [`LaneFinish`] of a worker that
//! serves no lane. The consumer keeps its own steps (deleting, counting,
//! the attempt record); these keep the lanes'.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use spot_worker_consumer::{
    Claim, LaneFinish, LaneJob, LaneMove, LanePlugin, MoveSettings, SwitchPart,
};
use spot_worker_decisions::lanes::{Deadline, Lane, Phase, Reason};
use spot_worker_envelope::Carried;
use spot_worker_storage::{
    CheckpointStore, MessageEncoding, SaveClock, StorageError, store_unreachable,
};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::mover::{MoveJob, Moved};
use super::record::{Arrival, LaneRecord, LaneRecords, ReadRecord, arrival};
use super::spot_capacity::waits_for_spot;
use super::switch_cost::Part;
use super::{Lanes, progress_of};

#[async_trait]
impl LaneFinish for Lanes {
    async fn finish(
        &self,
        store: &Arc<dyn CheckpointStore>,
        key: &str,
    ) -> Result<(), StorageError> {
        FinishRecords.finish(store, key).await
    }
}

/// Marks the lane record of a job that finishes on a worker without lanes
/// (a copy a worker with lanes left behind is then discarded unrun): the
/// consumer's [`LaneFinish`] there, as [`Lanes`] is on a worker with lanes.
#[derive(Clone, Copy, Debug, Default)]
pub struct FinishRecords;

#[async_trait]
impl LaneFinish for FinishRecords {
    async fn finish(
        &self,
        store: &Arc<dyn CheckpointStore>,
        key: &str,
    ) -> Result<(), StorageError> {
        LaneRecords::new(Arc::clone(store)).finish(key).await
    }
}

#[async_trait]
impl LanePlugin for Lanes {
    fn lane(&self) -> Lane {
        self.lane
    }

    async fn took_probe(&self) -> Result<(), StorageError> {
        self.spot_capacity.took_probe().await
    }

    async fn claim(&self, store: &Arc<dyn CheckpointStore>, job: &LaneJob<'_>) -> Claim {
        let records = LaneRecords::new(Arc::clone(store));
        let envelope = job.envelope;
        let read = match records.read_fenced(job.key).await {
            Ok(read) => read,
            Err(error) if store_unreachable(&error) => return Claim::StoreDown(error),
            Err(error) => {
                tracing::error!(%error, "the job's lane record does not read; running it without the record's check");
                return Claim::Run;
            }
        };
        let verdict = arrival(
            read.record.as_ref(),
            envelope.generation,
            job.message.as_str(),
            envelope.moved_from.as_deref(),
        );
        match verdict {
            Arrival::Run | Arrival::Claim => {
                let claim = match (&verdict, &read.record) {
                    // A redelivery of the live message claims it again, as
                    // this receive: a mover that read the record before
                    // (its hold ran out) then fails to write its intent,
                    // and one that reads it after sees this receive and
                    // moves nothing.
                    (Arrival::Run, Some(record)) => {
                        if record.held > job.held {
                            return Claim::LaterReceive;
                        }
                        LaneRecord {
                            held: job.held,
                            updated_at: OffsetDateTime::now_utc(),
                            ..record.clone()
                        }
                    }
                    _ => LaneRecord::claimed_by(
                        job.message.as_str(),
                        envelope,
                        self.lane,
                        job.held,
                        read.record.as_ref(),
                    ),
                };
                match records.write(job.key, &read, &claim).await {
                    Ok(etag) => {
                        job.memo.set(ReadRecord {
                            record: Some(claim),
                            etag: Some(etag),
                        });
                        Claim::Run
                    }
                    Err(StorageError::Conflict { .. }) => Claim::Conflict,
                    Err(error) if store_unreachable(&error) => Claim::StoreDown(error),
                    Err(error) => {
                        tracing::error!(%error, "the job's lane record cannot be written; running it without the record's check");
                        Claim::Run
                    }
                }
            }
            Arrival::Poisoning => Claim::Poisoning,
            Arrival::Stale => Claim::Stale {
                poisoned: read.record.as_ref().is_some_and(|r| r.poisoned),
            },
            Arrival::CompleteMove(to) => {
                tracing::info!(
                    to = to.as_str(),
                    "a move of this job was begun and not finished; finishing it"
                );
                job.memo.set(read);
                Claim::CompleteMove(to)
            }
        }
    }

    async fn move_job(
        &self,
        store: &Arc<dyn CheckpointStore>,
        how: MoveSettings,
        job: &LaneJob<'_>,
        to: Lane,
        carried: Carried,
    ) -> LaneMove {
        let records = LaneRecords::new(Arc::clone(store));
        let read = match job.memo.take::<ReadRecord>() {
            Some(read) => read,
            None => match records.read_fenced(job.key).await {
                Ok(read) => read,
                Err(error) => {
                    tracing::warn!(%error, "could not read the job's lane record; it stays in this lane");
                    return LaneMove::Stayed;
                }
            },
        };
        let moving = MoveJob {
            key: job.key,
            message: job.message,
            held: job.held,
            envelope: job.envelope,
            body: job.body,
            from: self.lane,
            to,
            carried,
        };
        let sent = tokio::time::timeout(
            how.settle_timeout,
            Lanes::send_moved(self, &records, how.encoding, &moving, read),
        )
        .await
        .unwrap_or_else(|_| Moved::NotSent("it took longer than the settle timeout".into()));
        match sent {
            Moved::Sent(id) => {
                tracing::info!(to = to.as_str(), new_message = %id, "the job moved to the {} lane", to.as_str());
                LaneMove::Moved
            }
            Moved::Stale => LaneMove::Superseded,
            Moved::NotSent(reason) => {
                tracing::warn!(%reason, "the job could not move to the {} lane; it stays in this one", to.as_str());
                LaneMove::Stayed
            }
        }
    }

    fn watch_running(
        &self,
        deadline: Deadline,
        clock: Arc<SaveClock>,
        token: CancellationToken,
        encoding: MessageEncoding,
    ) -> Option<BoxFuture<'static, Option<(Lane, Reason)>>> {
        if self.lane != Lane::Regular {
            // A job running on Spot is never moved.
            return None;
        }
        let lanes = self.clone();
        Some(Box::pin(async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => return None,
                    () = tokio::time::sleep(lanes.recheck) => {}
                }
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
                    return Some((Lane::Spot, choice.reason));
                }
            }
        }))
    }

    fn lane_at_release(&self, deadline: Deadline, clock: &SaveClock) -> Lane {
        let progress = progress_of(
            &deadline,
            clock.saved_progress(),
            Some(&clock.saved_ledger()),
        );
        let choice = self.choose(deadline, progress, self.lane, Phase::Released);
        let slack = choice.standing.map(|s| s.slack_secs());
        tracing::info!(lane = choice.lane.as_str(), reason = choice.reason.as_str(), slack_s = ?slack, "the lane rule at the release");
        choice.lane
    }

    async fn poison(
        &self,
        store: &Arc<dyn CheckpointStore>,
        job: &LaneJob<'_>,
    ) -> Result<bool, StorageError> {
        LaneRecords::new(Arc::clone(store))
            .poison(
                job.key,
                job.message.as_str(),
                job.envelope,
                self.lane,
                job.held,
            )
            .await
    }

    fn sample(&self, part: SwitchPart, took: Duration) {
        let part = match part {
            SwitchPart::QueueWait => Part::QueueWait,
            SwitchPart::StartUp => Part::StartUp,
            SwitchPart::Restore => Part::Restore,
            SwitchPart::LostWork => Part::LostWork,
        };
        self.switch_cost.sample(part, took);
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use spot_worker_consumer::LaneMemo;
    use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, LanePolicy};
    use spot_worker_envelope::Envelope;
    use spot_worker_storage::{InMemoryCheckpointStore, InMemoryQueue, MessageId};

    use super::*;
    use crate::{FleetSpotCapacity, SpotCapacity, SwitchCost};

    fn lanes(store: &Arc<dyn CheckpointStore>, regular: &InMemoryQueue) -> Lanes {
        Lanes {
            lane: Lane::Spot,
            spot: Arc::new(InMemoryQueue::new("jobs")),
            regular: Arc::new(regular.clone()),
            recheck: Duration::from_secs(1),
            switch_cost: Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED)),
            spot_capacity: Arc::new(SpotCapacity::new(
                FleetSpotCapacity::new(Arc::clone(store)),
                Duration::from_secs(1),
            )),
            policy: LanePolicy::default(),
            price_ratio: 3.0,
        }
    }

    fn envelope() -> Envelope {
        let start = SystemTime::now();
        Envelope::new(Deadline {
            start,
            due: start + Duration::from_secs(3600),
            work: Duration::from_secs(600),
        })
    }

    /// The view of a delivery of `message` (its receive `held`) the
    /// consumer would give.
    fn job<'a>(
        message: &'a MessageId,
        held: u32,
        envelope: &'a Envelope,
        memo: &'a LaneMemo,
    ) -> LaneJob<'a> {
        LaneJob {
            key: "j1",
            message,
            held,
            envelope,
            body: b"body",
            memo,
        }
    }

    #[tokio::test]
    async fn the_lanes_answer_each_arrival_by_the_jobs_lane_record() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let regular = InMemoryQueue::new("jobs-regular");
        let lanes = lanes(&store, &regular);
        let envelope = envelope();
        let (m1, m2) = (MessageId::new("m1"), MessageId::new("m2"));
        let memo = LaneMemo::default();

        // A first arrival claims the job and keeps the record it wrote.
        let claim = lanes.claim(&store, &job(&m1, 2, &envelope, &memo)).await;
        assert!(matches!(claim, Claim::Run), "{claim:?}");
        let kept = memo.take::<ReadRecord>().expect("the claim is kept");
        let record = kept.record.expect("a record");
        assert_eq!((record.message.as_str(), record.held), ("m1", 2));
        assert!(kept.etag.is_some());

        // An earlier receive of the same message lost the job to this one.
        let claim = lanes.claim(&store, &job(&m1, 1, &envelope, &memo)).await;
        assert!(matches!(claim, Claim::LaterReceive), "{claim:?}");

        // Moved to the regular lane: the new message carries the body on;
        // the held one, if its delete did not land, completes the move
        // rather than run.
        assert!(matches!(
            lanes.claim(&store, &job(&m1, 2, &envelope, &memo)).await,
            Claim::Run
        ));
        let how = MoveSettings {
            encoding: MessageEncoding::Text,
            settle_timeout: Duration::from_secs(5),
        };
        let moved = lanes
            .move_job(
                &store,
                how,
                &job(&m1, 2, &envelope, &memo),
                Lane::Regular,
                Carried::default(),
            )
            .await;
        assert_eq!(moved, LaneMove::Moved);
        let sent = regular.messages();
        assert_eq!(sent.len(), 1);
        let (carried, body) = Envelope::unwrap(sent[0].body.as_bytes()).unwrap();
        let carried = carried.expect("an envelope");
        assert_eq!((carried.generation, body), (1, &b"body"[..]));
        assert_eq!(carried.moved_from.as_deref(), Some("m1"));
        let claim = lanes.claim(&store, &job(&m1, 3, &envelope, &memo)).await;
        assert!(
            matches!(claim, Claim::CompleteMove(Lane::Regular)),
            "{claim:?}"
        );
        assert!(
            memo.take::<ReadRecord>().is_some(),
            "the move's record is kept"
        );

        // A job finished: every copy of it is stale.
        lanes.finish(&store, "j1").await.unwrap();
        let claim = lanes.claim(&store, &job(&m1, 4, &envelope, &memo)).await;
        assert!(
            matches!(claim, Claim::Stale { poisoned: false }),
            "{claim:?}"
        );

        // A job asked for anew, then poisoned: its live message finishes
        // the poisoning, never runs.
        assert!(matches!(
            lanes.claim(&store, &job(&m2, 1, &envelope, &memo)).await,
            Claim::Run
        ));
        assert!(
            lanes
                .poison(&store, &job(&m2, 1, &envelope, &memo))
                .await
                .unwrap()
        );
        let claim = lanes.claim(&store, &job(&m2, 2, &envelope, &memo)).await;
        assert!(matches!(claim, Claim::Poisoning), "{claim:?}");
    }

    #[test]
    fn only_a_regular_worker_watches_a_running_job() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let spot = lanes(&store, &InMemoryQueue::new("jobs-regular"));
        let regular = Lanes {
            lane: Lane::Regular,
            ..spot.clone()
        };
        let watch = |lanes: &Lanes| {
            lanes
                .watch_running(
                    envelope().deadline,
                    Arc::new(SaveClock::new(tokio::time::Instant::now())),
                    CancellationToken::new(),
                    MessageEncoding::Text,
                )
                .is_some()
        };
        assert!(!watch(&spot), "a job running on Spot is never moved");
        assert!(watch(&regular));
    }
}
