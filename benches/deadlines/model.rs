//! The paper's setting, as two lanes: one job, one VM at a time, time in
//! ticks of the trace's `gap_seconds`.
//!
//! - The job waits in a lane's queue or runs on a VM of that lane. A Spot
//!   VM takes a job waiting in the Spot lane at the first tick the trace
//!   says 1; a regular VM takes a job waiting in the regular lane at once
//!   (regular capacity is always there, as in the paper).
//! - A job running on Spot is evicted at the first tick the trace says 0:
//!   released, the policy picks the lane it is enqueued to.
//! - Each start, on either kind of VM, costs d of no progress (the paper's
//!   changeover delay: queue wait, start-up, restore, lost work), the
//!   first start included; an eviction loses nothing more (d covers it).
//! - Policies are asked at tick boundaries: where a job is released; by
//!   the lane keeper for a waiting job; by a regular worker for its
//!   running job (which it then releases to the Spot lane if told so). A
//!   job running on Spot is not asked. Between ticks nothing changes.
//! - Cost is in Spot-hours: a Spot VM's hour costs 1, a regular one's k,
//!   billed by the second while a VM holds the job (d included) until the
//!   job ends; waiting in a queue costs nothing.
//! - The deadline is met when the job's work is done by it; a job that is
//!   late runs on until done (its cost counts), and is counted missed.

use spot_worker::decisions::lanes::{Lane, Phase};

use crate::trace::Window;

/// How much of the trace before a job's start a policy may learn from.
pub const HISTORY_HOURS: f64 = 7.0 * 24.0;

/// One job: seconds of work, deadline, d, and the price ratio k.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// Seconds of work on one VM.
    pub work: f64,
    /// Seconds from enqueue (the start) to the deadline.
    pub deadline: f64,
    /// d, seconds of no progress per start.
    pub overhead: f64,
    /// k: a regular hour over a Spot hour.
    pub price_ratio: f64,
}

impl Job {
    /// The price of an hour in `lane`, in Spot-hours.
    pub fn price(&self, lane: Lane) -> f64 {
        match lane {
            Lane::Spot => 1.0,
            Lane::Regular => self.price_ratio,
        }
    }
}

/// What a policy is asked about: the job at one tick boundary.
#[derive(Clone, Copy, Debug)]
pub struct Question {
    /// The lane the job is in.
    pub lane: Lane,
    /// Waiting, just released, or running.
    pub phase: Phase,
    /// Seconds of work done.
    pub progress: f64,
    /// Seconds since the job's start.
    pub now: f64,
    /// Seconds until the policy is asked again (one tick).
    pub recheck: f64,
    /// Whether Spot capacity is there now (what the paper's policies see;
    /// the workers' rule does not use it).
    pub spot_now: bool,
}

/// A lane policy, as the bench runs it.
pub trait LanePolicy {
    /// Its name in the output.
    fn name(&self) -> &'static str;
    /// A new job, started at tick 0 of `window`: forget the last one; the
    /// ticks before are what the fleet saw of its Spot capacity before.
    fn reset(&mut self, _window: Window<'_>) {}
    /// Whether Spot capacity was there during the tick just gone (what a
    /// fleet sees of its Spot pool), told once per tick before questions.
    /// `at` is when that tick began, in seconds since the job's start.
    fn observe(&mut self, _spot_available: bool, _at: f64) {}
    /// The lane for the job.
    fn lane(&mut self, job: &Job, question: &Question) -> Lane;
}

/// What happened to one job.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Spot-hours: Spot hours plus k times regular hours.
    pub cost: f64,
    /// Hours on Spot VMs (d included).
    pub spot_hours: f64,
    /// Hours on regular VMs (d included).
    pub regular_hours: f64,
    /// Seconds from start to the end of the work.
    pub finished_at: f64,
    /// Whether it ended after the deadline.
    pub missed: bool,
    /// VM starts (each costing d).
    pub starts: u32,
}

/// The job's life under `policy` on the trace `window`.
pub fn simulate(window: Window<'_>, job: &Job, policy: &mut dyn LanePolicy) -> Outcome {
    policy.reset(window);
    let gap = window.gap();
    let mut lane = Lane::Spot;
    let mut running = false;
    let mut overhead_left = 0.0;
    let mut progress = 0.0_f64;
    let mut out = Outcome::default();
    // A policy that never finishes the job is stopped well past its deadline.
    let give_up = job.deadline + 4.0 * job.work + 100.0 * gap;
    let mut tick = 0usize;
    loop {
        let now = tick as f64 * gap;
        if now > give_up {
            out.missed = true;
            out.finished_at = f64::INFINITY;
            return out;
        }
        let spot = window.at(tick);
        let ask = |lane: Lane, phase: Phase, policy: &mut dyn LanePolicy| {
            let question = Question {
                lane,
                phase,
                progress,
                now,
                recheck: gap,
                spot_now: spot,
            };
            policy.lane(job, &question)
        };
        if tick > 0 {
            policy.observe(window.at(tick - 1), (tick - 1) as f64 * gap);
        }
        if running && lane == Lane::Spot && !spot {
            running = false;
            lane = ask(Lane::Spot, Phase::Released, policy);
        }
        if running
            && lane == Lane::Regular
            && ask(Lane::Regular, Phase::Running, policy) == Lane::Spot
        {
            running = false;
            lane = Lane::Spot;
        }
        if !running {
            lane = ask(lane, Phase::Waiting, policy);
            if lane == Lane::Regular || spot {
                running = true;
                overhead_left = job.overhead;
                out.starts += 1;
            }
        }
        if running {
            let overhead = overhead_left.min(gap);
            overhead_left -= overhead;
            let needed = job.work - progress;
            let (held, done) = if gap - overhead >= needed {
                (overhead + needed, true)
            } else {
                (gap, false)
            };
            progress += held - overhead;
            let hours = held / 3600.0;
            match lane {
                Lane::Spot => out.spot_hours += hours,
                Lane::Regular => out.regular_hours += hours,
            }
            out.cost += hours * job.price(lane);
            if done {
                out.finished_at = now + held;
                // A microsecond of float noise is not a miss.
                out.missed = out.finished_at > job.deadline + 1e-6;
                return out;
            }
        }
        tick += 1;
    }
}
