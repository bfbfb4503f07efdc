//! [`InMemoryQueue`]: a queue with visibility timeouts, changing pop
//! receipts and dequeue counts, on the tokio clock (so paused-time tests work).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::error::StorageError;
use crate::memory::outage::Outage;
use crate::queue::{
    MAX_RECEIVE_BATCH, MessageId, MessageQueue, PopReceipt, QueueMessage, VisibleMessage,
};

/// A message held by an [`InMemoryQueue`], as tests see it.
#[derive(Clone, Debug)]
pub struct StoredMessage {
    /// The message id.
    pub id: MessageId,
    /// The message text.
    pub body: String,
    /// How many times it was received.
    pub dequeue_count: u32,
    /// When it was sent.
    pub inserted_at: OffsetDateTime,
    /// Whether a receive would return it now.
    pub visible: bool,
}

// A poisoned lock only means a test panicked elsewhere; the generator is
// still usable.
fn lock_ids(ids: &Mutex<Option<StdRng>>) -> MutexGuard<'_, Option<StdRng>> {
    ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug)]
struct Entry {
    id: MessageId,
    body: String,
    dequeue_count: u32,
    inserted_at: OffsetDateTime,
    visible_at: Instant,
    pop_receipt: Option<PopReceipt>,
}

/// An in-memory [`MessageQueue`]. Clones share the same messages (and the
/// same outage switch), like two clients of one queue.
#[derive(Clone, Debug)]
pub struct InMemoryQueue {
    name: Arc<str>,
    entries: Arc<Mutex<Vec<Entry>>>,
    outage: Outage,
    /// Where message ids and pop receipts come from: random, or drawn
    /// from a seed so that a seeded run names everything the same way
    /// each time.
    ids: Arc<Mutex<Option<StdRng>>>,
    /// When messages are sent: the wall clock, or a seeded run's time of
    /// day (a start, and the tokio clock since the queue was made).
    sent_from: Option<(OffsetDateTime, Instant)>,
}

impl InMemoryQueue {
    /// An empty queue called `name`.
    pub fn new(name: &str) -> Self {
        InMemoryQueue {
            name: Arc::from(name),
            entries: Arc::default(),
            outage: Outage::default(),
            ids: Arc::default(),
            sent_from: None,
        }
    }

    /// An empty queue called `name` for a seeded run: its message ids and
    /// pop receipts are drawn from `seed` (still unique, random 128-bit
    /// ids, but the same on every run with that seed), and a message's
    /// time of sending is `start` plus the tokio clock since now, so a
    /// seeded search replays exactly even where the library orders or
    /// names things by id, or judges a message by its age.
    pub fn seeded(name: &str, seed: u64, start: std::time::SystemTime) -> Self {
        let mut queue = Self::new(name);
        *lock_ids(&queue.ids) = Some(StdRng::seed_from_u64(seed));
        queue.sent_from = Some((OffsetDateTime::from(start), Instant::now()));
        queue
    }

    /// The time of day a message sent now is stamped with.
    fn sent_at(&self) -> OffsetDateTime {
        match self.sent_from {
            Some((start, made)) => start + made.elapsed(),
            None => OffsetDateTime::now_utc(),
        }
    }

    /// A fresh id or receipt.
    fn new_id(&self) -> String {
        let id = match lock_ids(&self.ids).as_mut() {
            Some(seeded) => uuid::Uuid::from_u128(seeded.random()),
            None => uuid::Uuid::new_v4(),
        };
        id.to_string()
    }

    /// Simulates an outage: while `false`, every [`MessageQueue`] call
    /// (`prepare` included) fails with [`StorageError::Unavailable`] and
    /// changes nothing. The inspection methods below keep working.
    pub fn set_available(&self, available: bool) {
        self.outage.set_available(available);
    }

    /// False while an outage is simulated.
    pub fn is_available(&self) -> bool {
        self.outage.is_available()
    }

    /// Every message still in the queue, visible or not, oldest first.
    pub fn messages(&self) -> Vec<StoredMessage> {
        let now = Instant::now();
        self.lock()
            .iter()
            .map(|entry| StoredMessage {
                id: entry.id.clone(),
                body: entry.body.clone(),
                dequeue_count: entry.dequeue_count,
                inserted_at: entry.inserted_at,
                visible: entry.visible_at <= now,
            })
            .collect()
    }

    /// How many messages the queue holds, visible or not.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when the queue holds no messages at all.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    // A poisoned lock only means a test panicked elsewhere; the data is
    // still consistent because every critical section is panic-free.
    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lease_lost(id: &MessageId) -> StorageError {
        StorageError::LeaseLost {
            message_id: id.clone(),
        }
    }

    fn check_available(&self) -> Result<(), StorageError> {
        self.outage.check(&format!("queue {}", self.name))
    }
}

