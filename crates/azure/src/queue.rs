//! [`AzureQueue`]: the [`MessageQueue`] trait on Azure Storage Queues.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::headers::HeaderName;
use azure_core::http::{RequestContent, XmlFormat};
use azure_storage_queue::QueueClient;
use azure_storage_queue::models::{
    QueueClientGetPropertiesResultHeaders as _, QueueClientReceiveMessagesOptions,
    QueueClientSendMessageOptions, QueueMessage as WireMessage,
};
use spot_worker_storage::{
    MAX_RECEIVE_BATCH, MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError,
};

use crate::error::{Operation, error_code, map_error};

/// The header carrying the new pop receipt after an update; the response
/// has no body.
const POP_RECEIPT_HEADER: HeaderName = HeaderName::from_static("x-ms-popreceipt");
/// The service's upper bound for visibility timeouts.
const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// An Azure Storage queue. Build it with
/// [`AzureStorage::queue`](crate::AzureStorage::queue).
#[derive(Clone)]
pub struct AzureQueue {
    name: String,
    client: Arc<QueueClient>,
}

impl fmt::Debug for AzureQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("AzureQueue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl AzureQueue {
    pub(crate) fn new(name: String, client: QueueClient) -> Self {
        AzureQueue {
            name,
            client: Arc::new(client),
        }
    }

    /// Creates the queue if it does not exist yet.
    pub async fn create_if_missing(&self) -> Result<(), StorageError> {
        match self.client.create(None).await {
            Ok(_) => Ok(()),
            // 409 QueueAlreadyExists: exists with other metadata; fine for us.
            Err(e) if error_code(&e) == Some("QueueAlreadyExists") => Ok(()),
            Err(e) => Err(map_error(e, Operation::Other(&self.name))),
        }
    }

    /// The service's approximate count of messages in the queue, visible
    /// or not.
    pub async fn approximate_message_count(&self) -> Result<u64, StorageError> {
        let response = self
            .client
            .get_properties(None)
            .await
            .map_err(|e| map_error(e, Operation::Other(&self.name)))?;
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
            .client
            .receive_messages(Some(options))
            .await
            .and_then(|response| response.into_model())
            .map_err(|e| map_error(e, Operation::Other(&self.name)))?;
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
                    dequeue_count: m
                        .dequeue_count
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(1),
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
            .client
            .update_message(
                id.as_str(),
                pop_receipt.as_str(),
                whole_seconds(visibility_timeout),
                None,
            )
            .await
            .map_err(|e| map_error(e, Operation::Message(id)))?;
        response
            .headers()
            .get_optional_str(&POP_RECEIPT_HEADER)
            .map(PopReceipt::new)
            .ok_or_else(|| missing("x-ms-popreceipt header in the update response"))
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.client
            .delete_message(id.as_str(), pop_receipt.as_str(), None)
            .await
            .map(drop)
            .map_err(|e| map_error(e, Operation::Message(id)))
    }

    /// Sends a message; a missing queue (typically `<queue>-poison` on its
    /// first use) is created and the send retried once.
    async fn send(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError> {
        match self.send_once(body, initial_visibility_delay).await {
            Ok(id) => Ok(id),
            Err(e) if error_code(&e) == Some("QueueNotFound") => {
                self.create_if_missing().await?;
                self.send_once(body, initial_visibility_delay)
                    .await
                    .map_err(|e| map_error(e, Operation::Other(&self.name)))
            }
            Err(e) => Err(map_error(e, Operation::Other(&self.name))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
