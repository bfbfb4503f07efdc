//! The omniscient optimum: the least a job can cost on a trace when the
//! whole future of the trace is known, by dynamic programming over its
//! ticks. Like the policies, it switches only at tick boundaries, pays d
//! at every start and the price of the VM it holds by the second; the job
//! may end within a tick.
//!
//! The state after each tick is the mode of that tick (idle, Spot,
//! regular) and, per mode, the Pareto front of (cost so far, progress so
//! far): a history that cost more and did less is dropped, since from the
//! same tick and mode every continuation open to one is open to the other.
//! Progress is counted as running time less d at each start (so a start
//! is charged at once; exact for every segment that runs past its d, and
//! a segment cut before its d only looks worse than it is, which never
//! hides an optimum: leaving it out costs less and loses nothing).
//!
//! Only schedules of the form an optimal one can be brought to are
//! explored (exchange arguments, checked against an exhaustive search in
//! the smoke run):
//! - a Spot segment starts where a run of availability starts and lasts
//!   until the run ends or the job does (stopping it early and doing the
//!   same work later costs at least as much);
//! - a regular segment starts at the job's start or where a Spot segment
//!   is evicted (one placed later in an idle stretch can slide back to its
//!   beginning, at the same cost), and ends at any tick.
//!
//! A state that can no longer finish by the deadline, or that costs,
//! with its work left at the Spot price, more than the best found (or
//! than `bound`, a cost known to be reachable), is dropped.

use crate::model::Job;
use crate::trace::Window;

/// (cost so far in Spot-seconds, progress so far in seconds).
type Front = Vec<(f64, f64)>;

/// The least cost in Spot-hours for `job` on `window`, if it can meet its
/// deadline at all; `bound` is a cost in Spot-hours no less than the
/// optimum (e.g. on-demand's), or infinity.
pub fn optimum(window: Window<'_>, job: &Job, bound: f64) -> Option<f64> {
    let (gap, work, d, k) = (window.gap(), job.work, job.overhead, job.price_ratio);
    let mut best: Option<f64> = None;
    let limit = |best: Option<f64>| best.unwrap_or(f64::INFINITY).min(bound * 3600.0) + 1e-6;
    let (mut idle, mut spot, mut regular): (Front, Front, Front) =
        (vec![(0.0, 0.0)], vec![], vec![]);
    let mut tick = 0usize;
    while (tick as f64) * gap < job.deadline
        && !(idle.is_empty() && spot.is_empty() && regular.is_empty())
    {
        let begin = tick as f64 * gap;
        // The part of this tick before the deadline.
        let span = gap.min(job.deadline - begin);
        let available = window.at(tick);
        let run_starts = available && (tick == 0 || !window.at(tick - 1));
        let (mut next_idle, mut next_spot, mut next_regular) = (Vec::new(), Vec::new(), Vec::new());
        // One tick in a mode from (cost, progress): ends the job within the
        // span (a candidate), or goes on to the next tick.
        let mut advance =
            |(cost, progress): (f64, f64), price: f64, start: bool, into: &mut Front| {
                let progress = if start { progress - d } else { progress };
                if progress + span >= work {
                    let total = cost + price * (work - progress);
                    if total < best.unwrap_or(f64::INFINITY) {
                        best = Some(total);
                    }
                } else if span == gap {
                    into.push((cost + price * gap, progress + gap));
                }
            };
        for &state in &idle {
            next_idle.push(state);
            if run_starts {
                advance(state, 1.0, true, &mut next_spot);
            }
            if tick == 0 {
                advance(state, k, true, &mut next_regular);
            }
        }
        for &state in &spot {
            if available {
                advance(state, 1.0, false, &mut next_spot);
            } else {
                next_idle.push(state);
                advance(state, k, true, &mut next_regular);
            }
        }
        for &state in &regular {
            advance(state, k, false, &mut next_regular);
            next_idle.push(state);
            if run_starts {
                advance(state, 1.0, true, &mut next_spot);
            }
        }
        let left = job.deadline - (begin + gap);
        let cap = limit(best);
        // An idle job must start again (d) before it makes progress.
        idle = front(next_idle, |(c, p)| {
            p + left - d >= work && c + (work - p + d) <= cap
        });
        spot = front(next_spot, |(c, p)| {
            p + left >= work && c + (work - p) <= cap
        });
        regular = front(next_regular, |(c, p)| {
            p + left >= work && c + (work - p) <= cap
        });
        tick += 1;
    }
    best.map(|cost| cost / 3600.0)
}

/// The Pareto front of `states` that pass `keep`: by cost, each with more
/// progress than every cheaper one.
fn front(mut states: Front, keep: impl Fn((f64, f64)) -> bool) -> Front {
    states.retain(|s| keep(*s));
    states.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut out = Vec::with_capacity(states.len());
    let mut most = f64::NEG_INFINITY;
    for (cost, progress) in states {
        if progress > most {
            out.push((cost, progress));
            most = progress;
        }
    }
    out
}

/// The optimum by trying every schedule, tick by tick (3^ticks of them),
/// accounted as the simulation accounts (d spent first at each start, the
/// job ending within a tick): the check that [`optimum`]'s shortcuts lose
/// nothing, on small windows.
pub fn exhaustive(window: Window<'_>, job: &Job) -> Option<f64> {
    let ticks = (job.deadline / window.gap()).ceil() as usize;
    let mut best: Option<f64> = None;
    // mode: 0 idle, 1 Spot, 2 regular.
    fn walk(
        window: &Window<'_>,
        job: &Job,
        ticks: usize,
        tick: usize,
        state: (u8, f64, f64, f64), // (mode of the last tick, overhead left, progress, cost)
        best: &mut Option<f64>,
    ) {
        if tick >= ticks {
            return;
        }
        let gap = window.gap();
        let begin = tick as f64 * gap;
        let (last, overhead_left, progress, cost) = state;
        for mode in 0..3u8 {
            if mode == 1 && !window.at(tick) {
                continue;
            }
            if mode == 0 {
                walk(window, job, ticks, tick + 1, (0, 0.0, progress, cost), best);
                continue;
            }
            let price = if mode == 1 { 1.0 } else { job.price_ratio };
            let mut overhead = if mode == last {
                overhead_left
            } else {
                job.overhead
            };
            let spent = overhead.min(gap);
            overhead -= spent;
            let needed = job.work - progress;
            if gap - spent >= needed {
                let end = begin + spent + needed;
                if end <= job.deadline + 1e-6 {
                    let total = cost + price * (spent + needed);
                    if best.is_none_or(|b| total < b) {
                        *best = Some(total);
                    }
                }
                continue;
            }
            let next = (mode, overhead, progress + gap - spent, cost + price * gap);
            walk(window, job, ticks, tick + 1, next, best);
        }
    }
    walk(&window, job, ticks, 0, (0, 0.0, 0.0, 0.0), &mut best);
    best.map(|cost| cost / 3600.0)
}
