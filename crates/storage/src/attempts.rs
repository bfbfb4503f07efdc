//! Attempt records: what earlier deliveries of a message ended in, kept
//! durably beside the checkpoints so every VM of a fleet counts the same.
//!
//! The queue's own `DequeueCount` cannot tell a failure from an eviction
//! (it rises on every receive), so the consumer records the outcomes that
//! count itself: handler failures, waits for another holder of the same
//! job, and releases on shutdown (evictions; see [`release_note`]). A
//! delivery that ended in none of them (a crash, a lost lease, a wait for
//! the store, a release whose record could not be written in time) leaves
//! no trace, which is what the crash-loop guard measures.
//!
//! [`release_note`]: super::release_note
//!
//! A record lives in the checkpoint store under
//! `.spot-worker/attempts/<message id>` (an in-progress checkpoint whose
//! progress is the record), written with the store's ETag fencing, and is
//! deleted with its message. It is read only when it can matter: after a
//! handler failed, or when the crash-loop guard could fire; a message that
//! succeeds at its first delivery costs no request at all.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spot_worker_decisions::goodput::Ledger;

use crate::checkpoint::{Checkpoint, CheckpointStore, ETag};
use crate::error::StorageError;
use crate::fenced_json::FencedJson;
use crate::queue::MessageId;

use crate::text::shorten_keeping_ends;

/// The longest `last_error` an attempt record keeps.
const MAX_RECORDED_ERROR_LEN: usize = 1024;

/// Outcomes recorded for one message by its earlier deliveries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempts {
    /// Deliveries whose handler failed.
    pub failures: u32,
    /// Deliveries fenced out by another holder of the same job.
    pub waits: u32,
    /// Deliveries released on shutdown (an eviction). Absent from records
    /// written before releases were recorded.
    #[serde(default)]
    pub releases: u32,
    /// The latest failure, for the poison record and for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What earlier deliveries that ended without finishing the job did
    /// after their last saved checkpoint (their tails, see
    /// [`spot_worker_decisions::goodput`]); the delivery that finishes the job adds it.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub goodput: Ledger,
    /// Deliveries without an outcome already counted for the checkpoint
    /// interval (see `no_outcome`), so that each is counted once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub no_outcome_counted: u32,
    /// Releases whose worker settled them (it released the message and
    /// counted the interruption's kind itself); see `interruption_kind`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub released_settled: u32,
    /// Releases noted but never settled, counted as late notices by a
    /// later delivery.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unsettled_counted: u32,
    /// Receives by the lane keeper, which looked at the message and put it
    /// back: no delivery of the job, but each raised its dequeue count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub looks: u32,
    /// The message is being moved to the poison queue: written before its
    /// poison record is sent, so a redelivery finishes the move instead of
    /// running the job again (see [`Poisoning`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poisoning: Option<Poisoning>,
    /// The job's key, written with a failure so that `spot-worker status`
    /// can name the job a failing message belongs to (the record's own
    /// key is the message id). Absent from records written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// A message given up on, durably, before its poison record is sent: what
/// the record says, and whether it was sent. A delivery that finds it
/// finishes the poisoning (sends the record unless it is known sent, marks
/// the job's lane record, deletes the message) without running the job
/// and without counting another failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poisoning {
    /// The poison record's `last_error`, at most
    /// [`MAX_LAST_ERROR_LEN`](super::poison::MAX_LAST_ERROR_LEN) bytes.
    pub last_error: String,
    /// True if `last_error` was cut short.
    #[serde(default)]
    pub last_error_truncated: bool,
    /// The poison record's `failures`.
    pub failures: u32,
    /// Whether the handler's own failure poisoned it (counted as one).
    pub handler_failed: bool,
    /// The poison record was sent (its answer came back). False when it
    /// was not, or when its answer or this mark's update was lost: then a
    /// later delivery sends it again, and the poison queue may hold two
    /// records of the message (same `queue` and `original_id`).
    #[serde(default)]
    pub sent: bool,
}

