//! Instrument names, so dashboards and tests do not repeat string literals.

/// Counter of deliveries settled, by `outcome` ([`MessageOutcome`](crate::MessageOutcome)) (`{message}`).
pub const MESSAGES_SETTLED: &str = "spot_worker.messages.settled";
/// Counter of handler failures the consumer counts towards the poison
/// queue: never an eviction, a wait or a lost lease (`{message}`).
pub const MESSAGES_FAILED: &str = "spot_worker.messages.failed";
/// Histogram of successful processing time (`s`).
pub const MESSAGE_PROCESS_DURATION: &str = "spot_worker.message.process.duration";
/// Counter of lease (visibility timeout) renewals by result (`{renewal}`).
pub const LEASE_RENEWALS: &str = "spot_worker.lease.renewals";
/// Counter of checkpoint writes by result (`{write}`).
pub const CHECKPOINT_WRITES: &str = "spot_worker.checkpoint.writes";
/// Histogram of checkpoint write latency (`s`).
pub const CHECKPOINT_WRITE_DURATION: &str = "spot_worker.checkpoint.write.duration";
/// Counter of IMDS scheduled-event notices by event type (`{notice}`).
pub const EVICTION_NOTICES: &str = "spot_worker.eviction.notices";
/// Histogram of time from eviction notice to fully drained (`s`).
pub const DRAIN_DURATION: &str = "spot_worker.drain.duration";
/// Gauge: 1 while the worker reports ready, else 0 (`1`).
pub const READY: &str = "spot_worker.ready";
/// Gauge: 1 while the checkpoint store refuses the worker or misses its
/// container and intake is paused, else 0, by `reason` (`1`).
pub const STORAGE_REFUSED: &str = "spot_worker.storage.refused";
/// Counter of finished jobs' time, across all their deliveries, by
/// `kind` ([`JobTimeKind`](crate::JobTimeKind)): useful, redone,
/// checkpointing, waiting (`s`).
pub const JOB_TIME: &str = "spot_worker.job.time";
/// Histogram of finished jobs' goodput: useful time over all their
/// time (`1`).
pub const JOB_GOODPUT: &str = "spot_worker.job.goodput";
/// Counter of deliveries of finished jobs that left no accounting (cut
/// before their first checkpoint save): their time is missing from
/// `spot_worker.job.time` (`{delivery}`).
pub const JOB_UNACCOUNTED: &str = "spot_worker.job.unaccounted_deliveries";
/// Gauge: the checkpoint interval handed out now (`s`).
pub const CHECKPOINT_INTERVAL: &str = "spot_worker.checkpoint.interval";
/// Gauge: the recent time one checkpoint save blocked the job (`s`).
pub const CHECKPOINT_COST: &str = "spot_worker.checkpoint.cost";
/// Gauge: estimated interruptions per job-hour, by `kind`
/// (`{interruption}/h`).
pub const INTERRUPTION_RATE: &str = "spot_worker.interruptions.rate";

/// Counter of finished jobs with a deadline, by `deadline`: `met` or
/// `missed` (`{job}`).
pub const JOB_DEADLINES: &str = "spot_worker.job.deadlines";
/// Counter of finished jobs' time by `lane`: `spot`, `regular` (`s`).
pub const JOB_LANE_TIME: &str = "spot_worker.job.lane_time";
/// Counter of jobs the lane keeper moved to the regular lane (`{job}`).
pub const LANES_KEEPER_MOVED: &str = "spot_worker.lanes.keeper_moved";
/// Gauge: jobs with a deadline waiting in the Spot lane at risk of
/// missing it, as the lane keeper last saw them (`{job}`).
pub const LANES_AT_RISK: &str = "spot_worker.lanes.at_risk";
/// Gauge: d, the switch cost the lane rule uses (`s`).
pub const LANES_SWITCH_COST: &str = "spot_worker.lanes.switch_cost";
/// Counter: this worker's paid time since it started, by `phase`
/// ([`WORKER_PHASES`](crate::WORKER_PHASES)) and `lane` (`s`).
pub const WORKER_TIME: &str = "spot_worker.worker.time";
/// Counter of writes of the pod's `controller.kubernetes.io/pod-deletion-cost`,
/// by `result`: `ok`, `throttled`, `forbidden`, `server_error`,
/// `refused`, `unreachable` (`{write}`).
pub const POD_DELETION_COST_WRITES: &str = "spot_worker.pod_deletion_cost.writes";
/// Gauge: 1 while writes of the pod's deletion cost keep failing (`1`).
pub const POD_DELETION_COST_FAILING: &str = "spot_worker.pod_deletion_cost.failing";
/// Gauge: 1 for the state of this VM's protection from scale-in, by
/// `state` ([`ProtectionState`](crate::ProtectionState)), 0 for the
/// others (`1`).
pub const SCALE_IN_PROTECTION: &str = "spot_worker.scale_in.protection";

/// Every metric the worker emits, for checks of dashboards and queries.
pub const ALL: [&str; 25] = [
    MESSAGES_SETTLED,
    MESSAGES_FAILED,
    MESSAGE_PROCESS_DURATION,
    LEASE_RENEWALS,
    CHECKPOINT_WRITES,
    CHECKPOINT_WRITE_DURATION,
    EVICTION_NOTICES,
    DRAIN_DURATION,
    READY,
    STORAGE_REFUSED,
    JOB_TIME,
    JOB_GOODPUT,
    JOB_UNACCOUNTED,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_COST,
    INTERRUPTION_RATE,
    JOB_DEADLINES,
    JOB_LANE_TIME,
    LANES_KEEPER_MOVED,
    LANES_AT_RISK,
    LANES_SWITCH_COST,
    WORKER_TIME,
    POD_DELETION_COST_WRITES,
    POD_DELETION_COST_FAILING,
    SCALE_IN_PROTECTION,
];
