//! The record written to `<queue>-poison` when a message is given up on:
//! the original message text, byte for byte, plus what is needed to
//! investigate and replay it, because the poison queue assigns a new id and
//! resets the dequeue count.
//!
//! The record is plain JSON text whatever the work queue's encoding, and
//! `body` is the original text exactly as it was on the work queue (still
//! base64 for a base64 queue): nothing is encoded twice. An original too big
//! to fit beside the metadata into one queue message (64 KiB) is stored as
//! a blob (a claim check) and the record points at it, with its length and
//! SHA-256, so nothing is ever cut short.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use spot_worker_storage::MessageEncoding;
use spot_worker_storage::StorageError;
use spot_worker_storage::shorten_keeping_ends;

/// The JSON document a poisoned message becomes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoisonRecord {
    /// The queue the message came from.
    pub queue: String,
    /// The message's id in that queue.
    pub original_id: String,
    /// How many times it had been received (evictions included).
    pub dequeue_count: u32,
    /// How many of those deliveries failed in the handler.
    #[serde(default)]
    pub failures: u32,
    /// When it was first sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub inserted_at: Option<OffsetDateTime>,
    /// When it was moved to the poison queue.
    #[serde(with = "time::serde::rfc3339")]
    pub poisoned_at: OffsetDateTime,
    /// Why it was given up on: the handler's permanent error, its last
    /// failure after too many, why the body did not decode, or the
    /// crash-loop guard (at most [`MAX_LAST_ERROR_LEN`] bytes, unless
    /// `last_error_truncated`).
    pub last_error: String,
    /// True if `last_error` was cut short.
    #[serde(default)]
    pub last_error_truncated: bool,
    /// How the original text encodes the message's bytes (the work queue's
    /// encoding).
    #[serde(default)]
    pub encoding: MessageEncoding,
    /// The original message text, exactly as it was on the queue; `None`
    /// when it is stored as a blob (`body_blob`).
    #[serde(default)]
    pub body: Option<String>,
    /// Where the original text is stored when it did not fit here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_blob: Option<BodyBlob>,
}

/// A claim check: the blob holding a poisoned message's original text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyBlob {
    /// The blob container (the poison payload store's name).
    pub container: String,
    /// The blob's name in it.
    pub name: String,
    /// Length of the original text in bytes.
    pub len: usize,
    /// SHA-256 of the original text, lowercase hex, to check a download.
    pub sha256: String,
}

impl BodyBlob {
    /// The claim check for `text` stored as `name` in `container`.
    pub fn new(container: &str, name: String, text: &str) -> Self {
        BodyBlob {
            container: container.to_owned(),
            name,
            len: text.len(),
            sha256: sha256_hex(text.as_bytes()),
        }
    }

    /// True if `bytes` are exactly the original this points at.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.len() == self.len && sha256_hex(bytes) == self.sha256
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The most of `last_error` a poison record keeps: enough for any error
/// chain a person reads, small next to the 64 KiB message limit.
pub const MAX_LAST_ERROR_LEN: usize = 4 * 1024;

/// The most a poison message may take, counted as the queue service counts
/// it once XML-escaped: 64 KiB, less a margin.
pub const MAX_POISON_MESSAGE_LEN: usize = 63 * 1024;

impl PoisonRecord {
    /// The record as queue message text (plain JSON), if it fits into one
    /// message; `None` if it does not (then store the body as a blob).
    pub fn to_message_text(&self) -> Result<Option<String>, StorageError> {
        let text = serde_json::to_string(self)
            .map_err(|e| StorageError::InvalidArgument(format!("poison record: {e}")))?;
        let text = xml_safe_json(text);
        Ok((xml_escaped_len(&text) <= MAX_POISON_MESSAGE_LEN).then_some(text))
    }

    /// Caps `last_error` at [`MAX_LAST_ERROR_LEN`].
    pub(crate) fn cap_last_error(&mut self) {
        if self.last_error.len() > MAX_LAST_ERROR_LEN {
            shorten_keeping_ends(&mut self.last_error, MAX_LAST_ERROR_LEN);
            self.last_error_truncated = true;
        }
    }

