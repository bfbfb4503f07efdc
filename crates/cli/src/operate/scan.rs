//! Going through every message of a queue, past the 32 a peek can show:
//! each is received (hidden for [`SCAN_VISIBILITY`]) and then either
//! settled by the caller (deleted) or kept, and every kept message is made
//! visible again at the end. Interrupted half-way, the kept ones come back
//! by themselves when their visibility timeout ends: nothing is lost.
//!
//! Used on poison queues, which no worker consumes: hiding a record for a
//! while only hides it from another operator's command.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context as _, Result};
use spot_worker_azure::AzureQueue;
use spot_worker_storage::{
    MAX_RECEIVE_BATCH, MessageId, MessageQueue as _, QueueMessage, StorageError,
};

/// How long a scanned message stays hidden: longer than any scan takes, so
/// a kept message does not come round again within the same scan.
const SCAN_VISIBILITY: Duration = Duration::from_secs(600);
/// Bound on receive calls in one scan (320,000 messages).
const MAX_BATCHES: usize = 10_000;

/// One pass over a queue.
pub struct Scan<'q> {
    queue: &'q AzureQueue,
    kept: Vec<QueueMessage>,
    seen: HashSet<MessageId>,
    batches: usize,
}

impl<'q> Scan<'q> {
    pub fn new(queue: &'q AzureQueue) -> Self {
        Scan {
            queue,
            kept: Vec::new(),
            seen: HashSet::new(),
            batches: 0,
        }
    }

    /// The next messages not seen yet in this scan; `None` once the queue
    /// has nothing more visible (or the bound is reached).
    pub async fn next_batch(&mut self) -> Result<Option<Vec<QueueMessage>>> {
        if self.batches >= MAX_BATCHES {
            return Ok(None);
        }
        self.batches += 1;
        let received = match self.queue.receive(MAX_RECEIVE_BATCH, SCAN_VISIBILITY).await {
            Ok(received) => received,
            // A queue that does not exist yet holds nothing.
            Err(StorageError::NotFound { .. }) => return Ok(None),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("receiving from queue {}", self.queue.name()));
            }
        };
        if received.is_empty() {
            return Ok(None);
        }
        let mut fresh = Vec::with_capacity(received.len());
        for message in received {
            if self.seen.insert(message.id.clone()) {
                fresh.push(message);
            } else {
                // Came round again (the scan outlasted its visibility):
                // leave it for the release at the end.
                self.kept.push(message);
            }
        }
        Ok(Some(fresh))
    }

    /// Leaves `message` on the queue: it is made visible again by
    /// [`Scan::finish`].
    pub fn keep(&mut self, message: QueueMessage) {
        self.kept.push(message);
    }

    /// Deletes `message` from the queue.
    pub async fn delete(&self, message: &QueueMessage) -> Result<()> {
        self.queue
            .delete(&message.id, &message.pop_receipt)
            .await
            .with_context(|| {
                format!(
                    "deleting message {} from queue {}",
                    message.id,
                    self.queue.name()
                )
            })
    }

    /// Makes every kept message visible again. Each is tried; the first
    /// failure is returned (those messages reappear when their visibility
    /// timeout ends anyway).
    pub async fn finish(self) -> Result<()> {
        let mut first_error = None;
        for message in &self.kept {
            let released = self
                .queue
                .update_visibility(&message.id, &message.pop_receipt, Duration::ZERO)
                .await
                .with_context(|| {
                    format!(
                        "making message {} visible again (it reappears by itself within {} s)",
                        message.id,
                        SCAN_VISIBILITY.as_secs()
                    )
                });
            if let Err(e) = released {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
