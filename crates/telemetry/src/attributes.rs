//! Attribute keys used on metrics (besides `messaging.destination.name`).

/// Outcome of a lease renewal or checkpoint write.
pub const RESULT: &str = "result";
/// What became of a delivery, on `spot_worker.messages.settled`.
pub const OUTCOME: &str = "outcome";
/// IMDS scheduled-event type (`Preempt`, `Terminate`, ...).
pub const EVENT_TYPE: &str = "spot_worker.scheduled_event.type";
/// Why the checkpoint store does not serve the worker
/// ([`StorageRefusal::as_str`](crate::StorageRefusal::as_str)).
pub const REASON: &str = "reason";
/// The queue, on every per-queue metric.
pub const QUEUE: &str = crate::span::MESSAGING_DESTINATION_NAME;
/// The kind of a job's time, on `spot_worker.job.time`
/// ([`JobTimeKind::as_str`](crate::JobTimeKind::as_str)), and of an
/// interruption, on `spot_worker.interruptions.rate`
/// ([`INTERRUPTION_KINDS`](crate::INTERRUPTION_KINDS)).
pub const KIND: &str = "kind";
/// The lane a job's time ran in, on `spot_worker.job.lane_time`
/// ([`LANES`](crate::LANES)).
pub const LANE: &str = "lane";
/// Whether a job met its deadline, on `spot_worker.job.deadlines`
/// ([`DEADLINE_OUTCOMES`](crate::DEADLINE_OUTCOMES)).
pub const DEADLINE: &str = "deadline";
/// What a worker's time was spent on, on `spot_worker.worker.time`
/// ([`WORKER_PHASES`](crate::WORKER_PHASES)).
pub const PHASE: &str = "phase";
/// The state of this VM's protection from scale-in, on
/// `spot_worker.scale_in.protection`
/// ([`ProtectionState::as_str`](crate::ProtectionState::as_str)).
pub const STATE: &str = "state";

/// Every attribute key on the worker's metrics.
pub const ALL: [&str; 10] = [
    QUEUE, RESULT, OUTCOME, EVENT_TYPE, REASON, KIND, LANE, DEADLINE, PHASE, STATE,
];
