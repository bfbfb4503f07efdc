//! The lane a job with a deadline runs in: Spot, or regular capacity when
//! it must (issue 31, docs/deadlines.md). Uniform Progress, from "Can't Be
//! Late: Optimizing Spot Instance Savings under Deadlines" (Wu et al.,
//! NSDI 2024): a job keeps to the straight line from its start to its
//! deadline; behind it, a job that is not running on Spot goes to the
//! regular lane, and stays there until it is ahead of the line by two
//! switches; a job whose time left no longer covers its work left and two
//! switches goes regular until it finishes; a job without a deadline is
//! always Spot.
//!
//! - [`standing`](Deadline::standing): where a job stands against its
//!   line (the lead, the slack): all the arithmetic, in one place;
//! - [`choose_lane`]: the rule, one pure function of a [`Situation`];
//! - [`switch_cost`]: d, the time one switch costs a job, from the fleet's
//!   measurements and a seed;
//! - [`SpotHistory`]: the fleet's Spot capacity as seen (its outages and
//!   runs), and [`choose_lane_patiently`], the patient policy, which
//!   spends a job's slack where that history says waiting is cheap;
//!   [`LanePolicy`] picks between it and [`choose_lane`];
//! - [`spot_capacity_gone`]: whether the evictions reported say the Spot
//!   capacity is gone (the last worker, or a mass eviction).
//!
//! # How to call this
//!
//! Build a [`Situation`] and call [`choose_lane`]; move the job when the
//! answer's [`lane`](LaneChoice::lane) is not the lane it is in. The
//! answer carries its [`Reason`] and the job's [`Standing`] (lead and
//! slack) for logs, metrics and `status`.
//!
//! - **Where a job is released** (evicted, drained, let go without
//!   finishing): [`Phase::Released`] with the lane it ran in; enqueue it
//!   to the lane of the answer.
//! - **The lane keeper**, for each job waiting in a queue:
//!   [`Phase::Waiting`] with that queue's lane, and
//!   [`recheck`](Situation::recheck) set to the keeper's period (the
//!   safety net keeps that much more slack, since the job may wait one
//!   more period before the keeper looks again).
//! - **A worker of the regular lane**, while its job runs (at each
//!   checkpoint save, say): [`Phase::Running`] with [`Lane::Regular`];
//!   when the answer is Spot, the job is ahead by two switches: save,
//!   and release it to the Spot lane. A job running on Spot is never
//!   moved, so Spot workers need not ask.
//!
//! Inputs: the deadline's instants and `now` are wall-clock
//! ([`SystemTime`](std::time::SystemTime)), as a deadline is a date; the
//! work and the progress are durations of running on one VM (a fraction
//! reported by the job times its estimated work, or the useful time of its
//! goodput ledger); the switch cost d comes from the fleet's measurements.
//! No input makes it panic: a deadline before the start, no work, more
//! progress than work, a `now` past the deadline or before the start each
//! have a defined answer (see the table tests).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use spot_worker_decisions::lanes::{choose_lane, Deadline, Lane, Phase, Reason, Situation};
//!
//! let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
//! let hours = |h: u64| Duration::from_secs(h * 3600);
//! let job = Deadline { start, due: start + hours(52), work: hours(48) };
//! // The lane keeper, at 10 h, about a job still waiting for Spot with
//! // 8 h done: the line expects 9.2 h, so the job goes regular.
//! let waiting = Situation {
//!     deadline: Some(job),
//!     progress: hours(8),
//!     lane: Lane::Spot,
//!     phase: Phase::Waiting,
//!     now: start + hours(10),
//!     switch_cost: Duration::from_secs(6 * 60),
//!     recheck: Duration::from_secs(60),
//!     spot_there: false,
//! };
//! let choice = choose_lane(&waiting);
//! assert_eq!((choice.lane, choice.reason), (Lane::Regular, Reason::BehindTheLine));
//! let standing = choice.standing.unwrap();
//! assert!((standing.slack_secs() / 3600.0 - 2.0).abs() < 1e-9); // 42 h left, 40 h of work
//! ```

mod patient;
mod progress;
mod rule;
mod spot_history;
mod spot_lost;
mod standing;
mod switch_cost;
#[cfg(test)]
mod test_time;

pub use patient::{LanePolicy, choose_lane_patiently, unix_secs};
pub use progress::{JobProgress, ProgressReadings, ProgressSource, job_progress, reported_share};
pub use rule::{Lane, LaneChoice, Phase, Reason, Situation, choose_lane};
pub use spot_history::{
    Current, MAX_PERIODS, MIN_HISTORY_HOURS, Period, Plan, SpotHistory, WINDOW_HOURS,
};
pub use spot_lost::{Evictions, MASS_EVICTION_MIN, MASS_EVICTION_SHARE, spot_capacity_gone};
pub use standing::{Deadline, Standing};
pub use switch_cost::{
    DEFAULT_SWITCH_COST_SEED, SEED_WEIGHT_SWITCHES, Samples, SwitchCostParts, SwitchSamples,
    switch_cost,
};
