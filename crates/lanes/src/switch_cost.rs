//! The switch cost d as a fleet measures it: each worker samples the four
//! parts where they happen ([`SwitchCost`]), and adds them to one document
//! in the checkpoint store, [`FleetSwitchCost`] (`.spot-worker/fleet/
//! switch-cost`), kept like the fleet's interruption counts: an ETag-fenced
//! read and rewrite of sums and counts, every [`Lanes::recheck`] and once
//! more as the worker stops. The estimate is the decisions crate's
//! ([`switch_cost`]): each part's posterior mean with the seed counting as
//! a few samples.
//!
//! Where each part is measured, on jobs with a deadline only (they are the
//! ones that switch; a backlog of other jobs says nothing about a switch):
//!
//! - **queue wait**: a message's first delivery, from its insertion (the
//!   queue's clock) to the receive (this VM's): after an enqueue or a move,
//!   scale-from-zero included;
//! - **start-up**: a delivery that resumes a job, from its receive to its
//!   handler's start, less the restore;
//! - **restore**: that delivery's read of the job's checkpoint;
//! - **lost work**: at each release, the work done since the last save,
//!   which the next delivery redoes.
//!
//! [`Lanes::recheck`]: super::Lanes::recheck

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spot_worker_decisions::lanes::{SwitchCostParts, SwitchSamples, switch_cost};
use tokio_util::sync::CancellationToken;

use spot_worker_storage::CheckpointStore;
use spot_worker_storage::StorageError;
use spot_worker_storage::{FleetDocument, FleetShare};

/// One worker's view of d: the seed, the fleet's samples as last read, and
/// its own samples not added to the fleet's yet.
#[derive(Debug)]
pub struct SwitchCost {
    seed: SwitchCostParts,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    fleet: SwitchSamples,
    pending: SwitchSamples,
}

/// Which part of d a sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// From release until a worker takes the job.
    QueueWait,
    /// From the receive until the handler starts.
    StartUp,
    /// Reading the checkpoint back.
    Restore,
    /// Work lost by the interruption, done again.
    LostWork,
}