#[async_trait]
impl MessageQueue for InMemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    /// An in-memory queue always exists; this only fails during a
    /// simulated outage.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.check_available()
    }

    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        self.check_available()?;
        if max_messages == 0 || max_messages > MAX_RECEIVE_BATCH {
            return Err(StorageError::InvalidArgument(format!(
                "max_messages must be 1..={MAX_RECEIVE_BATCH}, got {max_messages}"
            )));
        }
        let now = Instant::now();
        let mut entries = self.lock();
        let received = entries
            .iter_mut()
            .filter(|entry| entry.visible_at <= now)
            .take(usize::from(max_messages))
            .map(|entry| {
                entry.dequeue_count += 1;
                entry.visible_at = now + visibility_timeout;
                let receipt = PopReceipt::new(self.new_id());
                entry.pop_receipt = Some(receipt.clone());
                QueueMessage {
                    id: entry.id.clone(),
                    pop_receipt: receipt,
                    body: entry.body.clone(),
                    dequeue_count: entry.dequeue_count,
                    inserted_at: Some(entry.inserted_at),
                }
            })
            .collect();
        Ok(received)
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        self.check_available()?;
        let mut entries = self.lock();
        let entry = entries
            .iter_mut()
            .find(|entry| &entry.id == id && entry.pop_receipt.as_ref() == Some(pop_receipt))
            .ok_or_else(|| Self::lease_lost(id))?;
        entry.visible_at = Instant::now() + visibility_timeout;
        let receipt = PopReceipt::new(self.new_id());
        entry.pop_receipt = Some(receipt.clone());
        Ok(receipt)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.check_available()?;
        let mut entries = self.lock();
        let index = entries
            .iter()
            .position(|entry| &entry.id == id && entry.pop_receipt.as_ref() == Some(pop_receipt))
            .ok_or_else(|| Self::lease_lost(id))?;
        entries.remove(index);
        Ok(())
    }

    async fn send(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError> {
        self.check_available()?;
        let id = MessageId::new(self.new_id());
        self.lock().push(Entry {
            id: id.clone(),
            body: body.to_owned(),
            dequeue_count: 0,
            inserted_at: self.sent_at(),
            visible_at: Instant::now() + initial_visibility_delay,
            pop_receipt: None,
        });
        Ok(id)
    }

    async fn peek(&self, max_messages: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        self.check_available()?;
        if max_messages == 0 || max_messages > MAX_RECEIVE_BATCH {
            return Err(StorageError::InvalidArgument(format!(
                "max_messages must be 1..={MAX_RECEIVE_BATCH}, got {max_messages}"
            )));
        }
        let now = Instant::now();
        Ok(self
            .lock()
            .iter()
            .filter(|entry| entry.visible_at <= now)
            .take(usize::from(max_messages))
            .map(|entry| VisibleMessage {
                id: entry.id.clone(),
                body: entry.body.clone(),
                dequeue_count: entry.dequeue_count,
                inserted_at: Some(entry.inserted_at),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VISIBILITY: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn received_messages_hide_until_their_visibility_timeout_ends() {
        let queue = InMemoryQueue::new("q");
        queue.send("a", Duration::ZERO).await.unwrap();
        let first = queue.receive(32, VISIBILITY).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].dequeue_count, 1);
        assert!(queue.receive(32, VISIBILITY).await.unwrap().is_empty());
        tokio::time::advance(VISIBILITY).await;
        let again = queue.receive(32, VISIBILITY).await.unwrap();
        assert_eq!(again[0].dequeue_count, 2);
        // The first receipt is stale now.
        let err = queue
            .delete(&first[0].id, &first[0].pop_receipt)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::LeaseLost { .. }));
        queue
            .delete(&again[0].id, &again[0].pop_receipt)
            .await
            .unwrap();
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn update_visibility_replaces_the_pop_receipt() {
        let queue = InMemoryQueue::new("q");
        queue.send("a", Duration::ZERO).await.unwrap();
        let message = queue.receive(1, VISIBILITY).await.unwrap().remove(0);
        let renewed = queue
            .update_visibility(&message.id, &message.pop_receipt, VISIBILITY)
            .await
            .unwrap();
        assert_ne!(renewed, message.pop_receipt);
        assert!(
            queue
                .update_visibility(&message.id, &message.pop_receipt, VISIBILITY)
                .await
                .is_err()
        );
        queue
            .update_visibility(&message.id, &renewed, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(queue.receive(1, VISIBILITY).await.unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_fails_every_call_and_changes_nothing() {
        let queue = InMemoryQueue::new("q");
        queue.prepare().await.unwrap();
        queue.send("a", Duration::ZERO).await.unwrap();
        let message = queue.receive(1, VISIBILITY).await.unwrap().remove(0);

        let client = queue.clone();
        client.set_available(false);
        assert!(!queue.is_available(), "clones share the outage");
        let errors = [
            queue.prepare().await.unwrap_err(),
            queue.receive(1, VISIBILITY).await.unwrap_err(),
            queue.send("b", Duration::ZERO).await.unwrap_err(),
            queue
                .update_visibility(&message.id, &message.pop_receipt, Duration::ZERO)
                .await
                .unwrap_err(),
            queue
                .delete(&message.id, &message.pop_receipt)
                .await
                .unwrap_err(),
        ];
        for error in errors {
            assert!(error.is_transient(), "{error:?}");
            assert!(error.to_string().contains("queue q"), "{error}");
        }
        assert_eq!(queue.len(), 1);

        queue.set_available(true);
        queue.prepare().await.unwrap();
        queue
            .delete(&message.id, &message.pop_receipt)
            .await
            .unwrap();
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn receive_respects_batch_size_and_initial_delay() {
        let queue = InMemoryQueue::new("q");
        for i in 0..5 {
            queue.send(&i.to_string(), Duration::ZERO).await.unwrap();
        }
        queue.send("later", Duration::from_secs(10)).await.unwrap();
        assert_eq!(queue.receive(3, VISIBILITY).await.unwrap().len(), 3);
        assert_eq!(queue.receive(32, VISIBILITY).await.unwrap().len(), 2);
        assert!(queue.receive(0, VISIBILITY).await.is_err());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            queue.receive(32, VISIBILITY).await.unwrap()[0].body,
            "later"
        );
    }
}
