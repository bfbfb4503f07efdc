//! The [`MessageQueue`] trait: the four queue operations the consumer needs
//! (receive with a visibility timeout, renew, delete, send), and the message
//! types they exchange.

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::error::StorageError;
pub use crate::message_id::MessageId;

/// The most messages one receive call may ask for (an Azure Storage limit).
pub const MAX_RECEIVE_BATCH: u8 = 32;

/// Proof of the current lease on a received message. Every receive and every
/// visibility update returns a new one, and only the newest is accepted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PopReceipt(String);

impl PopReceipt {
    /// Wraps a pop receipt string.
    pub fn new(receipt: impl Into<String>) -> Self {
        PopReceipt(receipt.into())
    }

    /// The receipt as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A message as received: invisible to other consumers until its
/// visibility timeout runs out or it is renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMessage {
    /// The message id.
    pub id: MessageId,
    /// The lease proof to renew, delete or release with.
    pub pop_receipt: PopReceipt,
    /// The message text exactly as stored (still base64 if it was sent so).
    pub body: String,
    /// How many times the message has been received, including this time;
    /// [`QueueMessage::UNKNOWN_DEQUEUE_COUNT`] if the queue did not say.
    pub dequeue_count: u32,
    /// When the message was first sent, if the queue reports it.
    pub inserted_at: Option<OffsetDateTime>,
}

impl QueueMessage {
    /// The `dequeue_count` of a message whose queue did not report one.
    /// The consumer never takes it for a first delivery: such a message
    /// may have been received before (so its checkpoint is read), and the
    /// crash-loop guard, having nothing to count, does not fire on it.
    pub const UNKNOWN_DEQUEUE_COUNT: u32 = 0;
}

/// A message seen at the front of a queue without receiving it
/// ([`MessageQueue::peek`]): nothing was hidden or counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibleMessage {
    /// The message id.
    pub id: MessageId,
    /// The message text exactly as stored.
    pub body: String,
    /// How many times it was received so far.
    pub dequeue_count: u32,
    /// When it was sent, if the queue reports it.
    pub inserted_at: Option<OffsetDateTime>,
}

/// A storage queue with visibility-timeout leases (the Azure Storage Queue
/// model). Implementations: `InMemoryQueue` here, `AzureQueue` in
/// `spot-worker-azure`.
#[async_trait]
pub trait MessageQueue: Send + Sync + 'static {
    /// The queue's name (used for logs and to name its poison queue).
    fn name(&self) -> &str;

    /// Makes the queue ready for a worker: creates it if it is missing and
    /// proves this worker is allowed to write to it, so a warmup gate can
    /// refuse to take work while storage is unreachable or misconfigured.
    ///
    /// It must not put anything into the queue that a consumer could
    /// receive (no probe messages in a work queue). Creating the queue (a
    /// write the service authorizes even when the queue exists) and reading
    /// its properties is what `AzureQueue` does. Idempotent; call it again
    /// after a failure.
    async fn prepare(&self) -> Result<(), StorageError>;

    /// Receives up to `max_messages` (1 to [`MAX_RECEIVE_BATCH`]) visible
    /// messages, hiding each for `visibility_timeout`. An empty vector means
    /// the queue had nothing visible.
    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError>;

    /// Hides a received message for `visibility_timeout` from now (zero makes
    /// it visible at once) and returns the new pop receipt, which replaces
    /// the old one. Fails with [`StorageError::LeaseLost`] if `pop_receipt`
    /// is no longer current.
    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError>;

    /// Deletes a received message. Fails with [`StorageError::LeaseLost`] if
    /// `pop_receipt` is no longer current.
    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError>;

    /// Sends a message whose text is `body` (already encoded), visible after
    /// `initial_visibility_delay`.
    async fn send(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError>;

    /// Up to `max_messages` (1 to [`MAX_RECEIVE_BATCH`]) visible messages
    /// from the front of the queue, without receiving them (the lane keeper
    /// looks at the jobs waiting this way). A queue that cannot be looked
    /// at says so with an error: the default.
    async fn peek(&self, max_messages: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        let _ = max_messages;
        Err(StorageError::InvalidArgument(format!(
            "queue {} cannot be peeked",
            self.name()
        )))
    }
}
