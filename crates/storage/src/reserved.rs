//! The words spot-worker keeps for itself, and the one rule deciding
//! whether a job's body or key uses them.
//!
//! Why: a worker reads some bodies as its own messages, not as jobs. A
//! plain body `spot-worker-probe/1` is a probe for Spot capacity, deleted
//! unrun by every worker with lanes; one beginning `spot-worker-job/` is
//! read as a deadline's envelope, and poisoned when its header does not
//! read. And the workers keep their own records (lane records, fleet
//! documents, attempt and completion records, chunks, write probes) under
//! `.spot-worker/` in the checkpoint container, where a job's checkpoint
//! is stored under its key: a job keyed `.spot-worker/lanes/j1` would
//! overwrite another job's lane record. So producers refuse such bodies
//! and keys ([`refuse_reserved_body`], [`refuse_reserved_key`]: `Enqueued::new`, the
//! lanes' `enqueue`, `spot-worker enqueue` and its `--raw`), and a worker
//! poisons a job whose key is reserved before anything touches its
//! checkpoint, with the reason in the poison record.

use crate::error::StorageError;

/// Where the workers keep their own records in the checkpoint container
/// (and their write probes in the result container).
pub const WORKER_RECORDS_PREFIX: &str = ".spot-worker/";

/// What begins a probe's body, whatever its version ([`PROBE_BODY`] is
/// the one sent now): a producer may send none of them, so that a later
/// version of the probe can never be a job's body.
pub const PROBE_PREFIX: &str = "spot-worker-probe/";

/// The body of a probe: a message that asks the Spot pool for a worker
/// (`spot-worker-lanes`). A Spot worker deletes it unrun; no handler ever
/// sees it.
pub const PROBE_BODY: &[u8] = b"spot-worker-probe/1";

/// What begins every message that carries a deadline
/// (`spot-worker-lanes`' envelope): the prefix, then the format's version,
/// a space and the header.
pub const ENVELOPE_PREFIX: &str = "spot-worker-job/";

/// Which of the worker's own words a body or a job key uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// A body beginning [`PROBE_PREFIX`]: a worker with lanes deletes
    /// [`PROBE_BODY`] unrun.
    Probe,
    /// A body beginning [`ENVELOPE_PREFIX`]: read as a deadline's header,
    /// poisoned when it does not read.
    Envelope,
    /// A job key under [`WORKER_RECORDS_PREFIX`], where the workers' own
    /// records live.
    WorkerRecords,
}

impl Reserved {
    /// What the word is for, and what to do instead.
    pub fn explain(self) -> String {
        match self {
            Reserved::Probe => format!(
                "a body beginning {PROBE_PREFIX:?} is reserved for the workers' probes for Spot \
                 capacity (a worker with lanes deletes {:?} unrun); wrap the body (in JSON, say)",
                String::from_utf8_lossy(PROBE_BODY)
            ),
            Reserved::Envelope => format!(
                "a body beginning {ENVELOPE_PREFIX:?} is reserved for the envelope that carries a \
                 deadline (a worker reads it as the header and poisons one that does not read); \
                 wrap the body (in JSON, say), or give the deadline with --deadline and --work"
            ),
            Reserved::WorkerRecords => format!(
                "a job key under {WORKER_RECORDS_PREFIX:?} is reserved for the workers' own \
                 records in the checkpoint container (lane records, fleet documents, attempt \
                 records); choose a key outside it"
            ),
        }
    }
}

/// Whether `body`, as a producer hands it over (before any envelope or
/// encoding), is one a worker reads as its own message.
pub fn reserved_body(body: &[u8]) -> Option<Reserved> {
    if body.starts_with(PROBE_PREFIX.as_bytes()) {
        Some(Reserved::Probe)
    } else if body.starts_with(ENVELOPE_PREFIX.as_bytes()) {
        Some(Reserved::Envelope)
    } else {
        None
    }
}

/// Whether the job key `key` lies where the workers keep their own
/// records: `.spot-worker` itself or anything under it, with any leading
/// `/` ignored (a store may address `/.spot-worker/x` as `.spot-worker/x`).
pub fn reserved_job_key(key: &str) -> Option<Reserved> {
    let key = key.trim_start_matches('/');
    let name = WORKER_RECORDS_PREFIX.trim_end_matches('/');
    (key == name || key.starts_with(WORKER_RECORDS_PREFIX)).then_some(Reserved::WorkerRecords)
}