impl SwitchCost {
    /// A worker's view, from `seed` until samples come in.
    pub fn new(seed: SwitchCostParts) -> Self {
        SwitchCost {
            seed,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// d by part: the seed and every sample known here (the fleet's as
    /// last read, and this worker's since).
    pub fn estimate(&self) -> SwitchCostParts {
        let state = self.state();
        switch_cost(&self.seed, &state.fleet.plus(&state.pending))
    }

    /// d: what one switch costs a job.
    pub fn d(&self) -> Duration {
        self.estimate().total()
    }

    /// Records one sample of `part`.
    pub fn sample(&self, part: Part, sample: Duration) {
        let mut state = self.state();
        let samples = match part {
            Part::QueueWait => &mut state.pending.queue_wait,
            Part::StartUp => &mut state.pending.start_up,
            Part::Restore => &mut state.pending.restore,
            Part::LostWork => &mut state.pending.lost_work,
        };
        *samples = samples.with(sample);
    }
}

/// The worker's share of the fleet's samples, which
/// [`FleetSwitchCost::keep`] adds to the fleet's.
impl FleetShare<SwitchSamples> for SwitchCost {
    const READ_FAILED: &'static str = "could not read the fleet's switch cost; estimating from the seed and this worker's samples";
    const ADD_FAILED: &'static str =
        "could not add to the fleet's switch cost; adding with the next";

    fn take_pending(&self) -> SwitchSamples {
        std::mem::take(&mut self.state().pending)
    }

    fn give_back(&self, pending: SwitchSamples) {
        let mut state = self.state();
        state.pending = state.pending.plus(&pending);
    }

    fn set_fleet(&self, fleet: SwitchSamples) {
        self.state().fleet = fleet;
    }
}

/// The fleet's switch-cost samples in a checkpoint store.
#[derive(Clone, Debug)]
pub struct FleetSwitchCost {
    document: FleetDocument<SwitchSamples>,
}

impl FleetSwitchCost {
    /// The checkpoint key the samples are kept under.
    pub const KEY: &'static str = spot_worker_storage::SWITCH_COST_KEY;

    /// The samples in `store`.
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        FleetSwitchCost {
            document: FleetDocument::new(store, Self::KEY, "fleet switch-cost samples"),
        }
    }

    /// The fleet's samples (none if nothing was added yet).
    pub async fn read(&self) -> Result<SwitchSamples, StorageError> {
        self.document.read().await
    }

    /// Adds `delta` and returns the sum.
    pub async fn add(&self, delta: &SwitchSamples) -> Result<SwitchSamples, StorageError> {
        self.document.add_figures(delta).await
    }

    /// Keeps `cost` and the fleet's samples in step until `stop` is
    /// cancelled ([`FleetDocument::keep`]): reads them at once, adds this
    /// worker's new samples every `every` (reading back the sum), and once
    /// more when stopped, within `last_add`. An addition that fails is
    /// logged and given back, to go with the next.
    pub async fn keep(
        &self,
        cost: Arc<SwitchCost>,
        every: Duration,
        stop: CancellationToken,
        last_add: Duration,
    ) {
        self.document.keep(&*cost, every, stop, last_add).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_decisions::lanes::DEFAULT_SWITCH_COST_SEED;
    use spot_worker_storage::memory::InMemoryCheckpointStore;

    #[tokio::test]
    async fn workers_add_their_samples_and_learn_the_fleets() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let fleet = FleetSwitchCost::new(Arc::clone(&store));
        let seed = DEFAULT_SWITCH_COST_SEED;
        let (a, b) = (SwitchCost::new(seed), SwitchCost::new(seed));
        assert_eq!(a.d(), seed.total());
        // Worker a sees 96 queue waits of 10 minutes (a slow scale-from-zero).
        for _ in 0..96 {
            a.sample(Part::QueueWait, Duration::from_secs(600));
        }
        let learned = a.estimate().queue_wait;
        assert_eq!(learned, Duration::from_secs_f64(583.2));
        let pending = a.take_pending();
        fleet.add(&pending).await.unwrap();
        // Worker b, which saw nothing, learns it from the fleet's document.
        b.set_fleet(fleet.read().await.unwrap());
        assert_eq!(b.estimate().queue_wait, learned);
        // Additions from many workers at once all count.
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let fleet = fleet.clone();
            tasks.spawn(async move {
                let mut one = SwitchSamples::default();
                one.lost_work = one.lost_work.with(Duration::from_secs(30));
                fleet.add(&one).await
            });
        }
        while let Some(added) = tasks.join_next().await {
            added.unwrap().unwrap();
        }
        let total = fleet.read().await.unwrap();
        assert_eq!((total.queue_wait.count, total.lost_work.count), (96, 5));
    }

    #[tokio::test(start_paused = true)]
    async fn keeping_adds_every_period_and_once_more_when_stopped() {
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let fleet = FleetSwitchCost::new(store);
        let cost = Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED));
        let stop = CancellationToken::new();
        let every = Duration::from_secs(60);
        let keeper = tokio::spawn({
            let (fleet, cost, stop) = (fleet.clone(), Arc::clone(&cost), stop.clone());
            async move { fleet.keep(cost, every, stop, Duration::from_secs(1)).await }
        });
        cost.sample(Part::Restore, Duration::from_secs(2));
        tokio::time::sleep(every + Duration::from_secs(1)).await;
        assert_eq!(fleet.read().await.unwrap().restore.count, 1);
        cost.sample(Part::StartUp, Duration::from_secs(5));
        stop.cancel();
        keeper.await.unwrap();
        let last = fleet.read().await.unwrap();
        assert_eq!((last.restore.count, last.start_up.count), (1, 1));
        assert!(cost.take_pending().is_empty());
    }
}
