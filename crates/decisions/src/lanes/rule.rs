//! [`choose_lane`]: the Uniform Progress rule ("Can't Be Late", NSDI 2024)
//! for the lane a job runs in, as one pure function of a [`Situation`].

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::standing::{Deadline, Standing};

/// The two kinds of capacity a job can run on, each an Azure Storage queue
/// served by its own pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// Spot VMs: cheap, and taken away when Azure needs them back.
    Spot,
    /// Regular-priority VMs: dearer, and never evicted.
    Regular,
}

impl Lane {
    /// The name settings, records and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Spot => "spot",
            Lane::Regular => "regular",
        }
    }
}

/// Where a job is when the rule is asked about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// In its lane's queue, not taken by a worker (the lane keeper asks).
    Waiting,
    /// Just let go by a worker without finishing (evicted, released,
    /// drained); about to be enqueued again (the releasing worker asks).
    Released,
    /// Being worked on by a worker of its lane (that worker asks).
    Running,
}

/// Why [`choose_lane`] answered as it did: for logs, metrics and
/// `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The job has no deadline: Spot, as every job before deadlines.
    NoDeadline,
    /// The job runs on Spot: it is never moved while it runs; it only
    /// leaves Spot when evicted.
    RunningOnSpot,
    /// The time left is less than the work left plus two switches (and one
    /// recheck): regular capacity until it finishes.
    SafetyNet,
    /// On Spot and behind the straight line from start to deadline, not
    /// running: regular capacity, to catch up.
    BehindTheLine,
    /// On Spot and not behind the line: stays, waiting for Spot if need be.
    OnTheLine,
    /// In the regular lane and not yet ahead of the line by two switches:
    /// stays.
    CatchingUp,
    /// In the regular lane and ahead of the line by two switches, with
    /// Spot capacity there: back to Spot.
    CaughtUp,
    /// In the regular lane and ahead of the line by two switches, but no
    /// Spot capacity is seen: stays until a Spot worker is heard from
    /// (released into an outage, the job would wait, fall behind and come
    /// back, paying two switches for nothing).
    SpotAway,
    /// The patient policy: not running on Spot and behind the line, but the
    /// outage is younger than the slack can afford to wait out: Spot.
    WaitingOutOutage,
    /// The patient policy: the outage has outlasted what the slack can
    /// afford to wait: regular capacity.
    OutageOutlasted,
    /// The patient policy: in the regular lane, and Spot is there with runs
    /// worth a switch: back to Spot.
    SpotRunJoined,
    /// The patient policy: in the regular lane, and Spot is away, or its
    /// runs are too short to be worth two switches, or the current run is
    /// younger than those the job's slack can pay for: stays.
    WaitingForSpotRun,
}

impl Reason {
    /// The name logs and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoDeadline => "no_deadline",
            Reason::RunningOnSpot => "running_on_spot",
            Reason::SafetyNet => "safety_net",
            Reason::BehindTheLine => "behind_the_line",
            Reason::OnTheLine => "on_the_line",
            Reason::CatchingUp => "catching_up",
            Reason::CaughtUp => "caught_up",
            Reason::SpotAway => "spot_away",
            Reason::WaitingOutOutage => "waiting_out_outage",
            Reason::OutageOutlasted => "outage_outlasted",
            Reason::SpotRunJoined => "spot_run_joined",
            Reason::WaitingForSpotRun => "waiting_for_spot_run",
        }
    }
}

/// Everything the rule looks at, for one job at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Situation {
    /// The job's deadline and work; `None` for a job without a deadline.
    pub deadline: Option<Deadline>,
    /// The work done so far, as time on one VM (from the progress the
    /// job reports, else the useful time of its goodput ledger).
    pub progress: Duration,
    /// The lane the job is in now.
    pub lane: Lane,
    /// Where it is in that lane.
    pub phase: Phase,
    /// The instant of the question (wall clock, like the deadline).
    pub now: SystemTime,
    /// d: what one switch costs the job in time without progress (queue
    /// wait, start-up, restore, the work an interruption loses), as the
    /// fleet measures it ([`switch_cost`](super::switch_cost())).
    pub switch_cost: Duration,
    /// The longest the job can wait before the rule is asked about it
    /// again (the lane keeper's period). The safety net keeps this much
    /// more slack, so that a job that waits one more period still has its
    /// two switches; zero for a rule asked continuously.
    pub recheck: Duration,
    /// Whether Spot capacity is there now: a Spot worker of the fleet was
    /// heard from lately (the paper's policies are told this at every
    /// step). A job in the regular lane goes back to Spot only while it is.
    pub spot_there: bool,
}