/// Refuses a reserved `body` with [`StorageError::InvalidArgument`], saying
/// why and what to do instead.
///
/// ```
/// use spot_worker_storage::{StorageError, refuse_reserved_body};
///
/// assert!(refuse_reserved_body(b"{\"job_id\":\"j1\"}").is_ok());
/// let refused = refuse_reserved_body(b"spot-worker-probe/1").unwrap_err();
/// assert!(matches!(refused, StorageError::InvalidArgument(_)));
/// assert!(refused.to_string().contains("reserved"), "{refused}");
/// ```
pub fn refuse_reserved_body(body: &[u8]) -> Result<(), StorageError> {
    match reserved_body(body) {
        None => Ok(()),
        Some(reserved) => Err(StorageError::InvalidArgument(reserved.explain())),
    }
}

/// Refuses a reserved job `key` with [`StorageError::InvalidArgument`],
/// naming it.
///
/// ```
/// use spot_worker_storage::refuse_reserved_key;
///
/// assert!(refuse_reserved_key("j1").is_ok());
/// let refused = refuse_reserved_key(".spot-worker/lanes/j1").unwrap_err();
/// assert!(refused.to_string().contains("\".spot-worker/lanes/j1\""), "{refused}");
/// ```
pub fn refuse_reserved_key(key: &str) -> Result<(), StorageError> {
    match reserved_job_key(key) {
        None => Ok(()),
        Some(reserved) => Err(StorageError::InvalidArgument(format!(
            "the job key {key:?}: {}",
            reserved.explain()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_bodies() {
        let table: [(&[u8], Option<Reserved>); 12] = [
            (PROBE_BODY, Some(Reserved::Probe)),
            (b"spot-worker-probe/1", Some(Reserved::Probe)),
            (b"spot-worker-probe/2", Some(Reserved::Probe)),
            (b"spot-worker-probe/1\n", Some(Reserved::Probe)),
            (b"spot-worker-job/1 {}\nbody", Some(Reserved::Envelope)),
            (b"spot-worker-job/", Some(Reserved::Envelope)),
            (b"spot-worker-job/garbage", Some(Reserved::Envelope)),
            // Only the very beginning counts, as the worker reads it.
            (b" spot-worker-job/1 {}\n", None),
            (b"{\"body\":\"spot-worker-probe/1\"}", None),
            (b"spot-worker-probe", None),
            (b"spot-worker-jobs", None),
            (b"", None),
        ];
        for (body, expected) in table {
            assert_eq!(
                reserved_body(body),
                expected,
                "{}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(refuse_reserved_body(body).is_ok(), expected.is_none());
        }
    }

    #[test]
    fn reserved_job_keys() {
        let table = [
            (".spot-worker/lanes/j1", true),
            (".spot-worker/attempts/m1", true),
            (".spot-worker/fleet/spot-capacity", true),
            (".spot-worker/", true),
            (".spot-worker", true),
            ("/.spot-worker/goodput/j1", true),
            ("j1", false),
            (".spot-workers/j1", false),
            (".spot-worker-j1", false),
            ("a/.spot-worker/j1", false),
            (".Spot-Worker/j1", false),
            ("", false),
        ];
        for (key, reserved) in table {
            assert_eq!(
                reserved_job_key(key),
                reserved.then_some(Reserved::WorkerRecords),
                "{key}"
            );
            assert_eq!(refuse_reserved_key(key).is_err(), reserved, "{key}");
        }
    }

    /// The words are the ones the worker reads: the probe it sends and
    /// the prefix of its records.
    #[test]
    fn the_words_are_the_workers_own() {
        assert_eq!(reserved_body(PROBE_BODY), Some(Reserved::Probe));
        for key in [
            crate::LANE_RECORD_PREFIX,
            crate::COMPLETION_RECORD_PREFIX,
            crate::FleetLedger::PREFIX,
        ] {
            assert_eq!(
                reserved_job_key(&format!("{key}j1")),
                Some(Reserved::WorkerRecords),
                "{key}"
            );
        }
    }
}
