//! Lanes: jobs with a deadline run on Spot capacity, and fall back to
//! regular capacity only when the lane rule says they must (Uniform
//! Progress, [`spot_worker_decisions::lanes`]; docs/deadlines.md).
//!
//! Each lane is an Azure Storage queue served by its own pool of workers
//! (a Spot scale set or node pool, and a regular one), each scaled by its
//! own autoscale rule or KEDA trigger: nothing here brokers or schedules.
//! What this module adds to those queues:
//!
//! - [`Envelope`]: the deadline (start, due, work) travels in the message,
//!   around the body the handler reads unchanged;
//! - [`LaneRecord`]: which message of a job is the live one, so that a
//!   move (send to the other queue, then delete) can be cut short by a
//!   crash anywhere without losing or doubling the job;
//! - the rule asked where a job is let go: a worker releasing a job (an
//!   eviction, a drain) sends it to the lane the rule picks; a regular
//!   worker whose job got ahead of its line by two switches hands it back
//!   to Spot; and the [lane keeper](LaneKeeper), which any worker runs, one
//!   at a time by a blob lease, moves the jobs waiting in the Spot lane
//!   that have fallen behind;
//! - [`SwitchCost`]: d, what one switch costs a job, as the fleet measures
//!   it ([`FleetSwitchCost`]);
//! - [`enqueue`]: how a producer sends a job with a deadline, to the lane
//!   the rule picks for it;
//! - [`Lanes`] plugs into the queue consumer as its
//!   [`LanePlugin`](spot_worker_consumer::LanePlugin) (the consumer owns the
//!   seam and knows nothing of the lanes), and [`FinishRecords`] is the
//!   one lane step of a worker without lanes.
//!
//! A job without a deadline has no envelope, no lane record and no move:
//! it runs in the Spot lane exactly as it did before lanes existed.

mod keeper;
mod mover;
mod plugin;
mod producer;
mod record;
mod requeue;
mod spot_capacity;
mod switch_cost;

use std::sync::Arc;
use std::time::Duration;

use spot_worker_decisions::goodput::Ledger;
use spot_worker_decisions::lanes::{
    Deadline, Lane, LaneChoice, LanePolicy, Phase, ProgressReadings, Situation, job_progress,
};

use spot_worker_storage::MessageQueue;

pub use keeper::{JobKeyFn, KEEPER_LEASE, KeeperObserver, KeeperPass, LaneKeeper};
pub use plugin::FinishRecords;
pub use producer::{Enqueued, enqueue};
pub use record::{LANE_RECORD_PREFIX, LaneRecord, LaneRecords};
pub use requeue::requeue_text;
pub use spot_capacity::{
    FRESH_FOR_RECHECKS, FleetSpotCapacity, NOTES_PREFIX, PROBE_BODY, SHARDS, SpotCapacity,
    SpotSightings, probe_every, waits_for_spot,
};
pub use spot_worker_envelope::{Carried, ENVELOPE_PREFIX, Envelope, EnvelopeError};
pub use switch_cost::{FleetSwitchCost, SwitchCost};

pub use mover::{MoveJob, Moved};
pub use record::{Arrival, ReadRecord, arrival};
pub use switch_cost::Part;

/// A worker's two lanes: the queue of each, the lane it serves, and what
/// the rule needs besides a job's own figures.
#[derive(Clone)]
pub struct Lanes {
    /// The lane this worker serves (its queue is the one it consumes).
    pub lane: Lane,
    /// The Spot lane's queue.
    pub spot: Arc<dyn MessageQueue>,
    /// The regular lane's queue.
    pub regular: Arc<dyn MessageQueue>,
    /// How long a job may go without the rule being asked about it again:
    /// the lane keeper's period, and that of the check of a job running on
    /// regular capacity. The rule's safety net keeps this much more slack.
    pub recheck: Duration,
    /// d, as the fleet measures it.
    pub switch_cost: Arc<SwitchCost>,
    /// Whether Spot capacity is there, and what the fleet has seen of it.
    pub spot_capacity: Arc<SpotCapacity>,
    /// The rule that picks a job's lane (`SPOT_WORKER_LANE_POLICY`).
    pub policy: LanePolicy,
    /// k: a regular hour's price over a Spot hour's.
    pub price_ratio: f64,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("lane", &self.lane)
            .field("spot", &self.spot.name())
            .field("regular", &self.regular.name())
            .field("recheck", &self.recheck)
            .field("policy", &self.policy)
            .field("price_ratio", &self.price_ratio)
            .finish_non_exhaustive()
    }
}

impl Lanes {
    /// The queue of `lane`.
    pub fn queue(&self, lane: Lane) -> &Arc<dyn MessageQueue> {
        match lane {
            Lane::Spot => &self.spot,
            Lane::Regular => &self.regular,
        }
    }

    /// The lane policy's answer for a job with `deadline` that has done
    /// `progress` of its work, in `lane` and `phase`, now, with Spot
    /// capacity as the fleet last saw it.
    pub fn choose(
        &self,
        deadline: Deadline,
        progress: Duration,
        lane: Lane,
        phase: Phase,
    ) -> LaneChoice {
        let situation = Situation {
            deadline: Some(deadline),
            progress,
            lane,
            phase,
            now: self.spot_capacity.now(),
            switch_cost: self.switch_cost.d(),
            recheck: self.recheck,
            spot_there: self.spot_capacity.there(),
        };
        self.spot_capacity
            .with_history(|history| self.policy.choose(&situation, history, self.price_ratio))
    }
}

/// The work a job has done, as the lane rule takes it, from its last
/// save's stamp: the share of its work it reported done (`fraction`),
/// else the useful time of its goodput ledger as of that save; else none.
/// The precedence is [`job_progress`]'s, the one rule every reader of a
/// job's progress (release, keeper, `status`, completion record) follows.
pub fn progress_of(
    deadline: &Deadline,
    fraction: Option<f64>,
    ledger: Option<&Ledger>,
) -> Duration {
    job_progress(&stamped_progress(fraction, ledger), deadline.work).done
}

/// What a save's stamp says of a job's progress: the share it stamped (the
/// progress file read at the save, else the handler's report) and the
/// useful time of the ledger it stamped.
pub fn stamped_progress(fraction: Option<f64>, ledger: Option<&Ledger>) -> ProgressReadings {
    ProgressReadings {
        finished: false,
        file: None,
        reported: fraction,
        useful: ledger.map(|ledger| Duration::from_millis(ledger.useful_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn progress_is_the_reported_share_else_the_useful_time() {
        let start = SystemTime::UNIX_EPOCH;
        let deadline = Deadline {
            start,
            due: start + Duration::from_secs(100),
            work: Duration::from_secs(80),
        };
        let ledger = Ledger {
            useful_ms: 30_000,
            ..Ledger::default()
        };
        // (reported share, ledger, progress in seconds)
        let rows = [
            (Some(0.5), Some(&ledger), 40.0),
            (Some(1.5), None, 80.0),
            (None, Some(&ledger), 30.0),
            (None, None, 0.0),
        ];
        for (fraction, ledger, seconds) in rows {
            assert_eq!(
                progress_of(&deadline, fraction, ledger).as_secs_f64(),
                seconds,
                "{fraction:?}"
            );
        }
    }
}
