//! The systematic fault search (issue 37): one test per scenario family,
//! each running many seeds against the store doubles with faults (see
//! `spot_worker_testkit::fault_search` and docs/testing.md). A failing
//! seed is printed with its trace and replays alone with
//! `SPOT_WORKER_FAULT_SEED=<seed>`; more seeds with
//! `SPOT_WORKER_FAULT_SEEDS=<n>` or `cargo bench --bench fault_search`.

use spot_worker_testkit::fault_search::scenarios::Family;
use spot_worker_testkit::fault_search::seed_count;

/// Seeds per family under `cargo test` (two threads a core).
const SEEDS: u64 = 2_000;

fn must_hold(family: Family) {
    if let Err(failure) = family.search(0, seed_count(SEEDS)) {
        panic!("{failure}");
    }
}

#[test]
fn chunks() {
    must_hold(Family::Chunks);
}

#[test]
fn restore_race() {
    must_hold(Family::RestoreRace);
}

/// The control: with no answer lost (calls still fail before they apply,
/// wait past the leases, and processes still stop), clean-up never
/// deletes a chunk a stored manifest names, on today's code too. It keeps
/// the harness honest (no false alarms) and guards what already holds.
#[test]
fn chunks_without_lost_answers() {
    must_hold(Family::ChunksWithoutLostAnswers);
}

/// Every family, the lanes' too: a seed's whole trace (every store call,
/// its fault, every step a process took, each at its time on the run's
/// clock) is the same on every run.
#[test]
fn a_seed_replays_exactly() {
    let trace = |family: Family, seed| {
        spot_worker_testkit::fault_search::run_seed(
            family.name(),
            seed,
            family.rates(),
            |plan| async move {
                family.scenario(plan.clone()).await;
                // The whole trace, failing or not.
                plan.broken("the end");
            },
        )
        .unwrap_err()
        .trace
    };
    for family in Family::ALL {
        for seed in 0..10 {
            let first = trace(family, seed);
            assert!(first.len() > 40, "{}: {first:?}", family.name());
            // Every step carries the run's (paused) clock, so the
            // comparison below is of when each step ran, not only of
            // their order; that clock never runs backwards.
            let stamps: Vec<f64> = first
                .iter()
                .map(|step| {
                    let (at, _) = step.trim_start().split_once("s ").unwrap_or_default();
                    at.parse()
                        .unwrap_or_else(|_| panic!("{}: an unstamped step {step:?}", family.name()))
                })
                .collect();
            assert!(
                stamps.windows(2).all(|pair| pair[0] <= pair[1]),
                "{}: {first:?}",
                family.name()
            );
            let again = trace(family, seed);
            if let Some(at) = first.iter().zip(&again).position(|(a, b)| a != b) {
                panic!(
                    "{} seed {seed} replays differently from step {}: {:?} then {:?}",
                    family.name(),
                    at + 1,
                    first[at],
                    again[at]
                );
            }
            assert_eq!(first, again, "{} seed {seed}", family.name());
        }
    }
}

/// The lane keeper's move while a Spot copy runs. Since the library takes
/// the search's clock, a seed's interleaving replays exactly too, and a
/// job's deadline comes nearer as the run goes on. That found seed 905: a
/// move's send to the regular queue landed but lost its answer, the mover
/// cleared its intent, the Spot copy ran, and the regular copy that send
/// left claimed the lane record and ran beside it. A mover whose send
/// failed now leaves its intent, so the next delivery completes the move.
#[test]
fn lanes() {
    must_hold(Family::Lanes);
}

/// A job poisoned on its first run, with the lane keeper moving it: once
/// its poison record is stored it never runs again, whichever step of the
/// poisoning a fault stops.
#[test]
fn poison() {
    must_hold(Family::Poison);
}

/// Two holders of one job writing its large results at once, staged as
/// blocks the way blob storage stages them: a stored result is always
/// one writer's bytes, whole (with the block ids every upload shared
/// before issue 37, it found a mixture within the first seeds).
#[test]
fn results() {
    must_hold(Family::Results);
}
