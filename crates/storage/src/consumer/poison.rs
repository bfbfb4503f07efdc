//! The record written to `<queue>-poison` when a message is given up on: the
//! original message text plus what is needed to investigate it later,
//! because the poison queue assigns a new id and resets the dequeue count.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

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
    /// The original message text, exactly as it was on the queue.
    pub body: String,
}

/// The poison queue's name for a queue: `<queue>-poison` (the Azure
/// Functions convention, so existing tooling finds it).
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}-poison")
}
