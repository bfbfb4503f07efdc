//! [`Envelope`]: how a job's deadline travels with its message, around the
//! body the handler (or program) reads, which stays byte for byte what the
//! producer sent.
//!
//! Its own crate because two read it and neither owns the other's job: the
//! queue consumer (`spot-worker-consumer`) opens it on every delivery, lanes
//! or not, to hand the handler its body and to count what the job's earlier
//! messages carried; the lanes (`spot-worker-lanes`) write it at enqueue and
//! at every move. It knows nothing of either.
//!
//! A message with a deadline is one header line, then the body:
//!
//! ```text
//! spot-worker-job/1 {"start":"2026-11-27T10:00:00Z","deadline":"2026-11-29T14:00:00Z","work_s":172800.0}
//! <the body, exactly: any bytes, line breaks included>
//! ```
//!
//! The header is one line of ASCII JSON after the reserved prefix
//! [`ENVELOPE_PREFIX`] and a version; the body follows the first line
//! break. The whole (header and body) is what the queue's encoding
//! (`text` or `base64`) carries, so a base64 queue carries any body, a
//! text queue any UTF-8 body, and `enqueue --raw` works as without a
//! deadline. A message without a deadline has no header at all: it is
//! exactly what it was before deadlines existed.
//!
//! Why the deadline travels in the message rather than in a record of the
//! checkpoint container written before it (docs/deadlines.md, "Where the
//! deadline travels"): the message and its deadline are sent in one
//! request and can never be separated (no record without a message, no
//! message without its record, no extra write or read per job); a job
//! keyed by its message id has no key before it is sent, so no record
//! could be written for it first; and an operator who peeks at a queue,
//! or reads a poison record, sees the deadline beside the body, and a
//! requeued poison record keeps it.
//!
//! A body that itself begins with the reserved prefix cannot be sent
//! without a header: it would be read as one. [`Envelope::unwrap`] refuses a
//! header it cannot read (such a message is poisoned with the reason,
//! never run with a body the producer did not send).

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use spot_worker_decisions::goodput::Ledger;
use spot_worker_decisions::lanes::{Deadline, Lane};
use time::OffsetDateTime;

pub use spot_worker_storage::ENVELOPE_PREFIX;

/// The one version of the header this crate writes and reads.
const VERSION: &str = "1";

/// The longest header line read, in bytes: far more than any header
/// written (a few hundred bytes), far less than a queue message.
const MAX_HEADER_LEN: usize = 8 * 1024;

/// A job's deadline and what its earlier messages leave to the next one.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    /// When the job started (its enqueue), when it is due, and its work.
    pub deadline: Deadline,
    /// Which generation of the job's message this is: 0 as enqueued, one
    /// more at every move between lanes. The job's lane record names the
    /// newest; an older copy a crash left behind is discarded unrun.
    pub generation: u32,
    /// The job's key, which a worker takes when its own job-key field does
    /// not give one: a job keyed by its first message's id keeps that key
    /// (and so its checkpoint) on the messages that carry it on after a
    /// move; a producer that knows the body's key field puts the key here
    /// at enqueue (`spot_worker_lanes::Enqueued::keyed`), so that
    /// any reader of the queue (`status`) can name the job.
    pub key: Option<String>,
    /// The lane it was sent to (for people: the queue it is in decides).
    pub lane: Option<Lane>,
    /// The message this one replaced at a move, if any.
    pub moved_from: Option<String>,
    /// What the job's earlier messages recorded: a move gives a job a new
    /// message, and with it a new dequeue count and attempt record.
    pub carried: Carried,
}

/// What a job's earlier messages recorded in their attempt records, carried
/// on to the message that replaced them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// Handler failures recorded: they still count towards the poison
    /// queue.
    #[serde(default)]
    pub failures: u32,
    /// Deliveries of the earlier messages.
    #[serde(default)]
    pub deliveries: u32,
    /// The earlier deliveries' time after their last checkpoint (their
    /// goodput tails), for the job's completion record.
    #[serde(default)]
    pub tails: Ledger,
}

