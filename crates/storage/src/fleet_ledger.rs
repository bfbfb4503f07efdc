//! [`FleetLedger`]: a fleet's [`InterruptionCounts`], kept in the
//! checkpoint store beside the checkpoints so that every worker estimates
//! from the same history.
//!
//! The counts are per queue: the workers of one queue run one kind of job,
//! and what the counts learn is partly the job's (whether it saves at the
//! notice, how often it crashes, how long it runs), so two queues sharing
//! a checkpoint container keep apart. They live under
//! [`FleetLedger::PREFIX`] and the queue's name as an in-progress checkpoint
//! whose progress is the counts. A worker adds what it saw since its last
//! addition with an ETag-fenced read and rewrite, like every checkpoint
//! write; a conflict (another worker added at the same moment) is read
//! again and retried, so no addition is lost or counted twice: it is a
//! [`FleetDocument`], like the lanes' switch cost. The counts
//! only grow: summing is the whole merge.
//!
//! Cost: one read and one write per addition. A worker adds once per
//! [`FLUSH_EVERY`](spot_worker_decisions::cadence::FLUSH_EVERY) (and once
//! when it stops), and reads once when it starts: about 2 requests per
//! worker-hour, plus a read and a write more for each conflict. A worker
//! busy with one job renewing its lease every 10 s already makes 360 an
//! hour, so this stays under 0.6 %.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_decisions::cadence::{CheckpointCadence, InterruptionCounts};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::CheckpointStore;
use crate::error::StorageError;
use crate::fleet_document::FleetDocument;

/// One queue's fleet counts in a checkpoint store.
#[derive(Clone, Debug)]
pub struct FleetLedger {
    document: FleetDocument<InterruptionCounts>,
}

impl FleetLedger {
    /// Where every queue's counts are kept: the checkpoint key of a
    /// queue's is this and the queue's name
    /// (`.spot-worker/fleet/queues/jobs`). Before they were per queue,
    /// one document (`.spot-worker/fleet/interruptions`) counted every
    /// drain in time as saved at the notice; it is no longer read.
    pub const PREFIX: &'static str = ".spot-worker/fleet/queues/";

    /// The ledger of `queue`'s fleet in `store`.
    pub fn for_queue(store: Arc<dyn CheckpointStore>, queue: &str) -> Self {
        FleetLedger {
            document: FleetDocument::under(
                store,
                Cow::Owned(Self::key_of(queue)),
                "fleet interruption counts",
            ),
        }
    }

    /// The checkpoint key of `queue`'s counts.
    pub fn key_of(queue: &str) -> String {
        format!("{}{queue}", Self::PREFIX)
    }

    /// The checkpoint key this ledger's counts are kept under.
    pub fn key(&self) -> &str {
        self.document.key()
    }

    /// The fleet's counts (all zero if nothing was added yet).
    pub async fn read(&self) -> Result<InterruptionCounts, StorageError> {
        self.document.read().await
    }

    /// Adds `delta` to the fleet's counts and returns the sum, retrying
    /// after a concurrent addition. Adding nothing is a read.
    pub async fn add(
        &self,
        delta: &InterruptionCounts,
    ) -> Result<InterruptionCounts, StorageError> {
        self.document.add_figures(delta).await
    }

    /// Keeps `cadence` and the fleet's counts in step until `stop` is
    /// cancelled ([`FleetDocument::keep`]): reads the counts at once, adds
    /// what `cadence` saw every `every`, the job time of the deliveries
    /// still running included (reading back the sum; with nothing to add,
    /// only reading), and adds once more when stopped if there is anything
    /// left, within `last_add` (a worker that stops after a drain has
    /// little time left). An addition that fails is logged and given back
    /// to `cadence`, to go with the next; nothing is counted twice, and the
    /// estimates meanwhile include what was not added yet.
    pub async fn keep(
        &self,
        cadence: Arc<CheckpointCadence>,
        every: Duration,
        stop: CancellationToken,
        last_add: Duration,
    ) {
        self.document.keep(&*cadence, every, stop, last_add).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, WritePrecondition};
    use crate::memory::InMemoryCheckpointStore;
    use spot_worker_decisions::cadence::{FLUSH_EVERY, Interruption, IntervalSource};

