//! The smoke run (`cargo test --all-targets`): small synthetic traces,
//! and assertions that fail when the model, a policy or the optimum is
//! wrong.

use crate::model::{Job, simulate};
use crate::optimum::{exhaustive, optimum};
use crate::policies::UniformProgress;
use crate::report::{beats_optimum, run_all};
use crate::trace::Trace;

/// A deterministic pseudo-random availability pattern (xorshift), with
/// runs of Spot and outages of a few ticks each.
fn pattern(seed: u64, ticks: usize, mean_run: u64) -> Vec<bool> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(ticks);
    let mut available = next() % 2 == 0;
    while out.len() < ticks {
        let run = 1 + next() % (2 * mean_run);
        out.extend(std::iter::repeat_n(available, run as usize));
        available = !available;
    }
    out.truncate(ticks);
    out
}

pub fn run() {
    the_optimum_is_exact_on_small_windows();
    no_policy_is_late_or_beats_the_optimum();
}

/// The dynamic programme's shortcuts lose nothing: on windows of 11 ticks
/// it finds what trying all 3^11 schedules finds, with d shorter and
/// longer than a tick.
fn the_optimum_is_exact_on_small_windows() {
    let gap = 600.0;
    let mut compared = 0;
    for seed in 0..12 {
        let trace = Trace::synthetic("random", gap, &pattern(seed, 40, 2));
        for (work, overhead) in [(0.9, 180.0), (0.9, 720.0), (1.3, 420.0)] {
            let job = Job {
                work: work * 3600.0,
                deadline: 1.8 * 3600.0,
                overhead,
                price_ratio: 3.0,
            };
            for start in [0, 7, 19] {
                let window = trace.from(start);
                let fast = optimum(window, &job, f64::INFINITY);
                let slow = exhaustive(window, &job);
                match (fast, slow) {
                    (Some(a), Some(b)) => assert!(
                        (a - b).abs() < 1e-9,
                        "seed {seed}, work {work} h, d {overhead} s, start {start}: dynamic programme {a}, exhaustive {b}"
                    ),
                    (a, b) => assert_eq!(
                        a.is_some(),
                        b.is_some(),
                        "seed {seed}, start {start}: {a:?} vs {b:?}"
                    ),
                }
                compared += 1;
            }
        }
    }
    println!("deadlines: the optimum equals an exhaustive search on {compared} small windows");
}

/// On a synthetic trace with outages of minutes to hours: no policy
/// (Uniform Progress included) misses a deadline, none meets one for less
/// than the optimum, and on-demand costs (W + d)·k exactly on every start.
fn no_policy_is_late_or_beats_the_optimum() {
    let trace = Trace::synthetic("synthetic", 300.0, &pattern(7, 2_000, 12));
    let starts = trace.starts(40);
    for (deadline, overhead) in [(10.0, 0.05), (10.0, 0.2), (14.0, 0.2)] {
        let job = Job {
            work: 8.0 * 3600.0,
            deadline: deadline * 3600.0,
            overhead: overhead * 3600.0,
            price_ratio: 3.0,
        };
        let all = run_all(&trace, &job, &starts, &mut crate::policies());
        let optimum = all.last().expect("the optimum is last");
        assert_eq!(optimum.policy, "optimum");
        assert_eq!(
            optimum.missed(),
            0,
            "D {deadline} h: the optimum found no schedule"
        );
        for runs in &all {
            // Every policy keeps the safety net, so none may be late.
            assert_eq!(
                runs.missed(),
                0,
                "{} missed a deadline (D {deadline} h, d {overhead} h)",
                runs.policy
            );
            assert_eq!(
                beats_optimum(runs, optimum),
                0,
                "{} beat the optimum (D {deadline} h, d {overhead} h)",
                runs.policy
            );
        }
        // On regular capacity only, every start costs exactly (W + d)·k.
        let expected = (job.work + job.overhead) / 3600.0 * job.price_ratio;
        let on_demand = all
            .iter()
            .find(|r| r.policy == "on-demand")
            .expect("on-demand runs");
        for (start, outcome) in starts.iter().zip(&on_demand.outcomes) {
            assert!(
                (outcome.cost - expected).abs() < 1e-9 && !outcome.missed,
                "start {start}: on-demand cost {} ≠ (W + d)·k = {expected}",
                outcome.cost
            );
        }
        let up = simulate(
            trace.from(0),
            &job,
            &mut UniformProgress { sees_spot: true },
        );
        assert!(
            up.spot_hours > 0.0 && up.regular_hours > 0.0,
            "this trace makes Uniform Progress use both lanes: {up:?}"
        );
    }
    println!(
        "deadlines: on 3 × 40 synthetic starts no policy missed a deadline or beat the optimum; on-demand = (W + d)·k on each"
    );
}