/// A header that does not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the message begins with {ENVELOPE_PREFIX:?} but its deadline header does not read: {reason}"
)]
pub struct EnvelopeError {
    /// Why.
    pub reason: String,
}

/// The header line, as JSON.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    #[serde(with = "time::serde::rfc3339")]
    start: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    deadline: OffsetDateTime,
    work_s: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    generation: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lane: Option<Lane>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moved_from: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    carried: Carried,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_empty(carried: &Carried) -> bool {
    *carried == Carried::default()
}

impl Envelope {
    /// The envelope of a job enqueued now for the first time.
    pub fn new(deadline: Deadline) -> Self {
        Envelope {
            deadline,
            generation: 0,
            key: None,
            lane: None,
            moved_from: None,
            carried: Carried::default(),
        }
    }

    /// The message bytes (before the queue's encoding) that carry `body`
    /// with this envelope.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use spot_worker_decisions::lanes::Deadline;
    /// use spot_worker_envelope::Envelope;
    ///
    /// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    /// let deadline = Deadline { start, due: start + Duration::from_secs(3600), work: Duration::from_secs(600) };
    /// let bytes = Envelope::new(deadline).wrap(b"{\"job_id\":\"j1\"}\nsecond line");
    /// let (envelope, body) = Envelope::unwrap(&bytes).unwrap();
    /// assert_eq!(envelope.unwrap().deadline, deadline);
    /// assert_eq!(body, b"{\"job_id\":\"j1\"}\nsecond line");
    ///
    /// // A message without a header is all body.
    /// assert_eq!(Envelope::unwrap(b"plain").unwrap(), (None, &b"plain"[..]));
    /// ```
    pub fn wrap(&self, body: &[u8]) -> Vec<u8> {
        let header = Header {
            start: OffsetDateTime::from(self.deadline.start),
            deadline: OffsetDateTime::from(self.deadline.due),
            work_s: self.deadline.work.as_secs_f64(),
            generation: self.generation,
            key: self.key.clone(),
            lane: self.lane,
            moved_from: self.moved_from.clone(),
            carried: self.carried,
        };
        // Serializing plain fields cannot fail; an empty object would only
        // make the header unreadable, which `unwrap` then says.
        let json = serde_json::to_string(&header).unwrap_or_default();
        let mut bytes =
            Vec::with_capacity(ENVELOPE_PREFIX.len() + VERSION.len() + json.len() + 2 + body.len());
        bytes.extend_from_slice(ENVELOPE_PREFIX.as_bytes());
        bytes.extend_from_slice(VERSION.as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(json.as_bytes());
        bytes.push(b'\n');
        bytes.extend_from_slice(body);
        bytes
    }

    /// The envelope of a decoded message, if it has one, and its body.
    pub fn unwrap(bytes: &[u8]) -> Result<(Option<Envelope>, &[u8]), EnvelopeError> {
        let Some(rest) = bytes.strip_prefix(ENVELOPE_PREFIX.as_bytes()) else {
            return Ok((None, bytes));
        };
        let invalid = |reason: String| EnvelopeError { reason };
        let end = rest
            .iter()
            .take(MAX_HEADER_LEN)
            .position(|&b| b == b'\n')
            .ok_or_else(|| {
                invalid(format!(
                    "no line break within {MAX_HEADER_LEN} bytes ends the header"
                ))
            })?;
        let (line, body) = (&rest[..end], &rest[end + 1..]);
        let line = std::str::from_utf8(line).map_err(|e| invalid(e.to_string()))?;
        let (version, json) = line.split_once(' ').unwrap_or((line, ""));
        if version != VERSION {
            return Err(invalid(format!(
                "version {version:?}, but this worker reads version {VERSION} only (a newer producer?)"
            )));
        }
        let header: Header = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
        let work = Duration::try_from_secs_f64(header.work_s)
            .map_err(|_| invalid(format!("work_s {} is not a duration", header.work_s)))?;
        let envelope = Envelope {
            deadline: Deadline {
                start: SystemTime::from(header.start),
                due: SystemTime::from(header.deadline),
                work,
            },
            generation: header.generation,
            key: header.key.filter(|key| !key.is_empty()),
            lane: header.lane,
            moved_from: header.moved_from,
            carried: header.carried,
        };
        Ok((Some(envelope), body))
    }
}

impl fmt::Display for Envelope {
    /// `due 2026-11-29T14:00:00Z, 48h of work, generation 1`, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "due {}, {:.0} s of work, generation {}",
            rfc3339(self.deadline.due),
            self.deadline.work.as_secs_f64(),
            self.generation
        )
    }
}