    /// A fresh adaptive cadence kept in step with `ledger` every
    /// [`FLUSH_EVERY`] until the token is cancelled.
    fn keeping(
        ledger: &FleetLedger,
    ) -> (
        Arc<CheckpointCadence>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
            seed_evictions_per_hour: 0.1,
        }));
        let stop = CancellationToken::new();
        let keeper = tokio::spawn({
            let (ledger, cadence, stop) = (ledger.clone(), cadence.clone(), stop.clone());
            async move {
                ledger
                    .keep(cadence, FLUSH_EVERY, stop, Duration::from_secs(1))
                    .await;
            }
        });
        (cadence, stop, keeper)
    }

    #[tokio::test]
    async fn additions_from_many_workers_at_once_all_count() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let ledger = FleetLedger::for_queue(store, "jobs");
        assert!(ledger.read().await.unwrap().is_empty());
        let one = InterruptionCounts {
            drained: 1,
            late: 0,
            no_outcome: 1,
            job_seconds: 1800.0,
            ..InterruptionCounts::default()
        };
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let ledger = ledger.clone();
            tasks.spawn(async move { ledger.add(&one).await });
        }
        while let Some(added) = tasks.join_next().await {
            added.unwrap().unwrap();
        }
        let total = ledger.read().await.unwrap();
        assert_eq!((total.drained, total.no_outcome), (6, 6));
        assert_eq!(total.job_hours(), 3.0);
        // Adding nothing reads.
        assert_eq!(
            ledger.add(&InterruptionCounts::default()).await.unwrap(),
            total
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keeping_adds_every_period_and_once_more_when_stopped() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let ledger = FleetLedger::for_queue(store, "jobs");
        // Another worker's history is there already.
        ledger
            .add(&InterruptionCounts {
                drained: 5,
                job_seconds: 3600.0,
                ..InterruptionCounts::default()
            })
            .await
            .unwrap();
        let (cadence, stop, keeper) = keeping(&ledger);
        // Read at once: the estimates include the fleet's history.
        for _ in 0..100 {
            if cadence.view().counts.drained == 5 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(cadence.view().counts.drained, 5);
        cadence.note(Interruption::NoOutcome);
        cadence.add_job_time(Duration::from_secs(1800));
        tokio::time::sleep(FLUSH_EVERY + Duration::from_secs(1)).await;
        let after_one_period = ledger.read().await.unwrap();
        assert_eq!(after_one_period.no_outcome, 1);
        assert_eq!(after_one_period.job_seconds, 5400.0);
        // Stopping adds what is left.
        cadence.note(Interruption::Late);
        stop.cancel();
        keeper.await.unwrap();
        let last = ledger.read().await.unwrap();
        assert_eq!((last.drained, last.late, last.no_outcome), (5, 1, 1));
        assert!(cadence.take_pending().is_empty());
    }

    #[tokio::test]
    async fn each_queue_keeps_its_own_counts() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let (saving, dying) = (
            FleetLedger::for_queue(store.clone(), "renders"),
            FleetLedger::for_queue(store.clone(), "training"),
        );
        assert_eq!(saving.key(), ".spot-worker/fleet/queues/renders");
        let mut saved = InterruptionCounts::default();
        saved.count(Interruption::Drained);
        let mut lost = InterruptionCounts::default();
        lost.count(Interruption::Unsaved);
        lost.count_loss(Duration::from_secs(2));
        lost.job_lengths.add(Duration::from_secs(3600));
        saving.add(&saved).await.unwrap();
        dying.add(&lost).await.unwrap();
        dying.add(&lost).await.unwrap();
        assert_eq!(saving.read().await.unwrap(), saved);
        let read = dying.read().await.unwrap();
        assert_eq!((read.drained, read.unsaved, read.losses), (0, 2, 2));
        assert_eq!(read.lost_seconds, 4.0);
        assert_eq!(read.job_lengths.jobs(), 2);
    }

    #[tokio::test]
    async fn a_completed_checkpoint_under_the_key_is_reported_not_overwritten() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        store
            .write(
                &FleetLedger::key_of("jobs"),
                &Checkpoint::Completed {
                    result: serde_json::json!(1),
                },
                WritePrecondition::Create,
                None,
            )
            .await
            .unwrap();
        let ledger = FleetLedger::for_queue(store.clone(), "jobs");
        let err = ledger
            .add(&InterruptionCounts::default())
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::InvalidData { .. }), "{err:?}");
    }

    /// A job that runs for hours reaches the fleet's job time at every
    /// addition, not only when it ends; so a crash loses at most the time
    /// since the last one.
    #[tokio::test(start_paused = true)]
    async fn a_running_jobs_time_reaches_the_fleet_at_each_addition() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let ledger = FleetLedger::for_queue(store, "jobs");
        let (cadence, stop, keeper) = keeping(&ledger);
        tokio::task::yield_now().await;
        let job = cadence.running_job();
        tokio::time::sleep(FLUSH_EVERY * 2 + FLUSH_EVERY / 2).await;
        // Two additions while it runs: two hours, less the moment between
        // the keeper's start and the job's.
        let fleet = ledger.read().await.unwrap();
        assert!(
            (fleet.job_hours() - 2.0).abs() < 0.001,
            "{:?}",
            fleet.job_seconds
        );
        drop(job);
        stop.cancel();
        keeper.await.unwrap();
        // The last half hour is added as the worker stops.
        let last = ledger.read().await.unwrap();
        assert!((last.job_hours() - 2.5).abs() < 0.001, "{last:?}");
    }
}
