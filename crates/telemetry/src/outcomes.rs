//! The bounded values of the worker's metric attributes: each outcome is an
//! enum, so a dashboard query and the code agree on every value
//! ([`values`] lists them by attribute key).

use crate::attributes;

/// Result of renewing a message's lease (its visibility timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseOutcome {
    /// Renewed.
    Ok,
    /// The message's pop receipt no longer matches: another consumer may
    /// have it now.
    Lost,
    /// The renewal failed for another reason (network, throttling...).
    Error,
}

impl LeaseOutcome {
    /// The `result` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Lost => "lost",
            Self::Error => "error",
        }
    }
}

/// Result of writing a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointOutcome {
    /// Written.
    Ok,
    /// Rejected because someone else wrote first (ETag mismatch).
    Conflict,
    /// The write failed for another reason.
    Error,
}

impl CheckpointOutcome {
    /// The `result` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Conflict => "conflict",
            Self::Error => "error",
        }
    }
}

/// Why the checkpoint store does not serve the worker, for
/// [`Metrics::set_storage_refused`](crate::Metrics::set_storage_refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageRefusal {
    /// It refuses the worker's credentials or their permissions (401/403).
    Refused,
    /// Its container is missing and could not be created again (yet).
    MissingContainer,
}

impl StorageRefusal {
    pub(crate) const ALL: [StorageRefusal; 2] =
        [StorageRefusal::Refused, StorageRefusal::MissingContainer];

    /// The `reason` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageRefusal::Refused => "refused",
            StorageRefusal::MissingContainer => "missing_container",
        }
    }

    pub(crate) fn code(refusal: Option<Self>) -> u8 {
        match refusal {
            None => 0,
            Some(StorageRefusal::Refused) => 1,
            Some(StorageRefusal::MissingContainer) => 2,
        }
    }
}

/// What became of one delivery, the `outcome` attribute of
/// `spot_worker.messages.settled`: the consumer's own settlement, so an
/// eviction (`released`) or a wait is never confused with a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageOutcome {
    /// Handled successfully and deleted.
    Succeeded,
    /// Deleted unrun: its job was completed already.
    SkippedCompleted,
    /// The handler failed; retried after a backoff (a counted failure).
    Retried,
    /// Moved to the poison queue.
    Poisoned,
    /// Handed back unprocessed at once, uncounted (a drain: a Spot eviction).
    Released,
    /// Fenced out by another holder of the job; checked again later.
    WaitedForPeer,
    /// The checkpoint store could not be reached; tried again later.
    WaitedForStore,
    /// Another consumer took the message.
    LeaseLost,
    /// A job with a deadline handed to the other lane (sent to its queue,
    /// deleted here), uncounted.
    Moved,
    /// An older copy of a job moved between lanes, deleted unrun.
    Superseded,
    /// A probe for Spot capacity, deleted unrun.
    ProbeTaken,
}

impl MessageOutcome {
    /// Every outcome, in the order the docs list them.
    pub const ALL: [MessageOutcome; 11] = [
        Self::Succeeded,
        Self::SkippedCompleted,
        Self::Retried,
        Self::Poisoned,
        Self::Released,
        Self::WaitedForPeer,
        Self::WaitedForStore,
        Self::LeaseLost,
        Self::Moved,
        Self::Superseded,
        Self::ProbeTaken,
    ];

    /// The `outcome` attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::SkippedCompleted => "skipped_completed",
            Self::Retried => "retried",
            Self::Poisoned => "poisoned",
            Self::Released => "released",
            Self::WaitedForPeer => "waited_for_peer",
            Self::WaitedForStore => "waited_for_store",
            Self::LeaseLost => "lease_lost",
            Self::Moved => "moved",
            Self::Superseded => "superseded",
            Self::ProbeTaken => "probe_taken",
        }
    }
}

/// The IMDS scheduled-event types the `spot_worker.scheduled_event.type`
/// attribute takes; anything else is `other`.
pub const EVENT_TYPES: [&str; 6] = [
    "Freeze",
    "Reboot",
    "Redeploy",
    "Preempt",
    "Terminate",
    "other",
];

/// The kind of a finished job's time, on `spot_worker.job.time` (what
/// each means: docs/goodput.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobTimeKind {
    /// Handler time whose progress survived.
    Useful,
    /// Handler time whose progress was lost and computed again.
    Redone,
    /// Time blocked on checkpoint saves.
    Checkpointing,
    /// Time a delivery held the job before its handler started.
    Waiting,
}

impl JobTimeKind {
    /// Every kind.
    pub const ALL: [JobTimeKind; 4] = [
        JobTimeKind::Useful,
        JobTimeKind::Redone,
        JobTimeKind::Checkpointing,
        JobTimeKind::Waiting,
    ];

    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            JobTimeKind::Useful => "useful",
            JobTimeKind::Redone => "redone",
            JobTimeKind::Checkpointing => "checkpointing",
            JobTimeKind::Waiting => "waiting",
        }
    }
}

/// Every value the attribute `key` takes; empty for a free-form one (the
/// queue name) or a key the worker does not emit.
///
/// ```
/// use spot_worker_telemetry::{attributes, values};
///
/// assert!(values(attributes::OUTCOME).contains(&"released"));
/// assert!(values(attributes::QUEUE).is_empty());
/// ```
pub fn values(key: &str) -> Vec<&'static str> {
    match key {
        attributes::OUTCOME => MessageOutcome::ALL.iter().map(|o| o.as_str()).collect(),
        attributes::RESULT => {
            let mut values: Vec<_> = [LeaseOutcome::Ok, LeaseOutcome::Lost, LeaseOutcome::Error]
                .map(LeaseOutcome::as_str)
                .to_vec();
            values.push(CheckpointOutcome::Conflict.as_str());
            values
        }
        attributes::EVENT_TYPE => EVENT_TYPES.to_vec(),
        attributes::REASON => StorageRefusal::ALL.map(StorageRefusal::as_str).to_vec(),
        attributes::KIND => JobTimeKind::ALL
            .map(JobTimeKind::as_str)
            .into_iter()
            .chain(crate::INTERRUPTION_KINDS.iter().copied())
            .collect(),
        attributes::LANE => crate::LANES.to_vec(),
        attributes::DEADLINE => crate::DEADLINE_OUTCOMES.to_vec(),
        attributes::PHASE => crate::WORKER_PHASES.to_vec(),
        attributes::STATE => crate::ProtectionState::ALL
            .map(crate::ProtectionState::as_str)
            .to_vec(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_attribute_values() {
        assert_eq!(LeaseOutcome::Ok.as_str(), "ok");
        assert_eq!(LeaseOutcome::Lost.as_str(), "lost");
        assert_eq!(LeaseOutcome::Error.as_str(), "error");
        assert_eq!(CheckpointOutcome::Ok.as_str(), "ok");
        assert_eq!(CheckpointOutcome::Conflict.as_str(), "conflict");
        assert_eq!(CheckpointOutcome::Error.as_str(), "error");
        let outcomes = values(attributes::OUTCOME);
        assert_eq!(outcomes.len(), MessageOutcome::ALL.len());
        assert!(outcomes.contains(&"released") && outcomes.contains(&"waited_for_store"));
        assert_eq!(
            values(attributes::RESULT),
            ["ok", "lost", "error", "conflict"]
        );
    }
}
