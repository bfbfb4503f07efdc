//! [`FaultyQueue`]: any [`MessageQueue`] with faults a test switches on and
//! off while it runs, and a record of the calls made: how many of each
//! kind, when, what each receive asked for and got, when deletes and
//! releases were answered. One double for every test and benchmark,
//! instead of a hand-written forwarding wrapper per fault or count.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::atomic::Ordering;
//! use std::time::Duration;
//! use spot_worker_testkit::faulty::FaultyQueue;
//! use spot_worker_storage::{InMemoryQueue, MessageQueue};
//!
//! let queue = FaultyQueue::new(InMemoryQueue::new("jobs"));
//! queue.faults().cut_off.store(true, Ordering::SeqCst);
//! assert!(queue.send("lost?", Duration::ZERO).await.is_err());
//! queue.faults().cut_off.store(false, Ordering::SeqCst);
//! queue.send("kept", Duration::ZERO).await.unwrap();
//! assert_eq!(queue.faults().calls(), (0, 0, 0, 2));
//! # });
//! ```

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spot_worker_storage::{
    MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError, VisibleMessage, async_trait,
};
use tokio::sync::watch;
use tokio::time::Instant;

/// Azure refuses a message over 64 KiB.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The switches and the record of one [`FaultyQueue`] (shared by clones).
#[derive(Debug, Default)]
pub struct QueueFaults {
    /// Every call fails as `Unavailable`: a network partition.
    pub cut_off: AtomicBool,
    /// Receives fail as `Unavailable`.
    pub receives_failing: AtomicBool,
    /// Every visibility update (renewals and releases) fails as
    /// `Unavailable`.
    pub updates_failing: AtomicBool,
    /// Renewals (visibility updates with a non-zero timeout) fail as
    /// `Unavailable`.
    pub renewals_failing: AtomicBool,
    /// Deletes fail as `Unavailable`, before they apply.
    pub deletes_failing: AtomicBool,
    /// Renewals never answer.
    pub renewals_hang: AtomicBool,
    /// The next renewal is applied, but its answer comes this much later.
    pub slow_renewal_answer: Mutex<Option<Duration>>,
    /// Receives return up to 32 messages whatever they ask for.
    pub receive_ignores_max: AtomicBool,
    /// Receives answer after this many milliseconds.
    pub receive_delay_ms: AtomicU64,
    /// Receives reach the service this many milliseconds after they are
    /// sent: what they take is what the queue holds then.
    pub receive_in_transit_ms: AtomicU64,
    /// Sends answer after this many milliseconds.
    pub send_delay_ms: AtomicU64,
    /// A send lands, then never answers: the sender was killed right
    /// after it (the lane keeper's mid-move crash).
    pub sends_hang_after_landing: AtomicBool,
    /// Renewals asked for (counted before any fault applies).
    pub renewals: AtomicU32,
    receives_at: Mutex<Vec<Instant>>,
    receives: Mutex<Vec<Receive>>,
    /// Received and not yet deleted.
    outstanding: AtomicUsize,
    prepares: AtomicU32,
    updates: AtomicU32,
    deletes: AtomicU32,
    sends: AtomicU32,
    /// When each delete was answered with success, in order.
    deleted_at: DeletedAt,
    /// When each release (visibility set to zero) was answered with success.
    released_at: Mutex<Vec<Instant>>,
}

/// A watch on the successful deletes' times, so a waiter wakes on each.
#[derive(Debug)]
struct DeletedAt(watch::Sender<Vec<Instant>>);

impl Default for DeletedAt {
    fn default() -> Self {
        DeletedAt(watch::channel(Vec::new()).0)
    }
}

/// One answered receive, as [`QueueFaults::receives`] records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receive {
    /// How many messages it asked for (before `receive_ignores_max`).
    pub asked: usize,
    /// Messages received earlier and not yet deleted when it was sent.
    pub outstanding: usize,
    /// How many it got.
    pub got: usize,
}

impl QueueFaults {
    /// When each receive was called, on tokio's clock.
    pub fn receives_at(&self) -> MutexGuard<'_, Vec<Instant>> {
        locked(&self.receives_at)
    }

    /// Every receive that was answered: what it asked for, what was
    /// outstanding, what it got.
    pub fn receives(&self) -> Vec<Receive> {
        locked(&self.receives).clone()
    }

    /// `prepare` calls.
    pub fn prepares(&self) -> u32 {
        self.prepares.load(Ordering::SeqCst)
    }

    /// When each successful delete was answered, in order.
    pub fn deleted_at(&self) -> Vec<Instant> {
        self.deleted_at.0.borrow().clone()
    }

    /// Resolves once `count` deletes have succeeded.
    pub async fn deleted(&self, count: usize) {
        let mut deleted = self.deleted_at.0.subscribe();
        // The sender lives in `self`, so the channel cannot close first.
        let _ = deleted.wait_for(|at| at.len() >= count).await;
    }

    /// When each successful release (visibility set to zero) was answered.
    pub fn released_at(&self) -> Vec<Instant> {
        locked(&self.released_at).clone()
    }

    /// Calls made: (receives, visibility updates, deletes, sends), failed
    /// ones included.
    pub fn calls(&self) -> (usize, u32, u32, u32) {
        (
            self.receives_at().len(),
            self.updates.load(Ordering::SeqCst),
            self.deletes.load(Ordering::SeqCst),
            self.sends.load(Ordering::SeqCst),
        )
    }

    fn on(flag: &AtomicBool) -> bool {
        flag.load(Ordering::SeqCst)
    }

    fn take_slow_answer(&self) -> Option<Duration> {
        locked(&self.slow_renewal_answer).take()
    }
}

