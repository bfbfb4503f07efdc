//! What a message asks for ([`PrimesJob`]), what the job stores (its
//! checkpoint progress and its result document), and every way it can fail
//! ([`PrimesError`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spot_worker_storage::StorageError;

use crate::sieve::count_primes;

/// The largest `end` a job may ask for. Beyond it a single job would run for
/// hours and its base primes would need megabytes; split such ranges into
/// several jobs.
pub const MAX_END: u64 = 1_000_000_000_000;

/// The longest job id accepted.
pub const MAX_JOB_ID_LEN: usize = 200;

/// A message's request: count the primes in `[start, end)`, and record the
/// count as the result `{job_id}.json`.
///
/// The message body is JSON: `{"job_id":"j1","start":0,"end":50000000}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimesJob {
    /// Names the job's checkpoint and its result blob, so it may contain only
    /// ASCII letters, digits, `-`, `_` and `.`, must not start with `.`, and
    /// is at most [`MAX_JOB_ID_LEN`] characters.
    pub job_id: String,
    /// First number of the range (included).
    pub start: u64,
    /// End of the range (excluded); `start <= end <= MAX_END`.
    pub end: u64,
}

impl PrimesJob {
    /// A validated job.
    pub fn new(job_id: impl Into<String>, start: u64, end: u64) -> Result<Self, PrimesError> {
        let job = PrimesJob {
            job_id: job_id.into(),
            start,
            end,
        };
        job.validate()?;
        Ok(job)
    }

    /// Parses and validates a message body.
    pub fn parse(body: &[u8]) -> Result<Self, PrimesError> {
        let job: PrimesJob =
            serde_json::from_slice(body).map_err(|e| PrimesError::InvalidMessage {
                reason: e.to_string(),
            })?;
        job.validate()?;
        Ok(job)
    }

    /// Checks the rules documented on the fields.
    pub fn validate(&self) -> Result<(), PrimesError> {
        let invalid = |reason: String| Err(PrimesError::InvalidJob { reason });
        let id = &self.job_id;
        if id.is_empty() || id.len() > MAX_JOB_ID_LEN {
            return invalid(format!(
                "job_id must be 1 to {MAX_JOB_ID_LEN} characters, got {}",
                id.len()
            ));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            || id.starts_with('.')
        {
            return invalid(format!(
                "job_id {id:?} may contain only ASCII letters, digits, '-', '_' and '.', \
                 and must not start with '.' (it names the result blob)"
            ));
        }
        if self.start > self.end {
            return invalid(format!(
                "job {id}: start {} is greater than end {}",
                self.start, self.end
            ));
        }
        if self.end > MAX_END {
            return invalid(format!(
                "job {id}: end {} is above the limit {MAX_END}; split the range into several jobs",
                self.end
            ));
        }
        Ok(())
    }

    /// The message body that asks for this job.
    pub fn to_message(&self) -> String {
        // A struct of a string and two integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The name of the job's result: `{job_id}.json`.
    pub fn result_name(&self) -> String {
        format!("{}.json", self.job_id)
    }
}

/// The result a correct run of `job` writes, computed directly with
/// [`count_primes`] (no chunks, no storage), for checkers:
/// `{"job_id":"j1","start":0,"end":100,"primes":N}`.
pub fn expected_result(job: &PrimesJob) -> Value {
    PrimesResult::of(job, count_primes(job.start, job.end)).to_value()
}

/// The result document, also kept in the completed checkpoint. It records
/// the range, so a job id re-used for another range is recognised instead
/// of answered with the old count. A struct rather than a JSON map so the
/// bytes are always `{"job_id":…,"start":…,"end":…,"primes":…}` in that
/// order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PrimesResult {
    pub(crate) job_id: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) primes: u64,
}

impl PrimesResult {
    pub(crate) fn of(job: &PrimesJob, primes: u64) -> Self {
        PrimesResult {
            job_id: job.job_id.clone(),
            start: job.start,
            end: job.end,
            primes,
        }
    }

