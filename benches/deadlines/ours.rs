//! Policies of ours, beside the paper's.
//!
//! - `up-sees-spot`: Uniform Progress, but a regular job goes back to the
//!   Spot lane only while Spot capacity is there (the paper's policies
//!   see it); the workers' rule releases it blind, and a job released
//!   into an outage waits, falls behind and comes back, paying d twice.
//! - `patient`: spends the slack where waiting is cheap. From the outages
//!   the fleet has seen (their lengths, how often they come) it computes
//!   how long a job can afford to wait in each outage to come with the
//!   slack it has ([`SpotHistory::patience`]); a job waiting for Spot goes
//!   regular once the outage has lasted that long, and a regular job goes
//!   back to Spot as soon as Spot is there, if its runs on this fleet are
//!   long enough to be worth a switch (longer on average than
//!   2kd / (k − 1), the paper's threshold for a known lifetime). The
//!   safety net and "never moved while running on Spot" as in Uniform
//!   Progress; without history, Uniform Progress.

use spot_worker::decisions::lanes::{Lane, Phase, choose_lane};

use crate::learned::{Plan, SpotHistory};
use crate::model::{Job, LanePolicy, Question};
use crate::policies::situation;

/// Uniform Progress that leaves the regular lane only while Spot is there.
pub struct UpSeesSpot;

impl LanePolicy for UpSeesSpot {
    fn name(&self) -> &'static str {
        "up-sees-spot"
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        let lane = choose_lane(&situation(job, q)).lane;
        if q.lane == Lane::Regular && lane == Lane::Spot && !q.spot_now {
            Lane::Regular
        } else {
            lane
        }
    }
}

/// The patient policy (see the module documentation).
pub struct Patient {
    history: SpotHistory,
    /// Whether a job whose slack cannot pay two switches per cycle joins
    /// only the runs of Spot that have lasted ([`SpotHistory::joining_age`]).
    pub filter: bool,
}

impl Patient {
    pub fn new(filter: bool) -> Patient {
        Patient {
            history: SpotHistory::default(),
            filter,
        }
    }
}

impl LanePolicy for Patient {
    fn name(&self) -> &'static str {
        if self.filter {
            "patient-filter"
        } else {
            "patient"
        }
    }

    fn reset(&mut self, history: SpotHistory) {
        self.history = history;
    }

    fn observe(&mut self, spot_available: bool, gap: f64) {
        self.history.see(spot_available, gap);
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        let d = job.overhead;
        let time_left = job.deadline - q.now;
        let slack = time_left - (job.work - q.progress).max(0.0);
        if q.lane == Lane::Spot && q.phase == Phase::Running {
            return Lane::Spot;
        }
        let reserve = 2.0 * d + q.recheck;
        if slack < reserve {
            return Lane::Regular;
        }
        let plan = Plan {
            time_left,
            work_left: (job.work - q.progress).max(0.0),
            budget: slack - reserve,
            overhead: d,
            price_ratio: job.price_ratio,
        };
        let Some(patience) = self.history.patience(&plan) else {
            // Nothing learned yet: wait for Spot, as greedy does (the
            // safety net still holds).
            return if self.filter {
                Lane::Spot
            } else {
                UpSeesSpot.lane(job, q)
            };
        };
        match q.lane {
            Lane::Regular => {
                let worth = 2.0 * job.price_ratio * d / (job.price_ratio - 1.0);
                let runs_last = self.history.mean_run().is_some_and(|run| run > worth);
                let from_age = if self.filter {
                    self.history.joining_age(&plan)
                } else {
                    0.0
                };
                if q.spot_now && runs_last && self.history.run_age() >= from_age {
                    Lane::Spot
                } else {
                    Lane::Regular
                }
            }
            Lane::Spot => {
                // Released at an eviction: the outage is just beginning.
                let age = if q.phase == Phase::Released {
                    0.0
                } else {
                    self.history.outage_age()
                };
                if q.spot_now || age < patience {
                    Lane::Spot
                } else {
                    Lane::Regular
                }
            }
        }
    }
}