/// The answer: the lane, why, and where the job stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneChoice {
    /// The lane the job should be in.
    pub lane: Lane,
    /// Why.
    pub reason: Reason,
    /// Where it stands against its deadline; `None` without a deadline.
    pub standing: Option<Standing>,
}

/// The lane a job should be in, by Uniform Progress ("Can't Be Late",
/// NSDI 2024). In order:
///
/// 1. a job without a deadline: Spot;
/// 2. a job running on Spot: Spot (never moved while it runs);
/// 3. safety net: when the time left is less than the work left plus
///    2·d (plus [`Situation::recheck`]): regular;
/// 4. in the regular lane: regular until the job is ahead of the line by
///    2·d (its progress at least what the line expects 2·d from now),
///    then Spot, if Spot capacity is there ([`Situation::spot_there`]);
/// 5. in the Spot lane, waiting or just released: regular when behind
///    the straight line from start to deadline, else Spot.
///
/// The rule keeps no state: asked again with the same figures it answers
/// the same. It needs none, because nothing but the figures can undo the
/// safety net: the slack never grows while the job runs or waits (unless
/// its reported progress outruns the clock, i.e. the work was
/// overestimated).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use spot_worker_decisions::lanes::{choose_lane, Deadline, Lane, Phase, Reason, Situation};
///
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
/// let hours = |h: u64| Duration::from_secs(h * 3600);
/// // 48 h of work due in 70 h; evicted at 35 h with 20 h done: the line
/// // is at 24 h, so the job is behind.
/// let evicted = Situation {
///     deadline: Some(Deadline { start, due: start + hours(70), work: hours(48) }),
///     progress: hours(20),
///     lane: Lane::Spot,
///     phase: Phase::Released,
///     now: start + hours(35),
///     switch_cost: Duration::from_secs(360),
///     recheck: Duration::from_secs(60),
///     spot_there: false,
/// };
/// let choice = choose_lane(&evicted);
/// assert_eq!((choice.lane, choice.reason), (Lane::Regular, Reason::BehindTheLine));
/// assert!(choice.standing.unwrap().lead_secs() < 0.0);
///
/// // The same job running on Spot is not moved.
/// let running = Situation { phase: Phase::Running, ..evicted };
/// assert_eq!(choose_lane(&running).lane, Lane::Spot);
/// ```
pub fn choose_lane(situation: &Situation) -> LaneChoice {
    let Some(deadline) = situation.deadline else {
        return LaneChoice {
            lane: Lane::Spot,
            reason: Reason::NoDeadline,
            standing: None,
        };
    };
    let standing = deadline.standing(situation.progress, situation.now);
    let two_switches = situation.switch_cost.saturating_mul(2);
    let (lane, reason) = if situation.lane == Lane::Spot && situation.phase == Phase::Running {
        (Lane::Spot, Reason::RunningOnSpot)
    } else if standing.slack_below(two_switches.saturating_add(situation.recheck)) {
        (Lane::Regular, Reason::SafetyNet)
    } else if situation.lane == Lane::Regular {
        if !standing.is_ahead_by(two_switches) {
            (Lane::Regular, Reason::CatchingUp)
        } else if situation.spot_there {
            (Lane::Spot, Reason::CaughtUp)
        } else {
            (Lane::Regular, Reason::SpotAway)
        }
    } else if standing.is_behind() {
        (Lane::Regular, Reason::BehindTheLine)
    } else {
        (Lane::Spot, Reason::OnTheLine)
    };
    LaneChoice {
        lane,
        reason,
        standing: Some(standing),
    }
}

#[cfg(test)]
mod tests;
