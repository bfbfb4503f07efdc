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
    /// The last failure: the handler's error, or why the body did not decode.
    pub last_error: String,
    /// The original message text, exactly as it was on the queue (unless
    /// `body_truncated`).
    pub body: String,
    /// True if `body` was cut short to fit the poison message into the
    /// queue's 64 KiB limit (an original near that limit plus the metadata
    /// would not fit, and the message would otherwise never leave the queue).
    #[serde(default)]
    pub body_truncated: bool,
}

impl PoisonRecord {
    /// Serializes and encodes the record as message text of at most
    /// `max_len` bytes, truncating `body` if needed (bounded attempts).
    pub fn encode_within(
        mut self,
        encoding: MessageEncoding,
        max_len: usize,
    ) -> Result<(Self, String), StorageError> {
        for _ in 0..16 {
            let json = serde_json::to_vec(&self)
                .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
            let text = encoding.encode(&json)?;
            if text.len() <= max_len || self.body.is_empty() {
                return Ok((self, text));
            }
            // Shrink in proportion to the excess, with a margin for escaping.
            let keep = self.body.len().saturating_mul(max_len) / text.len() * 9 / 10;
            let mut cut = keep.min(self.body.len().saturating_sub(1));
            while !self.body.is_char_boundary(cut) {
                cut -= 1;
            }
            self.body.truncate(cut);
            self.body_truncated = true;
        }
        Err(StorageError::InvalidArgument(format!(
            "poison record does not fit in {max_len} bytes"
        )))
    }
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
}