/// Nothing panics while holding these locks: the data stays consistent.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A queue with switchable faults around `Q`; like Azure, it refuses
/// messages over 64 KiB.
#[derive(Clone)]
pub struct FaultyQueue<Q> {
    inner: Q,
    faults: Arc<QueueFaults>,
}

impl<Q: MessageQueue> FaultyQueue<Q> {
    /// `inner` with every fault off.
    pub fn new(inner: Q) -> Self {
        FaultyQueue {
            inner,
            faults: Arc::default(),
        }
    }

    /// The switches and the record.
    pub fn faults(&self) -> &Arc<QueueFaults> {
        &self.faults
    }

    fn unavailable_if(&self, fault: bool, what: &str) -> Result<(), StorageError> {
        if fault || QueueFaults::on(&self.faults.cut_off) {
            return Err(StorageError::Unavailable {
                message: format!("simulated outage ({what})"),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl<Q: MessageQueue> MessageQueue for FaultyQueue<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.faults.prepares.fetch_add(1, Ordering::SeqCst);
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max: u8,
        visibility: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        let faults = &self.faults;
        faults.receives_at().push(Instant::now());
        self.unavailable_if(QueueFaults::on(&faults.receives_failing), "receive")?;
        let asked = usize::from(max);
        let outstanding = faults.outstanding.load(Ordering::SeqCst);
        let in_transit = faults.receive_in_transit_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(in_transit)).await;
        let max = if QueueFaults::on(&faults.receive_ignores_max) {
            32
        } else {
            max
        };
        let received = self.inner.receive(max, visibility).await?;
        faults
            .outstanding
            .fetch_add(received.len(), Ordering::SeqCst);
        locked(&faults.receives).push(Receive {
            asked,
            outstanding,
            got: received.len(),
        });
        let delay = faults.receive_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        Ok(received)
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        receipt: &PopReceipt,
        visibility: Duration,
    ) -> Result<PopReceipt, StorageError> {
        let faults = &self.faults;
        faults.updates.fetch_add(1, Ordering::SeqCst);
        self.unavailable_if(QueueFaults::on(&faults.updates_failing), "update")?;
        if !visibility.is_zero() {
            faults.renewals.fetch_add(1, Ordering::SeqCst);
            if QueueFaults::on(&faults.renewals_hang) {
                std::future::pending::<()>().await;
            }
            self.unavailable_if(QueueFaults::on(&faults.renewals_failing), "renewal")?;
            if let Some(delay) = faults.take_slow_answer() {
                let renewed = self.inner.update_visibility(id, receipt, visibility).await;
                tokio::time::sleep(delay).await;
                return renewed;
            }
        }
        let updated = self
            .inner
            .update_visibility(id, receipt, visibility)
            .await?;
        if visibility.is_zero() {
            locked(&faults.released_at).push(Instant::now());
        }
        Ok(updated)
    }

    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), StorageError> {
        let faults = &self.faults;
        faults.deletes.fetch_add(1, Ordering::SeqCst);
        self.unavailable_if(QueueFaults::on(&faults.deletes_failing), "delete")?;
        self.inner.delete(id, receipt).await?;
        // Saturating: a message may have been received through another
        // handle on the same queue.
        let _ = faults
            .outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            });
        faults
            .deleted_at
            .0
            .send_modify(|at| at.push(Instant::now()));
        Ok(())
    }

    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.faults.sends.fetch_add(1, Ordering::SeqCst);
        self.unavailable_if(false, "send")?;
        let send_delay = self.faults.send_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(send_delay)).await;
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(StorageError::Rejected {
                status: 413,
                message: format!("message of {} bytes is over 64 KiB", body.len()),
            });
        }
        let sent = self.inner.send(body, delay).await;
        if QueueFaults::on(&self.faults.sends_hang_after_landing) {
            std::future::pending::<()>().await;
        }
        sent
    }

    async fn peek(&self, max: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        self.unavailable_if(false, "peek")?;
        self.inner.peek(max).await
    }
}

#[cfg(test)]
mod tests {
    use spot_worker_storage::InMemoryQueue;

    use super::*;

    #[tokio::test]
    async fn the_record_follows_receives_deletes_and_releases() {
        let queue = FaultyQueue::new(InMemoryQueue::new("jobs"));
        queue.prepare().await.unwrap();
        for i in 0..3 {
            queue
                .send(&format!("job {i}"), Duration::ZERO)
                .await
                .unwrap();
        }
        let first = queue.receive(2, Duration::from_secs(30)).await.unwrap();
        queue
            .delete(&first[0].id, &first[0].pop_receipt)
            .await
            .unwrap();
        let second = queue.receive(4, Duration::from_secs(30)).await.unwrap();
        queue
            .update_visibility(&second[0].id, &second[0].pop_receipt, Duration::ZERO)
            .await
            .unwrap();
        let faults = queue.faults();
        assert_eq!(
            faults.receives(),
            [
                Receive {
                    asked: 2,
                    outstanding: 0,
                    got: 2
                },
                Receive {
                    asked: 4,
                    outstanding: 1,
                    got: 1
                },
            ]
        );
        assert_eq!(faults.prepares(), 1);
        assert_eq!(faults.deleted_at().len(), 1);
        assert_eq!(faults.released_at().len(), 1);
        // Already reached: resolves at once.
        faults.deleted(1).await;
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_the_delete_it_waits_for() {
        let queue = FaultyQueue::new(InMemoryQueue::new("jobs"));
        queue.send("job", Duration::ZERO).await.unwrap();
        let faults = Arc::clone(queue.faults());
        let waiting = tokio::spawn(async move { faults.deleted(1).await });
        let received = queue.receive(1, Duration::from_secs(30)).await.unwrap();
        assert!(!waiting.is_finished());
        queue
            .delete(&received[0].id, &received[0].pop_receipt)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by the delete")
            .unwrap();
    }
}
