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
pub struct UniformProgress;

/// Where a simulated job starts on the wall clock: any instant will do.
fn epoch() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
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
    }
}

impl LanePolicy for UniformProgress {
    fn name(&self) -> &'static str {
        "uniform-progress"
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        choose_lane(&situation(job, q)).lane
    }
}
