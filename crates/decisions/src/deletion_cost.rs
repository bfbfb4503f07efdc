//! A pod's `controller.kubernetes.io/pod-deletion-cost`, kept by its own
//! worker (issue 39, item 2): the value to publish and when to publish it.
//!
//! When a ReplicaSet scales in it removes, among pods otherwise alike
//! (all ready, all scheduled), those with the **lowest** deletion cost
//! first. A worker that keeps its pod's cost equal to what a removal would
//! lose makes a KEDA scale-in take an idle pod before a busy one, and among
//! busy ones the one with the least unsaved work.
//!
//! - **What**: [`cost`] — [`deletion_cost`](crate::scale_in::deletion_cost) rounded: 0 when idle or starting (nothing to lose), −1 when
//!   draining (it is leaving: remove it first), and when busy the **sum**
//!   over the jobs it holds of the job time since each one's last save,
//!   in whole seconds, rounded down to a [`CostPolicy::bucket`] and at
//!   least 1. The sum, not the largest: a removal loses every job the pod
//!   holds, so two jobs 10 minutes past their save lose 20 minutes of work,
//!   more than one job 15 minutes past its own.
//! - **When**: [`should_publish`] — every update is a write to the API
//!   server that every pod watcher sees, and KEP-2255 asks that the cost
//!   not change on every small step. So a change of bucket is published at
//!   most once per [`CostPolicy::min_interval`]; a change between idle and
//!   busy (or to draining) at once, since that is what scale-in must see
//!   first.
//!
//! ```
//! use std::time::Duration;
//! use spot_worker_decisions::deletion_cost::{cost, should_publish, CostPolicy, Published};
//! use spot_worker_decisions::scale_in::Activity;
//! use tokio::time::Instant;
//!
//! let policy = CostPolicy::default();
//! let busy = |s| Activity::Busy { unsaved: Duration::from_secs(s) };
//! assert_eq!(cost(Activity::Idle { idle_for: Duration::ZERO }, &policy), 0);
//! assert_eq!(cost(busy(30), &policy), 1);
//! assert_eq!(cost(busy(125), &policy), 120);
//!
//! let at = Instant::now();
//! let last = Published { cost: 120, at };
//! // A new bucket ten seconds later waits; going idle does not.
//! assert!(!should_publish(Some(last), 180, at + Duration::from_secs(10), &policy));
//! assert!(should_publish(Some(last), 0, at + Duration::from_secs(10), &policy));
//! ```

use std::time::Duration;

use tokio::time::Instant;

use crate::scale_in::{Activity, deletion_cost};

/// How coarse the published cost is and how often it may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostPolicy {
    /// A busy pod's cost is its unsaved seconds rounded down to a multiple
    /// of this (at least 1 s).
    pub bucket: Duration,
    /// The least time between two published changes among busy values.
    pub min_interval: Duration,
}

impl Default for CostPolicy {
    /// A minute each: a job that saves every 20 minutes moves its pod's
    /// cost at most once a minute (a few thousand pod writes an hour for a
    /// thousand busy pods, well inside an API server's budget), and a pod a
    /// minute past its save already ranks above one that just saved.
    fn default() -> Self {
        Self {
            bucket: Duration::from_secs(60),
            min_interval: Duration::from_secs(60),
        }
    }
}

/// The cost last written to the pod, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The value written.
    pub cost: i32,
    /// When the write succeeded.
    pub at: Instant,
}

/// The deletion cost for `activity`: −1 draining, 0 idle or starting, busy
/// its unsaved seconds rounded down to the policy's bucket, at least 1 and
/// at most `i32::MAX`. Never lower for more unsaved work.
pub fn cost(activity: Activity, policy: &CostPolicy) -> i32 {
    // The unquantised value is scale_in's; only a busy one is rounded.
    let exact = deletion_cost(activity);
    if exact <= 0 {
        return exact;
    }
    let bucket = i32::try_from(policy.bucket.as_secs().max(1)).unwrap_or(i32::MAX);
    (exact / bucket * bucket).max(1)
}