    /// Parses a poison queue message.
    pub fn from_message_text(text: &str) -> Result<Self, StorageError> {
        serde_json::from_str(text).map_err(|e| StorageError::InvalidData {
            what: "poison record".to_owned(),
            reason: e.to_string(),
        })
    }
}

/// JSON text that a queue message can carry: serde_json writes every
/// control character escaped, but U+FFFE and U+FFFF as they are, and a
/// program's stderr in `last_error` may hold them; written as `\ufffe` and
/// `\uffff` instead, the same JSON. (Outside strings JSON has no such
/// character, so every one is inside a string.)
fn xml_safe_json(text: String) -> String {
    if !text.contains(['\u{fffe}', '\u{ffff}']) {
        return text;
    }
    text.replace('\u{fffe}', "\\ufffe")
        .replace('\u{ffff}', "\\uffff")
}

/// The length of `text` once XML-escaped as a queue message is sent.
fn xml_escaped_len(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'&' => 4,
                b'<' | b'>' => 3,
                b'"' | b'\'' => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// The poison queue's name for a queue: `<queue>-poison` (the Azure
/// Functions convention, so existing tooling finds it).
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}-poison")
}

/// The blob name of a poisoned message's original: one per queue and
/// message id, so poisoning the same message twice writes the same blob.
pub fn poison_body_blob_name(queue: &str, original_id: &str) -> String {
    format!("{queue}/{original_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_any_text_is_a_message_the_queue_can_carry() {
        let mut poisoned = record("body");
        poisoned.last_error = "stderr: \u{1}\u{1b}[31m \u{fffe}\u{ffff} end".to_owned();
        let text = poisoned.to_message_text().unwrap().unwrap();
        assert_eq!(spot_worker_storage::unsendable_char(&text), None, "{text}");
        assert_eq!(PoisonRecord::from_message_text(&text).unwrap(), poisoned);
    }

    fn record(body: &str) -> PoisonRecord {
        PoisonRecord {
            queue: "jobs".into(),
            original_id: "id".into(),
            dequeue_count: 5,
            failures: 5,
            inserted_at: None,
            poisoned_at: OffsetDateTime::UNIX_EPOCH,
            last_error: "boom".into(),
            last_error_truncated: false,
            encoding: MessageEncoding::Text,
            body: Some(body.to_owned()),
            body_blob: None,
        }
    }

    #[test]
    fn small_records_round_trip_exactly() {
        for body in ["small", "é\"\\x<&>'", ""] {
            let text = record(body).to_message_text().unwrap().expect("fits");
            let back = PoisonRecord::from_message_text(&text).unwrap();
            assert_eq!(back, record(body));
        }
    }

    #[test]
    fn records_that_would_not_fit_once_escaped_are_refused_not_cut() {
        // 20 KiB of quotes is 120 KiB escaped.
        assert!(
            record(&"\"".repeat(20 * 1024))
                .to_message_text()
                .unwrap()
                .is_none()
        );
        // Near the limit without escapes: fits.
        assert!(
            record(&"a".repeat(60 * 1024))
                .to_message_text()
                .unwrap()
                .is_some()
        );
        assert!(
            record(&"a".repeat(64 * 1024))
                .to_message_text()
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_claim_check_recognises_its_original_only() {
        let blob = BodyBlob::new("poison", poison_body_blob_name("jobs", "id"), "original");
        assert_eq!(blob.name, "jobs/id");
        assert!(blob.matches(b"original"));
        assert!(!blob.matches(b"originaL"));
        assert!(!blob.matches(b"original "));
    }

    #[test]
    fn a_huge_error_text_is_capped() {
        let mut huge = record("x");
        huge.last_error = "ü\"\u{1}".repeat(40_000);
        huge.cap_last_error();
        assert!(huge.last_error_truncated);
        assert!(huge.last_error.len() <= MAX_LAST_ERROR_LEN);
        assert!(huge.to_message_text().unwrap().is_some());
    }

    #[test]
    fn a_cut_error_keeps_what_failed_and_how_the_program_ended() {
        let mut record = record("x");
        let stderr: String = (0..1000).map(|i| format!("frame={i}\n")).collect();
        record.last_error = format!(
            "job j: the program exited with status 1; stderr ends with:\n{stderr}Error: CUDA out of memory"
        );
        record.cap_last_error();
        let text = &record.last_error;
        assert!(record.last_error_truncated);
        assert!(text.len() <= MAX_LAST_ERROR_LEN, "{}", text.len());
        assert!(
            text.starts_with("job j: the program exited with status 1"),
            "{text}"
        );
        assert!(
            text.ends_with("frame=999\nError: CUDA out of memory"),
            "{text}"
        );
        assert!(text.contains(" bytes left out]"), "{text}");
        // Multi-byte characters are never split.
        for max in 40..80 {
            let mut text = "ééééé".repeat(20);
            shorten_keeping_ends(&mut text, max);
            assert!(text.len() <= max && text.ends_with('é'), "{max}: {text}");
        }
    }
}