fn is_empty(ledger: &Ledger) -> bool {
    *ledger == Ledger::default()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Attempts {
    /// Deliveries, of `dequeue_count`, that left no recorded outcome:
    /// `dequeue_count - (failures + waits + releases + looks)`, never below
    /// zero.
    pub fn unexplained(&self, dequeue_count: u32) -> u32 {
        let explained = self
            .failures
            .saturating_add(self.waits)
            .saturating_add(self.releases)
            .saturating_add(self.looks);
        dequeue_count.saturating_sub(explained)
    }

    /// This record with one more look by the lane keeper.
    pub fn looked(&self) -> Attempts {
        Attempts {
            looks: self.looks.saturating_add(1),
            ..self.clone()
        }
    }

    /// This record with one more failure.
    pub fn failed(&self, error: &str) -> Attempts {
        let mut last_error = error.to_owned();
        shorten_keeping_ends(&mut last_error, MAX_RECORDED_ERROR_LEN);
        Attempts {
            failures: self.failures.saturating_add(1),
            last_error: Some(last_error),
            ..self.clone()
        }
    }

    /// This record naming `job`, the key of the job it counts for.
    pub fn for_job(&self, job: &str) -> Attempts {
        Attempts {
            job: Some(job.to_owned()),
            ..self.clone()
        }
    }

    /// This record with one more wait.
    pub fn waited(&self) -> Attempts {
        Attempts {
            waits: self.waits.saturating_add(1),
            ..self.clone()
        }
    }

    /// This record with a delivery's `tail` added.
    pub fn with_tail(&self, tail: &Ledger) -> Attempts {
        Attempts {
            goodput: self.goodput.plus(tail),
            ..self.clone()
        }
    }

    /// This record with one more release on shutdown.
    pub fn released(&self) -> Attempts {
        Attempts {
            releases: self.releases.saturating_add(1),
            ..self.clone()
        }
    }

    /// This record marked as being poisoned with `poisoning`.
    pub fn poisoned(&self, poisoning: Poisoning) -> Attempts {
        Attempts {
            poisoning: Some(poisoning),
            ..self.clone()
        }
    }

    /// This record with one more release settled by its worker.
    pub fn settled_release(&self) -> Attempts {
        Attempts {
            released_settled: self.released_settled.saturating_add(1),
            ..self.clone()
        }
    }
}

/// What `spot-worker status` shows of an attempt record: a job whose
/// handler failed and whose message will be tried again (a checkpoint no
/// save can store, said at the first look, is such a failure).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailingJob {
    /// The job's key (`None` in records written before it was kept).
    pub job: Option<String>,
    /// Deliveries whose handler failed.
    pub failures: u32,
    /// The latest failure (at most 1,024 bytes).
    pub last_error: String,
}

impl FailingJob {
    /// The failing job an attempt record (as stored under
    /// [`crate::ATTEMPT_RECORD_PREFIX`]) describes; `None` if it records
    /// no failure (only waits, releases or looks), or is no attempt
    /// record.
    pub fn from_attempt_record(checkpoint: &Checkpoint) -> Option<FailingJob> {
        let Checkpoint::InProgress { progress } = checkpoint else {
            return None;
        };
        let attempts: Attempts = serde_json::from_value(progress.clone()).ok()?;
        Some(FailingJob {
            job: attempts.job,
            failures: attempts.failures,
            last_error: attempts.last_error.filter(|_| attempts.failures > 0)?,
        })
    }
}

/// A record as read: its content, and the ETag a rewrite must match.
#[derive(Clone, Debug, Default)]
pub struct ReadAttempts {
    /// The record's content (empty when there was none).
    pub attempts: Attempts,
    etag: Option<ETag>,
}

/// Reads and writes attempt records in a checkpoint store.
#[derive(Clone, Debug)]
pub struct AttemptLog {
    store: Arc<dyn CheckpointStore>,
}