/// `time` as RFC 3339, UTC.
pub fn rfc3339(time: SystemTime) -> String {
    OffsetDateTime::from(time)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod bad_input;

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline() -> Deadline {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        Deadline {
            start,
            due: start + Duration::from_secs(52 * 3600),
            work: Duration::from_millis(48 * 3_600_000 + 250),
        }
    }

    #[test]
    fn every_field_and_any_body_round_trip() {
        let envelope = Envelope {
            deadline: deadline(),
            generation: 3,
            key: Some("m-1".into()),
            lane: Some(Lane::Regular),
            moved_from: Some("m-7".into()),
            carried: Carried {
                failures: 2,
                deliveries: 5,
                tails: Ledger {
                    redone_ms: 1200,
                    regular_ms: 300,
                    ..Ledger::default()
                },
            },
        };
        for body in [
            &b""[..],
            b"{\"job_id\":\"j1\"}",
            b"line 1\r\nline 2\n\n",
            &[0, 255, b'\n', 0x80],
            ENVELOPE_PREFIX.as_bytes(),
        ] {
            let bytes = envelope.wrap(body);
            assert_eq!(
                Envelope::unwrap(&bytes).unwrap(),
                (Some(envelope.clone()), body)
            );
        }
        // A fresh envelope keeps its header short: only what it has.
        let fresh = String::from_utf8(Envelope::new(deadline()).wrap(b"x")).unwrap();
        assert_eq!(
            fresh,
            "spot-worker-job/1 {\"start\":\"2027-01-15T08:00:00Z\",\"deadline\":\"2027-01-17T12:00:00Z\",\"work_s\":172800.25}\nx"
        );
    }

    #[test]
    fn a_header_that_does_not_read_is_an_error_never_a_body() {
        let ok = "{\"start\":\"2027-01-15T08:00:00Z\",\"deadline\":\"2027-01-17T12:00:00Z\",\"work_s\":1}";
        // (message, part of the reason)
        let rows = [
            ("spot-worker-job/1 {}".to_owned(), "no line break"),
            ("spot-worker-job/2 {}\nbody".to_owned(), "version \"2\""),
            ("spot-worker-job/\nbody".to_owned(), "version \"\""),
            ("spot-worker-job/1 not json\nbody".to_owned(), "expected"),
            ("spot-worker-job/1 {}\nbody".to_owned(), "missing field"),
            (
                format!("spot-worker-job/1 {}\nbody", ok.replace("1}", "1,\"z\":1}")),
                "unknown field",
            ),
            (
                format!("spot-worker-job/1 {}\nbody", ok.replace(":1}", ":-1}")),
                "not a duration",
            ),
            (
                format!("spot-worker-job/1 {}", "x".repeat(MAX_HEADER_LEN + 10)),
                "no line break",
            ),
        ];
        for (message, reason) in rows {
            let err = Envelope::unwrap(message.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(reason), "{message:.60}: {err}");
        }
        let good = format!("spot-worker-job/1 {ok}\nbody");
        assert!(Envelope::unwrap(good.as_bytes()).unwrap().0.is_some());
        // Anything else is a plain body, even if it looks close.
        for plain in [
            "spot-worker-jo",
            " spot-worker-job/1 {}\n",
            "SPOT-WORKER-JOB/1",
        ] {
            assert_eq!(
                Envelope::unwrap(plain.as_bytes()).unwrap(),
                (None, plain.as_bytes())
            );
        }
    }
}
