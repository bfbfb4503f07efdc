//! [`AzureQueue`]: the [`MessageQueue`] trait on Azure Storage Queues.
//!
//! Every call has a total deadline (retries included), so a blackholed
//! connection surfaces in seconds as [`StorageError::Unavailable`]. Messages
//! sent to a poison queue never expire (see [`MessageTtl`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::headers::HeaderName;
use azure_core::http::{RequestContent, XmlFormat};
use azure_storage_queue::QueueClient;
use azure_storage_queue::models::{
    QueueClientGetPropertiesResultHeaders as _, QueueClientPeekMessagesOptions,
    QueueClientReceiveMessagesOptions, QueueClientSendMessageOptions, QueueMessage as WireMessage,
};
use spot_worker_storage::{
    MAX_RECEIVE_BATCH, MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError,
    VisibleMessage,
};

use time::OffsetDateTime;

use crate::error::{Operation, bounded, error_code, map_error};

/// The header carrying the new pop receipt after an update; the response
/// has no body.
const POP_RECEIPT_HEADER: HeaderName = HeaderName::from_static("x-ms-popreceipt");
/// The service's upper bound for visibility timeouts.
const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long messages this client sends stay in the queue before the
/// service deletes them, whether or not anyone received them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MessageTtl {
    /// The service default: 7 days. Right for work queues, whose messages
    /// are either handled or poisoned well within that.
    #[default]
    ServiceDefault,
    /// Never (`messagettl=-1`). Poison queues use it: a poison record is
    /// there for a human to look at, and silently losing it after a week
    /// loses the job.
    Never,
    /// After this long (rounded up to whole seconds).
    After(Duration),
}

impl MessageTtl {
    /// The `messagettl` parameter; `None` leaves it to the service.
    fn seconds(self) -> Option<i32> {
        match self {
            MessageTtl::ServiceDefault => None,
            MessageTtl::Never => Some(-1),
            MessageTtl::After(ttl) => {
                let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
                Some(i32::try_from(secs.max(1)).unwrap_or(i32::MAX))
            }
        }
    }
}

/// A message looked at with [`AzureQueue::peek`], without receiving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeekedMessage {
    /// The message id.
    pub id: MessageId,
    /// The message text as stored.
    pub body: String,
    /// How often it was received so far.
    pub dequeue_count: u32,
    /// When it was sent.
    pub inserted_at: Option<OffsetDateTime>,
    /// When the service deletes it (year 9999 for messages that never
    /// expire).
    pub expires_at: Option<OffsetDateTime>,
}

/// An Azure Storage queue. Build it with
/// [`AzureStorage::queue`](crate::AzureStorage::queue) or
/// [`AzureStorage::poison_queue`](crate::AzureStorage::poison_queue).
#[derive(Clone)]
pub struct AzureQueue {
    name: String,
    client: Arc<QueueClient>,
    ttl: MessageTtl,
    /// Bound of every call, retries included
    /// ([`RetryConfig::call_deadline`](crate::RetryConfig::call_deadline)).
    deadline: Duration,
}

