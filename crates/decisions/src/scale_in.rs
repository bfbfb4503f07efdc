//! Scale-in that removes only idle capacity (issue 39): which instances a
//! fleet can lose without losing work, and whether one worker should keep
//! its own VM out of a scale-in.
//!
//! A fleet's autoscaler (Azure autoscale on a scale set, KEDA on AKS)
//! decides *how many* instances go; it does not know which of them hold a
//! job. These rules say *which*: never one that holds work while one that
//! holds nothing could go instead, and among those that hold work the one
//! with the least work since its last save. Three callers:
//!
//! - **a worker on a scale set**, with [`wants_protection`]: it keeps its
//!   VM protected from scale-in (Azure's `protectFromScaleIn`) from before
//!   it takes a message until it has been idle for the idle grace, so a
//!   scale-in can only pick VMs that hold nothing, and a VM that takes one
//!   job after another costs one protect and one release per busy period,
//!   not an ARM call per message;
//! - **a keeper or a simulation** that must name the instances to remove,
//!   with [`choose_removals`]: the idle instances past the grace, longest
//!   idle first, as many as the fleet has beyond its minimum and the work
//!   waiting;
//! - **an orchestrator that removes a given number whatever they hold**
//!   (Kubernetes with `controller.kubernetes.io/pod-deletion-cost`), with
//!   [`removal_order`] and [`deletion_cost`]: draining first, then idle,
//!   then starting, then busy by least unsaved work.
//!
//! No input makes these panic: an empty fleet, a minimum above its size, a
//! queue deeper than the fleet, unsaved work beyond `i32` seconds each have
//! a defined answer (see the table tests).
//!
//! ```
//! use std::time::Duration;
//! use spot_worker_decisions::scale_in::{choose_removals, wants_protection, Activity, Fleet};
//!
//! let minutes = |m: u64| Duration::from_secs(m * 60);
//! let grace = minutes(2);
//! // A worker 50 minutes into a job that saved 5 minutes ago stays protected;
//! // one idle for 10 minutes lets scale-in take it.
//! assert!(wants_protection(Activity::Busy { unsaved: minutes(5) }, grace));
//! assert!(!wants_protection(Activity::Idle { idle_for: minutes(10) }, grace));
//!
//! // Three VMs, one busy, two idle past the grace, nothing waiting, a
//! // minimum of one: the two idle ones go, the longest idle first.
//! let fleet = [
//!     Activity::Idle { idle_for: minutes(3) },
//!     Activity::Busy { unsaved: minutes(5) },
//!     Activity::Idle { idle_for: minutes(9) },
//! ];
//! let removals = choose_removals(&Fleet { instances: &fleet, minimum: 1, waiting: 0, idle_grace: grace });
//! assert_eq!(removals, vec![2, 0]);
//! ```

use std::cmp::Ordering;
use std::time::Duration;

/// What one instance (a VM of a scale set, a pod) is doing, as its worker
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Not yet taking messages (booting, pulling its image, connecting).
    Starting,
    /// Holding no message, for this long.
    Idle {
        /// How long since it last held a message (or since it started).
        idle_for: Duration,
    },
    /// Holding at least one message; a removal now loses the work done
    /// since the last save.
    Busy {
        /// Job time since the job's last saved checkpoint (its start, if
        /// none): what a removal would have to redo. For several messages
        /// at once, their sum.
        unsaved: Duration,
    },
    /// Leaving: evicted or stopping, releasing what it holds.
    Draining,
}

/// What [`choose_removals`] decides on: the fleet as its workers report it.
#[derive(Clone, Copy, Debug)]
pub struct Fleet<'a> {
    /// Every instance, in the caller's order; the answer names them by
    /// their index here.
    pub instances: &'a [Activity],
    /// The fewest instances the fleet keeps (`minInstances`): idle ones
    /// included, draining ones not (they are going anyway).
    pub minimum: usize,
    /// Messages waiting in the queue (visible, not held by anyone): an idle
    /// instance will take one, so as many idle instances as messages stay.
    pub waiting: usize,
    /// How long an instance must have been idle before it may go: a gap
    /// between two messages is not idleness (the idle grace setting).
    pub idle_grace: Duration,
}