    /// Whether this is the result of `job` (same id and range).
    pub(crate) fn is_for(&self, job: &PrimesJob) -> bool {
        (self.job_id.as_str(), self.start, self.end) == (job.job_id.as_str(), job.start, job.end)
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Checkpointed progress: the next number to look at and the primes found
/// in `[start, cursor)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedProgress {
    pub(crate) cursor: u64,
    pub(crate) primes: u64,
}

impl SavedProgress {
    pub(crate) fn to_value(self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Why a primes job failed. The consumer retries failed messages and moves
/// them to the poison queue after a few attempts, with this error's text as
/// the record's `last_error`, so every message says which job and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrimesError {
    /// The body is not JSON of the expected shape.
    #[error(
        "message body is not a primes job (expected JSON like \
         {{\"job_id\":\"j1\",\"start\":0,\"end\":50000000}}): {reason}"
    )]
    InvalidMessage {
        /// What the JSON parser said.
        reason: String,
    },
    /// The body parsed but breaks a rule of [`PrimesJob`].
    #[error("invalid primes job: {reason}")]
    InvalidJob {
        /// Which rule, and the offending value.
        reason: String,
    },
    /// The job's checkpoint does not belong to this job (for example a job
    /// id reused for another range).
    #[error("job {job_id}: its checkpoint does not fit the job: {reason}")]
    BadCheckpoint {
        /// The job.
        job_id: String,
        /// What does not fit.
        reason: String,
    },
    /// The job id was completed for another range: re-enqueue the new range
    /// under a new job id.
    #[error(
        "job {job_id} was already completed for [{done_start}, {done_end}) ({primes} primes); \
         this message asks for [{start}, {end}): send it under a new job_id"
    )]
    DifferentJob {
        /// The job.
        job_id: String,
        /// The completed range's start.
        done_start: u64,
        /// The completed range's end.
        done_end: u64,
        /// The completed count.
        primes: u64,
        /// This message's range start.
        start: u64,
        /// This message's range end.
        end: u64,
    },
    /// A different result for this job is stored already; it was kept.
    #[error("job {job_id}: a different result is stored already and was kept: {stored}")]
    DifferentResult {
        /// The job.
        job_id: String,
        /// The stored result, as text.
        stored: String,
    },
    /// A checkpoint or result operation failed. The cause is also the
    /// error's `source`, so the consumer recognises a checkpoint write
    /// fenced off by another worker ([`StorageError::Conflict`]).
    // The cause is in the text too: the consumer records only the top-level
    // message.
    #[error("job {job_id}: {action} failed: {source}")]
    Storage {
        /// The job.
        job_id: String,
        /// What was being done.
        action: &'static str,
        /// The storage error.
        #[source]
        source: StorageError,
    },
    /// The worker is shutting down (or lost the message's lease) and the
    /// job stopped. Its progress up to `saved_cursor` is checkpointed; the
    /// next delivery resumes from there.
    #[error(
        "job {job_id} interrupted by shutdown or a lost lease: progress is checkpointed \
         at {saved_cursor} of [{start}, {end}), the next delivery resumes from there"
    )]
    Interrupted {
        /// The job.
        job_id: String,
        /// Where the saved progress ends.
        saved_cursor: u64,
        /// The job's range start.
        start: u64,
        /// The job's range end.
        end: u64,
    },
    /// A sieve task died (it panicked or the runtime is shutting down).
    #[error("job {job_id}: the sieve task failed: {reason}")]
    Sieve {
        /// The job.
        job_id: String,
        /// What the runtime reported.
        reason: String,
    },
}

impl PrimesError {
    /// True if retrying cannot help: the message is not a valid job, or
    /// asks for something that contradicts what is stored (another range
    /// under the same job id, a different result already written). The
    /// handler marks these [`permanent`](spot_worker_consumer::permanent).
    pub fn is_permanent(&self) -> bool {
        match self {
            PrimesError::InvalidMessage { .. }
            | PrimesError::InvalidJob { .. }
            | PrimesError::BadCheckpoint { .. }
            | PrimesError::DifferentJob { .. } => true,
            PrimesError::DifferentResult { .. } => true,
            PrimesError::Storage { .. }
            | PrimesError::Interrupted { .. }
            | PrimesError::Sieve { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips() {
        let job = PrimesJob::new("j1", 0, 50_000_000).unwrap();
        assert_eq!(
            job.to_message(),
            r#"{"job_id":"j1","start":0,"end":50000000}"#
        );
        assert_eq!(PrimesJob::parse(job.to_message().as_bytes()).unwrap(), job);
        assert_eq!(job.result_name(), "j1.json");
    }

    #[test]
    fn bad_messages_say_what_is_wrong() {
        let cases: [(&[u8], &str); 8] = [
            (
                b"not json",
                "message body is not a primes job (expected JSON like",
            ),
            (br#"{"job_id":"j1","start":0}"#, "missing field `end`"),
            (br#"{"job_id":"j1","start":-1,"end":5}"#, "invalid value"),
            (
                br#"{"job_id":"j1","start":10,"end":5}"#,
                "start 10 is greater than end 5",
            ),
            (
                br#"{"job_id":"","start":0,"end":5}"#,
                "job_id must be 1 to 200",
            ),
            (
                br#"{"job_id":"a/b","start":0,"end":5}"#,
                "may contain only ASCII",
            ),
            (
                br#"{"job_id":".hidden","start":0,"end":5}"#,
                "must not start with '.'",
            ),
            (
                br#"{"job_id":"j1","start":0,"end":18446744073709551615}"#,
                "split the range into several jobs",
            ),
        ];
        for (body, expected) in cases {
            let err = PrimesJob::parse(body).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn an_empty_range_is_a_valid_job() {
        assert!(PrimesJob::new("j", 7, 7).is_ok());
    }

    #[test]
    fn the_expected_result_is_the_documented_document() {
        let job = PrimesJob::new("j1", 0, 100).unwrap();
        assert_eq!(
            expected_result(&job),
            serde_json::json!({"job_id": "j1", "start": 0, "end": 100, "primes": 25})
        );
        let bytes = PrimesResult::of(&job, 25).to_bytes();
        assert_eq!(bytes, br#"{"job_id":"j1","start":0,"end":100,"primes":25}"#);
    }
}
