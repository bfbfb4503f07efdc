//! The patient policy: Uniform Progress's safety net and "never moved
//! while running on Spot", with the slack spent where the fleet's own Spot
//! history says waiting is cheap (docs/deadlines.md, "The policies").
//!
//! - A job waiting for Spot (or just evicted) waits out an outage as long
//!   as the [patience](SpotHistory::patience) its slack affords, learned
//!   from the outages the fleet has seen, then goes regular.
//! - A job on regular capacity goes back to Spot when Spot is there, if
//!   Spot's runs on this fleet are worth a switch (longer on average than
//!   2kd / (k − 1)) and, for a job whose slack cannot pay two switches in
//!   every cycle to come, once the current run has lasted as long as the
//!   runs its slack can pay for ([`SpotHistory::joining_age`]).
//! - Before the fleet has seen a day and two outages, it is Uniform
//!   Progress ([`choose_lane`]).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::rule::{Lane, LaneChoice, Phase, Reason, Situation, choose_lane};
use super::spot_history::{Plan, SpotHistory};

/// Which rule picks a job's lane (`SPOT_WORKER_LANE_POLICY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LanePolicy {
    /// Uniform Progress as the paper states it ([`choose_lane`]).
    UniformProgress,
    /// Uniform Progress that learns from the fleet's Spot history
    /// ([`choose_lane_patiently`]).
    #[default]
    Patient,
}

impl LanePolicy {
    /// The name settings and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            LanePolicy::UniformProgress => "uniform-progress",
            LanePolicy::Patient => "patient",
        }
    }

    /// The policy named `name` (as [`as_str`](Self::as_str) writes it).
    pub fn parse(name: &str) -> Option<LanePolicy> {
        match name {
            "uniform-progress" => Some(LanePolicy::UniformProgress),
            "patient" => Some(LanePolicy::Patient),
            _ => None,
        }
    }

    /// This policy's answer for `situation`, with the fleet's Spot
    /// `history` and the price ratio k (a regular hour over a Spot hour).
    pub fn choose(self, situation: &Situation, history: &SpotHistory, k: f64) -> LaneChoice {
        match self {
            LanePolicy::UniformProgress => choose_lane(situation),
            LanePolicy::Patient => choose_lane_patiently(situation, history, k),
        }
    }
}

/// Seconds since the Unix epoch of `at` (negative before it): the clock
/// the workers' Spot history is kept on.
pub fn unix_secs(at: SystemTime) -> f64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// The patient policy's lane (see the module documentation). `history` is
/// on the clock of [`unix_secs`]; `k` is the price ratio.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use spot_worker_decisions::lanes::{
///     choose_lane_patiently, Deadline, Lane, Phase, Reason, Situation, SpotHistory,
/// };
///
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
/// let t0 = 1_800_000_000.0;
/// let hours = |h: u64| Duration::from_secs(h * 3600);
/// // Two days of Spot that goes away for 10 minutes every 4 hours.
/// let mut seen = SpotHistory::default();
/// for cycle in 0..12 {
///     let at = t0 - 48.0 * 3600.0 + cycle as f64 * 4.0 * 3600.0;
///     seen.see(true, at);
///     seen.see(false, at + 4.0 * 3600.0 - 600.0);
/// }
/// // 5 minutes into an outage, a job slightly behind its line waits it
/// // out (Uniform Progress would send it to regular capacity).
/// let waiting = Situation {
///     deadline: Some(Deadline { start, due: start + hours(70), work: hours(48) }),
///     progress: hours(10),
///     lane: Lane::Spot,
///     phase: Phase::Waiting,
///     now: start + hours(15),
///     switch_cost: Duration::from_secs(360),
///     recheck: Duration::from_secs(60),
///     spot_there: false,
/// };
/// seen.see(true, t0);
/// seen.see(false, t0 + 15.0 * 3600.0 - 300.0);
/// let choice = choose_lane_patiently(&waiting, &seen, 3.0);
/// assert_eq!((choice.lane, choice.reason), (Lane::Spot, Reason::WaitingOutOutage));
/// ```
pub fn choose_lane_patiently(situation: &Situation, history: &SpotHistory, k: f64) -> LaneChoice {
    let up = choose_lane(situation);
    let Some(standing) = up.standing else {
        return up;
    };
    if matches!(up.reason, Reason::RunningOnSpot | Reason::SafetyNet) {
        return up;
    }
    let now = unix_secs(situation.now);
    let d = situation.switch_cost.as_secs_f64();
    let reserve = 2.0 * d + situation.recheck.as_secs_f64();
    let plan = Plan {
        time_left: standing.time_left_secs(),
        work_left: standing.work_left_secs(),
        budget: standing.slack_secs() - reserve,
        overhead: d,
        price_ratio: k,
    };
    let Some(patience) = history.patience(&plan, now) else {
        return up;
    };
    let choice = |lane, reason| LaneChoice {
        lane,
        reason,
        standing: Some(standing),
    };
    match situation.lane {
        Lane::Regular => {
            let worth = if k > 1.0 {
                2.0 * k * d / (k - 1.0)
            } else {
                f64::INFINITY
            };
            let runs_last = history.mean_run(now).is_some_and(|run| run > worth);
            let lasted = history.run_age(now) >= history.joining_age(&plan, now);
            if situation.spot_there && runs_last && lasted {
                choice(Lane::Spot, Reason::SpotRunJoined)
            } else {
                choice(Lane::Regular, Reason::WaitingForSpotRun)
            }
        }
        Lane::Spot => {
            // Released at an eviction: the outage is just beginning.
            let age = if situation.phase == Phase::Released {
                0.0
            } else {
                history.outage_age(now)
            };
            if up.lane == Lane::Spot {
                up
            } else if situation.spot_there || age < patience {
                choice(Lane::Spot, Reason::WaitingOutOutage)
            } else {
                choice(Lane::Regular, Reason::OutageOutlasted)
            }
        }
    }
}

#[cfg(test)]
mod tests;
