//! A systematic fault search, in the spirit of FoundationDB's simulation
//! tests and Jepsen: the library's real code (checkpoint handles, their
//! chunk clean-up, the consumer, the lane keeper, result writes) runs
//! against the in-memory store doubles wrapped in [`Faulty`], where any
//! call may fail before it applies, apply and lose its answer, or wait
//! past a hold; processes stop at any point. A [`FaultPlan`] seeded per
//! run makes every one of those choices, and checks the invariants after
//! every step, so a failing seed replays exactly (`SPOT_WORKER_FAULT_SEED`)
//! and prints the steps that led to it.
//!
//! The scenario families are in [`scenarios`]; docs/testing.md says what
//! each checks and how to replay a seed.
//!
//! ```
//! use spot_worker_testkit::fault_search::{FaultRates, run_seed};
//!
//! // A scenario that breaks its invariant on some seeds only.
//! let outcome = |seed| {
//!     run_seed("demo", seed, FaultRates::default(), |plan| async move {
//!         if plan.chance(50) {
//!             plan.broken("the coin came up heads");
//!         }
//!     })
//! };
//! let failing = (0..20).find(|&seed| outcome(seed).is_err()).unwrap();
//! // The same seed fails the same way every time.
//! assert_eq!(outcome(failing).unwrap_err().trace, outcome(failing).unwrap_err().trace);
//! ```

mod clock;
mod invariants;
mod layer;
mod plan;
pub mod scenarios;

use std::fmt;
use std::future::Future;

pub use clock::{PlanClock, run_start};
pub use invariants::{ManifestChunksExist, manifest_chunks_exist, named_chunks};
pub use layer::Faulty;
pub use plan::{Check, Fault, FaultPlan, FaultRates};

/// The environment variable that replays one seed: the search runs that
/// seed alone and prints its trace.
pub const SEED_VAR: &str = "SPOT_WORKER_FAULT_SEED";
/// The environment variable that sets how many seeds a search runs.
pub const SEEDS_VAR: &str = "SPOT_WORKER_FAULT_SEEDS";

/// A seed that broke an invariant: what broke, and every step of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The scenario family.
    pub family: String,
    /// The seed.
    pub seed: u64,
    /// The first invariant broken, and the step after which it was.
    pub broken: String,
    /// Every step of the run, in order.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault search {}: seed {} broke an invariant: {}",
            self.family, self.seed, self.broken
        )?;
        writeln!(
            f,
            "replay: {SEED_VAR}={} cargo test -p spot-worker-storage --test it fault_search::{} -- --include-ignored",
            self.seed, self.family
        )?;
        for (i, step) in self.trace.iter().enumerate() {
            writeln!(f, "{:>5} {step}", i + 1)?;
        }
        Ok(())
    }
}

/// Runs `scenario` once for `seed` on a current-thread runtime with tokio's
/// clock paused (so every wait is decided by the plan, not by the
/// machine), then lets what it spawned finish; `Err` if an invariant broke.
pub fn run_seed<F, Fut>(
    family: &str,
    seed: u64,
    rates: FaultRates,
    scenario: F,
) -> Result<(), Failure>
where
    F: FnOnce(FaultPlan) -> Fut,
    Fut: Future<Output = ()>,
{
    let plan = FaultPlan::new(seed, rates);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            return Err(Failure {
                family: family.to_owned(),
                seed,
                broken: format!("no runtime: {error}"),
                trace: Vec::new(),
            });
        }
    };
    runtime.block_on(scenario(plan.clone()));
    drop(runtime);
    match plan.first_broken() {
        None => Ok(()),
        Some(broken) => Err(Failure {
            family: family.to_owned(),
            seed,
            broken,
            trace: plan.trace(),
        }),
    }
}

/// How many seeds a search runs: `SPOT_WORKER_FAULT_SEEDS` if set, else
/// `default`.
pub fn seed_count(default: u64) -> u64 {
    std::env::var(SEEDS_VAR)
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(default)
}

/// The seed to replay alone, if `SPOT_WORKER_FAULT_SEED` names one.
pub fn replay_seed() -> Option<u64> {
    std::env::var(SEED_VAR).ok()?.parse().ok()
}

/// Runs `scenario` for seeds `first..first + count` (or the one seed
/// `SPOT_WORKER_FAULT_SEED` names, its trace printed), on
/// [`search_threads`] threads (each seed on a runtime of its own, so a
/// seed's run is the same on any thread), stopping at the first seed that
/// breaks an invariant; returns how many seeds ran.
///
/// The failure reported is the lowest failing seed, whatever the threads'
/// timing: seeds are handed out in order and every seed below it ran.
pub fn search<F, Fut>(
    family: &str,
    first: u64,
    count: u64,
    rates: FaultRates,
    scenario: F,
) -> Result<u64, Box<Failure>>
where
    F: Fn(FaultPlan) -> Fut + Sync,
    Fut: Future<Output = ()>,
{
    if let Some(seed) = replay_seed() {
        let outcome = run_seed(family, seed, rates, &scenario);
        return match outcome {
            Ok(()) => Ok(1),
            Err(failure) => Err(Box::new(failure)),
        };
    }
    search_on(search_threads(), family, first, count, rates, &scenario)
}

/// How many threads [`search`] runs seeds on: two a core. A seed's thread
/// waits while the blocking threads its runtime hands file work to run
/// (the `chunks` families do hundreds of such hand-offs a seed), and a
/// second seed a core runs in those waits: a quarter less wall time for
/// `chunks` on 2 cores, no seed's outcome changed (each has its runtime).
pub fn search_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from) * 2
}

/// [`search`] on `threads` threads (1: one seed after another).
pub fn search_on<F, Fut>(
    threads: usize,
    family: &str,
    first: u64,
    count: u64,
    rates: FaultRates,
    scenario: &F,
) -> Result<u64, Box<Failure>>
where
    F: Fn(FaultPlan) -> Fut + Sync,
    Fut: Future<Output = ()>,
{
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    let end = first.saturating_add(count);
    let next = AtomicU64::new(first);
    let lowest: Mutex<Option<Failure>> = Mutex::new(None);
    let below_failure = |seed: u64| {
        let lowest = lowest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lowest.as_ref().is_none_or(|failure| seed < failure.seed)
    };
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= end || !below_failure(seed) {
                        return;
                    }
                    if let Err(failure) = run_seed(family, seed, rates, scenario) {
                        let mut lowest = lowest
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if lowest
                            .as_ref()
                            .is_none_or(|known| failure.seed < known.seed)
                        {
                            *lowest = Some(failure);
                        }
                    }
                }
            });
        }
    });
    match lowest
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        None => Ok(count),
        Some(failure) => Err(Box::new(failure)),
    }
}