/// Whether to write `wanted` now, given what was `last` published (`None`:
/// nothing yet, or the pod's value is unknown). An unchanged value never;
/// a first value, or a change that crosses between busy (> 0) and not
/// (idle 0, draining −1), at once; a change among busy values only once
/// `min_interval` has passed since the last write.
pub fn should_publish(
    last: Option<Published>,
    wanted: i32,
    now: Instant,
    policy: &CostPolicy,
) -> bool {
    let Some(last) = last else {
        return true;
    };
    if last.cost == wanted {
        return false;
    }
    let both_busy = last.cost > 0 && wanted > 0;
    !both_busy || now.saturating_duration_since(last.at) >= policy.min_interval
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn cost_table() {
        let policy = CostPolicy::default();
        let busy = |s| Activity::Busy { unsaved: S(s) };
        // (activity, cost, why)
        let table = [
            (Activity::Starting, 0, "holds nothing"),
            (
                Activity::Idle { idle_for: S(3600) },
                0,
                "idle: 0 however long",
            ),
            (Activity::Draining, -1, "leaving: first to go"),
            (busy(0), 1, "busy is never 0, even just saved"),
            (busy(59), 1, "first bucket"),
            (busy(60), 60, "second bucket"),
            (busy(119), 60, "still the second"),
            (busy(3000), 3000, "50 minutes"),
            (
                busy(u64::MAX),
                2_147_483_640,
                "clamped, no overflow, rounded down",
            ),
            (
                busy(i32::MAX as u64 + 1),
                2_147_483_640,
                "just past i32: clamped, rounded down",
            ),
            (
                busy(1 << 40),
                2_147_483_640,
                "beyond i32: clamped, rounded down",
            ),
        ];
        for (activity, expected, why) in table {
            assert_eq!(cost(activity, &policy), expected, "{activity:?}: {why}");
        }
        let zero_bucket = CostPolicy {
            bucket: Duration::ZERO,
            ..policy
        };
        assert_eq!(cost(busy(61), &zero_bucket), 61, "a zero bucket is 1 s");
    }

    #[test]
    fn more_unsaved_work_never_costs_less() {
        let policy = CostPolicy::default();
        let mut previous = cost(Activity::Idle { idle_for: S(0) }, &policy);
        for seconds in (0..10_000).step_by(7) {
            let now = cost(
                Activity::Busy {
                    unsaved: S(seconds),
                },
                &policy,
            );
            assert!(now >= previous, "{seconds}s: {now} < {previous}");
            assert!(now > 0);
            previous = now;
        }
    }

    #[test]
    fn publish_table() {
        let policy = CostPolicy::default();
        let start = Instant::now();
        let at = |s| start + S(s);
        let last = |cost, s| Some(Published { cost, at: at(s) });
        // (last, wanted, now, publish, why)
        let table = [
            (
                None,
                0,
                0,
                true,
                "first value, even 0: a restarted pod may carry an old cost",
            ),
            (None, 600, 0, true, "first value"),
            (last(0, 0), 0, 5, false, "unchanged"),
            (last(600, 0), 600, 500, false, "unchanged busy"),
            (last(0, 0), 1, 1, true, "idle to busy at once"),
            (last(600, 0), 0, 1, true, "busy to idle at once"),
            (last(600, 0), -1, 1, true, "busy to draining at once"),
            (last(0, 0), -1, 1, true, "idle to draining at once"),
            (last(-1, 0), 0, 1, true, "draining withdrawn: back to idle"),
            (last(60, 0), 120, 59, false, "new bucket too soon"),
            (last(60, 0), 120, 60, true, "new bucket after the interval"),
            (
                last(1200, 0),
                1,
                10,
                false,
                "saved: lower busy cost waits too",
            ),
            (last(1200, 0), 1, 61, true, "saved, after the interval"),
        ];
        for (last, wanted, now, expected, why) in table {
            assert_eq!(
                should_publish(last, wanted, at(now), &policy),
                expected,
                "{last:?} -> {wanted} at {now}: {why}"
            );
        }
    }

    #[test]
    fn among_busy_pods_the_least_unsaved_has_the_lowest_cost() {
        let policy = CostPolicy::default();
        let costs: Vec<i32> = [
            Activity::Busy { unsaved: S(3000) },
            Activity::Idle { idle_for: S(5) },
            Activity::Busy { unsaved: S(200) },
        ]
        .into_iter()
        .map(|activity| cost(activity, &policy))
        .collect();
        assert!(costs[1] < costs[2] && costs[2] < costs[0], "{costs:?}");
    }
}