impl AttemptLog {
    /// Attempt records kept in `store` (the checkpoint store).
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        AttemptLog { store }
    }

    /// The checkpoint key of `id`'s record.
    pub fn key(id: &MessageId) -> String {
        format!("{}{id}", crate::ATTEMPT_RECORD_PREFIX)
    }

    /// The record of `id`; empty if there is none.
    pub async fn read(&self, id: &MessageId) -> Result<ReadAttempts, StorageError> {
        let key = Self::key(id);
        Ok(match Self::document(&key).read(&*self.store).await? {
            Some((attempts, etag)) => ReadAttempts {
                attempts,
                etag: Some(etag),
            },
            None => ReadAttempts::default(),
        })
    }

    /// The record under `key`, for errors about it.
    fn document(key: &str) -> FencedJson<'_> {
        FencedJson {
            key,
            what: "attempt record",
            kind: "an attempt record",
        }
    }

    /// Replaces the record `read` came from with `attempts`, fenced by its
    /// ETag (a concurrent writer can only be a delivery that took the
    /// message over after a lost lease; its count wins).
    pub async fn write(
        &self,
        id: &MessageId,
        read: &ReadAttempts,
        attempts: &Attempts,
    ) -> Result<(), StorageError> {
        let key = Self::key(id);
        Self::document(&key)
            .write(&*self.store, read.etag.as_ref(), attempts)
            .await
            .map(|_| ())
    }

    /// As [`AttemptLog::write`], returning the record as now stored (its
    /// new ETag), for a delivery that may write it again.
    pub async fn rewrite(
        &self,
        id: &MessageId,
        read: &ReadAttempts,
        attempts: &Attempts,
    ) -> Result<ReadAttempts, StorageError> {
        let key = Self::key(id);
        let etag = Self::document(&key)
            .write(&*self.store, read.etag.as_ref(), attempts)
            .await?;
        Ok(ReadAttempts {
            attempts: attempts.clone(),
            etag: Some(etag),
        })
    }

    /// Deletes `id`'s record, if any: its message is gone.
    pub async fn forget(&self, id: &MessageId) -> Result<(), StorageError> {
        self.store.delete(&Self::key(id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::InMemoryCheckpointStore;

    #[tokio::test]
    async fn records_round_trip_are_fenced_and_forgotten() {
        let log = AttemptLog::new(Arc::new(InMemoryCheckpointStore::new()));
        let id = MessageId::new("m-1");
        let empty = log.read(&id).await.unwrap();
        assert_eq!(empty.attempts, Attempts::default());
        let once = empty.attempts.failed("boom");
        log.write(&id, &empty, &once).await.unwrap();
        let read = log.read(&id).await.unwrap();
        assert_eq!(read.attempts, once);
        // A writer holding the stale (empty) view is refused.
        let stale = log.write(&id, &empty, &once.failed("again")).await;
        assert!(
            matches!(stale, Err(StorageError::Conflict { .. })),
            "{stale:?}"
        );
        log.write(&id, &read, &read.attempts.waited())
            .await
            .unwrap();
        let read = log.read(&id).await.unwrap();
        assert_eq!((read.attempts.failures, read.attempts.waits), (1, 1));
        log.forget(&id).await.unwrap();
        assert_eq!(log.read(&id).await.unwrap().attempts, Attempts::default());
        // Forgetting what is not there is fine.
        log.forget(&id).await.unwrap();
    }

    #[test]
    fn long_errors_are_capped_and_counts_never_overflow() {
        let huge = "é".repeat(10_000);
        let attempts = Attempts {
            failures: u32::MAX,
            waits: u32::MAX,
            releases: u32::MAX,
            last_error: None,
            goodput: Ledger::default(),
            no_outcome_counted: 0,
            released_settled: 0,
            unsettled_counted: 0,
            looks: 0,
            poisoning: None,
            job: None,
        }
        .failed(&huge)
        .released();
        assert_eq!((attempts.failures, attempts.releases), (u32::MAX, u32::MAX));
        assert!(attempts.last_error.as_ref().unwrap().len() <= MAX_RECORDED_ERROR_LEN);
        assert_eq!(attempts.unexplained(5), 0);
    }

    #[test]
    fn unexplained_deliveries_are_those_without_a_recorded_outcome() {
        let record = |failures, waits, releases| Attempts {
            failures,
            waits,
            releases,
            ..Attempts::default()
        };
        // (dequeue count, failures, waits, releases, unexplained)
        let rows = [
            (0, 0, 0, 0, 0),
            (1, 0, 0, 0, 1),
            (6, 0, 0, 5, 1),
            (6, 0, 0, 6, 0),
            (10, 2, 3, 4, 1),
            (10, 1, 1, 1, 7),
            // More recorded than delivered (a record written by a delivery
            // whose receive the count missed): nothing unexplained.
            (3, 0, 0, 5, 0),
            (3, 2, 2, 2, 0),
            (u32::MAX, 0, 0, 0, u32::MAX),
            (u32::MAX, 1, 0, u32::MAX, 0),
        ];
        for (dequeue_count, failures, waits, releases, expected) in rows {
            assert_eq!(
                record(failures, waits, releases).unexplained(dequeue_count),
                expected,
                "dequeue count {dequeue_count}, failures {failures}, waits {waits}, releases {releases}"
            );
        }
        // The lane keeper's looks explain the receives they made.
        let looked = record(1, 0, 2).looked().looked();
        assert_eq!((looked.looks, looked.unexplained(6)), (2, 1));
    }

    #[test]
    fn a_record_shows_a_failing_job_only_if_it_counts_a_failure() {
        let shown = |attempts: Attempts| {
            let progress = serde_json::to_value(attempts).unwrap();
            FailingJob::from_attempt_record(&Checkpoint::InProgress { progress })
        };
        let refused = "the checkpoint directory holds more than 10000 files and directories";
        assert_eq!(
            shown(Attempts::default().failed(refused).for_job("job-7")),
            Some(FailingJob {
                job: Some("job-7".to_owned()),
                failures: 1,
                last_error: refused.to_owned(),
            })
        );
        // Written before records named their job: shown, without a key.
        assert_eq!(
            shown(Attempts::default().failed("boom")).map(|job| job.job),
            Some(None)
        );
        // Waits, releases and looks are no failures.
        assert_eq!(
            shown(Attempts::default().waited().released().looked()),
            None
        );
        let completed = Checkpoint::Completed {
            result: serde_json::json!({"failures": 1, "last_error": "x"}),
        };
        assert_eq!(FailingJob::from_attempt_record(&completed), None);
        let not_a_record = Checkpoint::InProgress {
            progress: serde_json::json!("text"),
        };
        assert_eq!(FailingJob::from_attempt_record(&not_a_record), None);
    }

    #[test]
    fn records_written_before_releases_were_counted_still_read() {
        let old: Attempts =
            serde_json::from_value(serde_json::json!({"failures": 2, "waits": 1})).unwrap();
        assert_eq!(old.releases, 0);
        assert_eq!(old.released().releases, 1);
        assert_eq!(old.released().failures, 2);
    }
}

#[cfg(test)]
mod bad_input;
