//! What a run did, and how the worker stopped.

use std::time::Duration;

use spot_worker_storage::ConsumerStats;

use crate::shutdown::DrainTrigger;

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// What the consumer did.
    pub stats: ConsumerStats,
    /// How the worker stopped.
    pub drain: DrainReport,
}

/// How the worker stopped.
#[derive(Debug, Clone)]
pub struct DrainReport {
    /// What started it.
    pub trigger: DrainTrigger,
    /// From the notice to every message settled or released.
    pub notice_to_drained: Duration,
    /// Whether handlers were still running at the release instant and had
    /// to be dropped.
    pub released_running_handlers: bool,
    /// Whether the drain finished before the hard deadline.
    pub met_deadline: bool,
    /// Whether the triggering event was approved afterwards.
    pub approved_event: bool,
    /// How many times intake resumed because the notice of an earlier drain
    /// was withdrawn (the event cancelled before it started).
    pub resumed: u32,
}
