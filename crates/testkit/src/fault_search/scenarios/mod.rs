//! The scenario families a fault search runs, one per part of the library
//! and the invariants it must keep; each drives real library code under a
//! run's [`FaultPlan`].

pub mod chunks;
pub mod lanes;
pub mod results;

use super::{Failure, FaultPlan, FaultRates, run_seed};

/// One family: a scenario and the faults it runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Two holders saving a job's checkpoint files; every fault.
    Chunks,
    /// The same without lost answers: what holds on today's code.
    ChunksWithoutLostAnswers,
    /// Deliveries that read the checkpoint, then restore later.
    RestoreRace,
    /// A job with a deadline: a Spot worker, a regular worker, the lane
    /// keeper.
    Lanes,
    /// The same, the job failing for good on its first run.
    Poison,
    /// Two holders writing the job's large results at once.
    Results,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 6] = [
        Family::Chunks,
        Family::ChunksWithoutLostAnswers,
        Family::RestoreRace,
        Family::Lanes,
        Family::Poison,
        Family::Results,
    ];

    /// Its name (the test's).
    pub fn name(self) -> &'static str {
        match self {
            Family::Chunks => "chunks",
            Family::ChunksWithoutLostAnswers => "chunks_without_lost_answers",
            Family::RestoreRace => "restore_race",
            Family::Lanes => "lanes",
            Family::Poison => "poison",
            Family::Results => "results",
        }
    }

    /// The faults it runs under.
    pub fn rates(self) -> FaultRates {
        match self {
            Family::ChunksWithoutLostAnswers => FaultRates {
                lose_answer: 0,
                ..FaultRates::default()
            },
            Family::Chunks
            | Family::RestoreRace
            | Family::Lanes
            | Family::Poison
            | Family::Results => FaultRates::default(),
        }
    }

    /// Runs its scenario for `plan`.
    pub async fn scenario(self, plan: FaultPlan) {
        match self {
            Family::Chunks | Family::ChunksWithoutLostAnswers => {
                chunks::run(plan, chunks::Restores::AtOnce).await;
            }
            Family::RestoreRace => chunks::run(plan, chunks::Restores::Racing).await,
            Family::Lanes => lanes::run(plan, lanes::Poison::Never).await,
            Family::Poison => lanes::run(plan, lanes::Poison::FirstRun).await,
            Family::Results => results::run(plan).await,
        }
    }

    /// Runs it once for `seed`.
    pub fn run(self, seed: u64) -> Result<(), Failure> {
        run_seed(self.name(), seed, self.rates(), |plan| self.scenario(plan))
    }

    /// Runs it for `count` seeds from `first` (or the one seed
    /// `SPOT_WORKER_FAULT_SEED` names), on two threads a core; see
    /// [`super::search`].
    pub fn search(self, first: u64, count: u64) -> Result<u64, Box<Failure>> {
        super::search(self.name(), first, count, self.rates(), |plan| {
            self.scenario(plan)
        })
    }

    /// Runs it for `count` seeds from `first` on `threads` threads; see
    /// [`super::search_on`].
    pub fn search_on(self, threads: usize, first: u64, count: u64) -> Result<u64, Box<Failure>> {
        super::search_on(threads, self.name(), first, count, self.rates(), &|plan| {
            self.scenario(plan)
        })
    }
}