impl fmt::Debug for AzureQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("AzureQueue")
            .field("name", &self.name)
            .field("ttl", &self.ttl)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl AzureQueue {
    pub(crate) fn new(name: String, client: QueueClient, deadline: Duration) -> Self {
        AzureQueue {
            name,
            client: Arc::new(client),
            ttl: MessageTtl::ServiceDefault,
            deadline,
        }
    }

    /// This client with messages it sends living for `ttl`.
    /// [`AzureStorage::queue`](crate::AzureStorage::queue) chooses
    /// [`MessageTtl::Never`] for `*-poison` queues and the service default
    /// otherwise; this overrides that choice.
    #[must_use]
    pub fn with_message_ttl(mut self, ttl: MessageTtl) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long messages sent through this client live.
    pub fn message_ttl(&self) -> MessageTtl {
        self.ttl
    }

    /// Runs `call` within this queue's deadline.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        bounded(self.deadline, &format!("queue {}", self.name), call).await
    }

    /// Up to `max_messages` (1 to 32) messages from the front of the queue,
    /// without receiving them: nothing is hidden or counted as a delivery.
    /// For tools and tests that inspect a (poison) queue.
    pub async fn peek(&self, max_messages: u8) -> Result<Vec<PeekedMessage>, StorageError> {
        if max_messages == 0 || max_messages > MAX_RECEIVE_BATCH {
            return Err(StorageError::InvalidArgument(format!(
                "max_messages must be 1..={MAX_RECEIVE_BATCH}, got {max_messages}"
            )));
        }
        let options = QueueClientPeekMessagesOptions {
            number_of_messages: Some(i32::from(max_messages)),
            ..Default::default()
        };
        let peeked = self
            .bounded(async {
                self.client
                    .peek_messages(Some(options))
                    .await
                    .and_then(|response| response.into_model())
                    .map_err(|e| map_error(e, Operation::Other(&self.name)))
            })
            .await?;
        peeked
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                Ok(PeekedMessage {
                    id: MessageId::new(m.message_id.ok_or_else(|| missing("message id"))?),
                    body: m.message_text.unwrap_or_default(),
                    dequeue_count: m
                        .dequeue_count
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(0),
                    inserted_at: m.insertion_time,
                    expires_at: m.expiration_time,
                })
            })
            .collect()
    }

    /// Creates the queue if it does not exist yet.
    pub async fn create_if_missing(&self) -> Result<(), StorageError> {
        self.bounded(async {
            match self.client.create(None).await {
                Ok(_) => Ok(()),
                // 409 QueueAlreadyExists: exists with other metadata; fine for us.
                Err(e) if error_code(&e) == Some("QueueAlreadyExists") => Ok(()),
                Err(e) => Err(map_error(e, Operation::Other(&self.name))),
            }
        })
        .await
    }

    /// Sends a message to a queue that must exist: a missing queue is
    /// [`StorageError::NotFound`], never created (unlike
    /// [`MessageQueue::send`]). For senders that only may send, such as the
    /// operator's `enqueue`, where a mistyped name must not become a queue
    /// no worker reads.
    pub async fn send_to_existing(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError> {
        spot_worker_storage::check_sendable(body)?;
        self.bounded(async {
            self.send_once(body, initial_visibility_delay)
                .await
                .map_err(|e| map_error(e, Operation::Other(&self.name)))
        })
        .await
    }

    /// The service's approximate count of messages in the queue, visible
    /// or not.
    pub async fn approximate_message_count(&self) -> Result<u64, StorageError> {
        let response = self
            .bounded(async {
                self.client
                    .get_properties(None)
                    .await
                    .map_err(|e| map_error(e, Operation::Other(&self.name)))
            })
            .await?;
        let count = response
            .approximate_messages_count()
            .map_err(|e| map_error(e, Operation::Other(&self.name)))?
            .unwrap_or(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn send_once(&self, body: &str, delay: Duration) -> Result<MessageId, azure_core::Error> {
        let message = WireMessage {
            message_text: Some(body.to_owned()),
        };
        let content: RequestContent<WireMessage, XmlFormat> = message.try_into()?;
        let options = QueueClientSendMessageOptions {
            visibility_timeout: (!delay.is_zero()).then(|| whole_seconds(delay)),
            message_time_to_live: self.ttl.seconds(),
            ..Default::default()
        };
        let sent = self
            .client
            .send_message(content, Some(options))
            .await?
            .into_model()?
            .into_message()?;
        sent.message_id.map(MessageId::new).ok_or_else(|| {
            azure_core::Error::with_message(
                azure_core::error::ErrorKind::DataConversion,
                "the service returned no message id",
            )
        })
    }
}

/// Seconds as the service wants them: rounded up (a lease must never be
/// shorter than asked), at most 7 days.
fn whole_seconds(d: Duration) -> i32 {
    let d = d.min(MAX_VISIBILITY);
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

fn missing(field: &str) -> StorageError {
    StorageError::InvalidData {
        what: "received queue message".to_owned(),
        reason: format!("no {field}"),
    }
}

#[async_trait]
impl MessageQueue for AzureQueue {
    fn name(&self) -> &str {
        &self.name
    }

    /// Creates the queue if it is missing (a write the service authorizes
    /// even when the queue exists) and reads its properties. Nothing is put
    /// into the queue: a probe message could be received as work.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.create_if_missing().await?;
        self.approximate_message_count().await.map(drop)
    }

    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        if max_messages == 0 || max_messages > MAX_RECEIVE_BATCH {
            return Err(StorageError::InvalidArgument(format!(
                "max_messages must be 1..={MAX_RECEIVE_BATCH}, got {max_messages}"
            )));
        }
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(i32::from(max_messages)),
            visibility_timeout: Some(whole_seconds(visibility_timeout).max(1)),
            ..Default::default()
        };
        let received = self
            .bounded(async {
                self.client
                    .receive_messages(Some(options))
                    .await
                    .and_then(|response| response.into_model())
                    .map_err(|e| map_error(e, Operation::Other(&self.name)))
            })
            .await?;
        received
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                Ok(QueueMessage {
                    id: MessageId::new(m.message_id.ok_or_else(|| missing("message id"))?),
                    pop_receipt: PopReceipt::new(
                        m.pop_receipt.ok_or_else(|| missing("pop receipt"))?,
                    ),
                    body: m.message_text.unwrap_or_default(),
                    dequeue_count: received_dequeue_count(m.dequeue_count),
                    inserted_at: m.insertion_time,
                })
            })
            .collect()
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        let response = self
            .bounded(async {
                self.client
                    .update_message(
                        id.as_str(),
                        pop_receipt.as_str(),
                        whole_seconds(visibility_timeout),
                        None,
                    )
                    .await
                    .map_err(|e| map_error(e, Operation::Message(id)))
            })
            .await?;
        response
            .headers()
            .get_optional_str(&POP_RECEIPT_HEADER)
            .map(PopReceipt::new)
            .ok_or_else(|| missing("x-ms-popreceipt header in the update response"))
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.bounded(async {
            self.client
                .delete_message(id.as_str(), pop_receipt.as_str(), None)
                .await
                .map(drop)
                .map_err(|e| map_error(e, Operation::Message(id)))
        })
        .await
    }

    /// [`AzureQueue::peek`], as the trait has it (the lane keeper's).
    async fn peek(&self, max_messages: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        Ok(AzureQueue::peek(self, max_messages)
            .await?
            .into_iter()
            .map(|m| VisibleMessage {
                id: m.id,
                body: m.body,
                dequeue_count: m.dequeue_count,
                inserted_at: m.inserted_at,
            })
            .collect())
    }

    /// Sends a message with this client's [`MessageTtl`]; a missing queue
    /// (typically `<queue>-poison` on its first use) is created and the send
    /// retried once.
    async fn send(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError> {
        // A message the queue cannot carry is refused here rather than
        // left to break every receive of the queue (Azurite) or to be
        // refused by the service as malformed XML.
        spot_worker_storage::check_sendable(body)?;
        let first = self
            .bounded(async {
                match self.send_once(body, initial_visibility_delay).await {
                    Ok(id) => Ok(Some(id)),
                    Err(e) if error_code(&e) == Some("QueueNotFound") => Ok(None),
                    Err(e) => Err(map_error(e, Operation::Other(&self.name))),
                }
            })
            .await?;
        if let Some(id) = first {
            return Ok(id);
        }
        self.create_if_missing().await?;
        self.bounded(async {
            self.send_once(body, initial_visibility_delay)
                .await
                .map_err(|e| map_error(e, Operation::Other(&self.name)))
        })
        .await
    }
}

