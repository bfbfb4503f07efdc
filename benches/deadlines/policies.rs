//! The policies compared: on-demand, greedy, and Uniform Progress, which
//! is the workers' own code, `choose_lane`, called as they call it.

use std::time::{Duration, SystemTime};

use spot_worker::decisions::lanes::{Deadline, Lane, Phase, Situation, choose_lane};

use crate::model::{Job, LanePolicy, Question};

/// Every job on regular capacity: the baseline of (W + d)·k.
pub struct OnDemand;

impl LanePolicy for OnDemand {
    fn name(&self) -> &'static str {
        "on-demand"
    }

    fn lane(&mut self, _job: &Job, _question: &Question) -> Lane {
        Lane::Regular
    }
}

/// The paper's greedy policy (§3.4): Spot whenever available, else wait;
/// never moved while on Spot (exploitation rule); once the time left is
/// less than the work left plus 2d, regular for good (safety net rule;
/// plus one tick, as the paper's simulator rounds its ticks, so that a
/// job that waits one more tick still has its two switches).
pub struct Greedy;

impl LanePolicy for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        let slack = (job.deadline - q.now) - (job.work - q.progress).max(0.0);
        if q.lane == Lane::Regular {
            Lane::Regular
        } else if q.phase == Phase::Running || slack >= 2.0 * job.overhead + q.recheck {
            Lane::Spot
        } else {
            Lane::Regular
        }
    }
}

/// Uniform Progress: [`choose_lane`], the function the workers call, with
/// the job's figures turned into the instants and durations they pass.
/// The workers tell it whether Spot capacity is there (a Spot worker was
/// heard from lately); `sees_spot: false` tells it Spot is always there,
/// as the workers did before they listened for Spot workers: a regular
/// job caught up is released to the Spot lane blind.
pub struct UniformProgress {
    pub sees_spot: bool,
}

/// Where a simulated job starts on the wall clock, in Unix seconds: any
/// instant will do.
const EPOCH_SECS: u64 = 1_700_000_000;

fn epoch() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS)
}

/// `secs` since the job's start, on the clock the workers keep their Spot
/// history on (Unix seconds).
pub fn at_secs(secs: f64) -> f64 {
    EPOCH_SECS as f64 + secs
}

/// The situation the workers would build for the job at `q`.
pub fn situation(job: &Job, q: &Question) -> Situation {
    let start = epoch();
    let secs = Duration::from_secs_f64;
    Situation {
        deadline: Some(Deadline {
            start,
            due: start + secs(job.deadline),
            work: secs(job.work),
        }),
        progress: secs(q.progress),
        lane: q.lane,
        phase: q.phase,
        now: start + secs(q.now),
        switch_cost: secs(job.overhead),
        recheck: secs(q.recheck),
        spot_there: q.spot_now,
    }
}

impl LanePolicy for UniformProgress {
    fn name(&self) -> &'static str {
        if self.sees_spot {
            "uniform-progress"
        } else {
            "uniform-progress-blind"
        }
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        let mut situation = situation(job, q);
        situation.spot_there |= !self.sees_spot;
        choose_lane(&situation).lane
    }
}
