//! The record written to `<queue>-poison` when a message is given up on: the
//! original message text plus what is needed to investigate it later,
//! because the poison queue assigns a new id and resets the dequeue count.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::encoding::MessageEncoding;
use crate::error::StorageError;

/// The JSON document a poisoned message becomes (then encoded with the
/// consumer's [`MessageEncoding`](crate::MessageEncoding), so the same tools
/// read both queues).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoisonRecord {
    /// The queue the message came from.
    pub queue: String,
    /// The message's id in that queue.
    pub original_id: String,
    /// How many times it had been received.
    pub dequeue_count: u32,
    /// When it was first sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub inserted_at: Option<OffsetDateTime>,
    /// When it was moved to the poison queue.
    #[serde(with = "time::serde::rfc3339")]
    pub poisoned_at: OffsetDateTime,
    /// The last failure: the handler's error, or why the body did not decode
    /// (at most [`MAX_LAST_ERROR_LEN`] bytes, unless `last_error_truncated`).
    pub last_error: String,
    /// True if `last_error` was cut short: an error text of any length must
    /// not keep the record from fitting into one queue message.
    #[serde(default)]
    pub last_error_truncated: bool,
    /// The original message text, exactly as it was on the queue (unless
    /// `body_truncated`).
    pub body: String,
    /// True if `body` was cut short to fit the poison message into the
    /// queue's 64 KiB limit (an original near that limit plus the metadata
    /// would not fit, and the message would otherwise never leave the queue).
    #[serde(default)]
    pub body_truncated: bool,
}

/// The most of `last_error` a poison record keeps: enough for any error
/// chain a person reads, small next to the 64 KiB message limit.
pub const MAX_LAST_ERROR_LEN: usize = 4 * 1024;

impl PoisonRecord {
    /// Serializes and encodes the record as message text of at most
    /// `max_len` bytes. `last_error` is first cut to [`MAX_LAST_ERROR_LEN`];
    /// if the text is still too long, `body` is shortened, then
    /// `last_error` further (bounded attempts). Fails only if the rest of
    /// the record alone does not fit.
    pub fn encode_within(
        mut self,
        encoding: MessageEncoding,
        max_len: usize,
    ) -> Result<(Self, String), StorageError> {
        if self.last_error.len() > MAX_LAST_ERROR_LEN {
            truncate_at_char_boundary(&mut self.last_error, MAX_LAST_ERROR_LEN);
            self.last_error_truncated = true;
        }
        for _ in 0..32 {
            let json = serde_json::to_vec(&self)
                .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
            let text = encoding.encode(&json)?;
            if text.len() <= max_len {
                return Ok((self, text));
            }
            // The body goes first: the error says why it was given up on.
            let (field, truncated) = if !self.body.is_empty() {
                (&mut self.body, &mut self.body_truncated)
            } else if !self.last_error.is_empty() {
                (&mut self.last_error, &mut self.last_error_truncated)
            } else {
                break;
            };
            // Shrink in proportion to the excess, with a margin for escaping.
            let keep = field.len().saturating_mul(max_len) / text.len() * 9 / 10;
            truncate_at_char_boundary(field, keep.min(field.len().saturating_sub(1)));
            *truncated = true;
        }
        Err(StorageError::InvalidArgument(format!(
            "poison record does not fit in {max_len} bytes"
        )))
    }
}

/// Cuts `text` to at most `max` bytes without splitting a character.
fn truncate_at_char_boundary(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
}

/// The poison queue's name for a queue: `<queue>-poison` (the Azure
/// Functions convention, so existing tooling finds it).
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}-poison")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: String) -> PoisonRecord {
        PoisonRecord {
            queue: "jobs".into(),
            original_id: "id".into(),
            dequeue_count: 5,
            inserted_at: None,
            poisoned_at: OffsetDateTime::UNIX_EPOCH,
            last_error: "boom".into(),
            last_error_truncated: false,
            body,
            body_truncated: false,
        }
    }

    #[test]
    fn small_records_are_kept_whole() {
        let (kept, text) = record("small".into())
            .encode_within(MessageEncoding::Base64, 48 * 1024)
            .unwrap();
        assert!(!kept.body_truncated);
        let json = MessageEncoding::Base64.decode(&text).unwrap();
        let decoded: PoisonRecord = serde_json::from_slice(&json).unwrap();
        assert_eq!(decoded, kept);
    }

    #[test]
    fn a_body_near_the_queue_limit_is_truncated_to_fit() {
        for encoding in [MessageEncoding::Text, MessageEncoding::Base64] {
            // Multi-byte characters and characters JSON escapes.
            let body = "é\"\\x".repeat(20_000);
            let (kept, text) = record(body.clone())
                .encode_within(encoding, 48 * 1024)
                .unwrap();
            assert!(text.len() <= 48 * 1024, "{}", text.len());
            assert!(kept.body_truncated);
            assert!(body.starts_with(&kept.body));
            assert!(
                kept.body.len() > 8 * 1024,
                "kept a useful prefix: {}",
                kept.body.len()
            );
        }
    }

    #[test]
    fn a_huge_error_text_is_capped_and_the_record_still_fits() {
        for encoding in [MessageEncoding::Text, MessageEncoding::Base64] {
            let mut huge = record("é\"x".repeat(30_000));
            huge.last_error = "ü\"\u{1}".repeat(40_000);
            let (kept, text) = huge.clone().encode_within(encoding, 48 * 1024).unwrap();
            assert!(text.len() <= 48 * 1024, "{}", text.len());
            assert!(kept.last_error_truncated && kept.body_truncated);
            assert!(kept.last_error.len() <= MAX_LAST_ERROR_LEN);
            assert!(huge.last_error.starts_with(&kept.last_error));
            assert!(huge.body.starts_with(&kept.body));
        }
    }

    #[test]
    fn the_error_is_shortened_too_when_the_body_alone_is_not_enough() {
        let mut small = record(String::new());
        small.last_error = "e".repeat(MAX_LAST_ERROR_LEN);
        let (kept, text) = small.encode_within(MessageEncoding::Text, 1024).unwrap();
        assert!(text.len() <= 1024, "{}", text.len());
        assert!(kept.last_error_truncated);
        assert!(!kept.body_truncated);
        assert!(kept.last_error.len() > 256, "kept a useful prefix");
    }

    #[test]
    fn a_record_whose_metadata_alone_is_too_big_is_refused() {
        let mut record = record("body".into());
        record.queue = "q".repeat(200);
        assert!(record.encode_within(MessageEncoding::Text, 100).is_err());
    }
}