/// The dequeue count of a received message: what the service reported, or
/// [`QueueMessage::UNKNOWN_DEQUEUE_COUNT`] if it reported none (or one out
/// of range). Never 1, a first delivery, by default: the consumer would then
/// skip reading a checkpoint an earlier delivery may have written.
fn received_dequeue_count(reported: Option<i64>) -> u32 {
    reported
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(QueueMessage::UNKNOWN_DEQUEUE_COUNT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_dequeue_count_is_unknown_never_a_first_delivery() {
        // (reported by the service, as received)
        let rows = [
            (Some(1), 1),
            (Some(7), 7),
            (None, QueueMessage::UNKNOWN_DEQUEUE_COUNT),
            (Some(0), QueueMessage::UNKNOWN_DEQUEUE_COUNT),
            (Some(-3), QueueMessage::UNKNOWN_DEQUEUE_COUNT),
            (Some(i64::MAX), QueueMessage::UNKNOWN_DEQUEUE_COUNT),
        ];
        for (reported, expected) in rows {
            assert_eq!(received_dequeue_count(reported), expected, "{reported:?}");
        }
        assert_ne!(QueueMessage::UNKNOWN_DEQUEUE_COUNT, 1);
    }

    #[test]
    fn message_ttls_as_the_service_wants_them() {
        assert_eq!(MessageTtl::ServiceDefault.seconds(), None);
        assert_eq!(MessageTtl::Never.seconds(), Some(-1));
        assert_eq!(
            MessageTtl::After(Duration::from_millis(1500)).seconds(),
            Some(2)
        );
        assert_eq!(MessageTtl::After(Duration::ZERO).seconds(), Some(1));
        assert_eq!(
            MessageTtl::After(Duration::from_secs(u64::MAX)).seconds(),
            Some(i32::MAX)
        );
    }

    #[test]
    fn visibility_rounds_up_to_whole_seconds_and_caps_at_seven_days() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(2500)), 3);
        assert_eq!(
            whole_seconds(Duration::from_secs(30 * 24 * 3600)),
            7 * 24 * 3600
        );
    }
}