/// Whether a worker keeps its own VM protected from scale-in: while it
/// holds work, and until it has been idle for `idle_grace`; not while it
/// starts (it holds nothing yet: it protects itself before it takes its
/// first message) nor while it drains (it is leaving).
///
/// Protect *before* receiving a message, release only after the grace:
/// a VM is then never unprotected while it holds a message, and a run of
/// messages with short gaps costs one protect and one release.
pub fn wants_protection(activity: Activity, idle_grace: Duration) -> bool {
    match activity {
        Activity::Busy { .. } => true,
        Activity::Idle { idle_for } => idle_for < idle_grace,
        Activity::Starting | Activity::Draining => false,
    }
}

/// The instances a scale-in should remove, by index into
/// [`Fleet::instances`], longest idle first (ties: lower index first).
///
/// Only idle instances past the grace are ever named. The fleet keeps its
/// minimum and one idle instance per waiting message; instances that are
/// busy or starting count towards both (a starting one will take a waiting
/// message, a busy one will take the next when it is done), draining ones
/// towards neither.
pub fn choose_removals(fleet: &Fleet<'_>) -> Vec<usize> {
    let staying = fleet
        .instances
        .iter()
        .filter(|activity| !matches!(activity, Activity::Draining))
        .count();
    let keep = fleet.minimum.max(fleet.waiting);
    let surplus = staying.saturating_sub(keep);
    let mut idle: Vec<(usize, Duration)> = fleet
        .instances
        .iter()
        .enumerate()
        .filter_map(|(index, activity)| match activity {
            Activity::Idle { idle_for } if *idle_for >= fleet.idle_grace => {
                Some((index, *idle_for))
            }
            _ => None,
        })
        .collect();
    idle.sort_by(|(a, a_idle), (b, b_idle)| b_idle.cmp(a_idle).then(a.cmp(b)));
    idle.into_iter()
        .take(surplus)
        .map(|(index, _)| index)
        .collect()
}

/// The order in which to remove instances when a given number must go,
/// whatever they hold (all of them, by index): draining first, then idle
/// (longest idle first), then starting, then busy by least unsaved work;
/// ties by lower index. The first `n` of it are the `n` to remove.
pub fn removal_order(instances: &[Activity]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..instances.len()).collect();
    order.sort_by(|&a, &b| removal_rank(&instances[a], &instances[b]).then(a.cmp(&b)));
    order
}

/// How `a` compares with `b` in [`removal_order`] (`Less`: `a` goes
/// first).
fn removal_rank(a: &Activity, b: &Activity) -> Ordering {
    fn class(activity: &Activity) -> u8 {
        match activity {
            Activity::Draining => 0,
            Activity::Idle { .. } => 1,
            Activity::Starting => 2,
            Activity::Busy { .. } => 3,
        }
    }
    match (a, b) {
        (Activity::Idle { idle_for: a }, Activity::Idle { idle_for: b }) => b.cmp(a),
        (Activity::Busy { unsaved: a }, Activity::Busy { unsaved: b }) => a.cmp(b),
        _ => class(a).cmp(&class(b)),
    }
}

/// The value for a pod's `controller.kubernetes.io/pod-deletion-cost`
/// (Kubernetes removes the lowest first), never against
/// [`removal_order`]: draining −1, idle and starting 0 (the issue's "0 when
/// idle"; neither holds work), busy its unsaved work in whole seconds, at
/// least 1 and at most `i32::MAX`. What the cost cannot say (how long each
/// was idle, idle before starting) is [`removal_order`]'s alone.
pub fn deletion_cost(activity: Activity) -> i32 {
    match activity {
        Activity::Draining => -1,
        Activity::Idle { .. } | Activity::Starting => 0,
        Activity::Busy { unsaved } => {
            i32::try_from(unsaved.as_secs()).map_or(i32::MAX, |seconds| seconds.max(1))
        }
    }
}

#[cfg(test)]
mod tests;
