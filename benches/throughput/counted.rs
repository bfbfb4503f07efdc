//! A queue that counts what is asked of it, and times a run by its calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use spot_worker::storage::{
    MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError, async_trait,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::requests::QueueCounts;
use crate::setup::{bounded, lock, set};

/// Wraps a queue, counting calls, and timing the first receive, the
/// `target`-th delete and the last release (visibility set to zero).
pub struct Counted {
    inner: Arc<dyn MessageQueue>,
    target: u64,
    pub counts: QueueCounts,
    received: AtomicU64,
    deleted: watch::Sender<u64>,
    first_receive: Mutex<Option<Instant>>,
    target_reached: Mutex<Option<Instant>>,
    pub released_at: Mutex<Option<Instant>>,
}

impl Counted {
    pub fn new(inner: Arc<dyn MessageQueue>, target: u64) -> Arc<Counted> {
        Arc::new(Counted {
            inner,
            target,
            counts: QueueCounts::default(),
            received: AtomicU64::new(0),
            deleted: watch::channel(0).0,
            first_receive: Mutex::new(None),
            target_reached: Mutex::new(None),
            released_at: Mutex::new(None),
        })
    }

    /// Resolves once `target` messages are deleted.
    pub async fn all_deleted(&self) -> Result<()> {
        let mut deleted = self.deleted.subscribe();
        bounded("draining the queue", async {
            deleted
                .wait_for(|n| *n >= self.target)
                .await
                .map(drop)
                .context("the counter closed")
        })
        .await
    }

    /// First receive sent → `target`-th delete answered.
    pub fn elapsed(&self) -> Result<Duration> {
        let first = lock(&self.first_receive).context("no receive")?;
        let last = lock(&self.target_reached).context("target not reached")?;
        Ok(last - first)
    }
}

#[async_trait]
impl MessageQueue for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.counts.prepare.fetch_add(1, Ordering::Relaxed);
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        {
            let mut first = self.first_receive.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(Instant::now);
        }
        self.counts.receive.fetch_add(1, Ordering::Relaxed);
        let messages = self.inner.receive(max_messages, visibility_timeout).await?;
        self.received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        Ok(messages)
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        self.counts.update.fetch_add(1, Ordering::Relaxed);
        let receipt = self
            .inner
            .update_visibility(id, pop_receipt, visibility_timeout)
            .await?;
        if visibility_timeout.is_zero() {
            set(&self.released_at, Some(Instant::now()));
        }
        Ok(receipt)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.counts.delete.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(id, pop_receipt).await?;
        let mut reached = false;
        self.deleted.send_modify(|n| {
            *n += 1;
            reached = *n == self.target;
        });
        if reached {
            set(&self.target_reached, Some(Instant::now()));
        }
        Ok(())
    }

    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.inner.send(body, delay).await
    }
}
