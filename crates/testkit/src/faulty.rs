//! [`FaultyQueue`]: any [`MessageQueue`] with faults a test switches on and
//! off while it runs, and a record of the calls made. One double for every
//! test and benchmark, instead of a hand-written forwarding wrapper per
//! fault.
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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spot_worker_storage::{
    MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError, async_trait,
};

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
    /// Renewals never answer.
    pub renewals_hang: AtomicBool,
    /// The next renewal is applied, but its answer comes this much later.
    pub slow_renewal_answer: Mutex<Option<Duration>>,
    /// Receives return up to 32 messages whatever they ask for.
    pub receive_ignores_max: AtomicBool,
    /// Receives answer after this many milliseconds.
    pub receive_delay_ms: AtomicU64,
    /// Sends answer after this many milliseconds.
    pub send_delay_ms: AtomicU64,
    /// Renewals asked for (counted before any fault applies).
    pub renewals: AtomicU32,
    receives_at: Mutex<Vec<tokio::time::Instant>>,
    updates: AtomicU32,
    deletes: AtomicU32,
    sends: AtomicU32,
}

impl QueueFaults {
    /// When each receive was called, on tokio's clock.
    pub fn receives_at(&self) -> MutexGuard<'_, Vec<tokio::time::Instant>> {
        // Nothing panics while holding it: the data stays consistent.
        self.receives_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        self.slow_renewal_answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
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
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max: u8,
        visibility: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        let faults = &self.faults;
        faults.receives_at().push(tokio::time::Instant::now());
        self.unavailable_if(QueueFaults::on(&faults.receives_failing), "receive")?;
        let max = if QueueFaults::on(&faults.receive_ignores_max) {
            32
        } else {
            max
        };
        let received = self.inner.receive(max, visibility).await?;
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
        self.inner.update_visibility(id, receipt, visibility).await
    }

    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), StorageError> {
        self.faults.deletes.fetch_add(1, Ordering::SeqCst);
        self.unavailable_if(false, "delete")?;
        self.inner.delete(id, receipt).await
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
        self.inner.send(body, delay).await
    }
}
