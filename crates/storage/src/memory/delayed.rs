//! [`DelayedCheckpointStore`]: a checkpoint store that answers each call
//! after a fixed latency, and counts its reads and writes, around another
//! one; for tests and benches of many workers sharing a few documents
//! (with tokio's paused clock, the latency is simulated and exact).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::checkpoint::{Checkpoint, CheckpointStore, ETag, StoredCheckpoint, WritePrecondition};
use crate::error::StorageError;
use crate::files::ChunkStore;

/// How many names a blob store returns a listing request (Azure's most).
pub const LIST_PAGE: usize = 5000;

/// `inner`, each call answered `latency` after it was made (the call
/// applies at the end of the wait).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use spot_worker_storage::CheckpointStore;
/// use spot_worker_storage::memory::{DelayedCheckpointStore, InMemoryCheckpointStore};
///
/// let store = DelayedCheckpointStore::new(
///     Arc::new(InMemoryCheckpointStore::new()),
///     Duration::from_millis(20),
/// );
/// let started = tokio::time::Instant::now();
/// assert!(store.read("job").await.unwrap().is_none());
/// assert_eq!(started.elapsed(), Duration::from_millis(20));
/// assert_eq!((store.reads(), store.writes()), (1, 0));
/// # });
/// ```
#[derive(Debug)]
pub struct DelayedCheckpointStore {
    inner: Arc<dyn CheckpointStore>,
    latency: Duration,
    reads: AtomicU64,
    writes: AtomicU64,
    deletes: AtomicU64,
    lists: AtomicU64,
}

impl DelayedCheckpointStore {
    /// `inner` with `latency` on every call.
    pub fn new(inner: Arc<dyn CheckpointStore>, latency: Duration) -> Self {
        DelayedCheckpointStore {
            inner,
            latency,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            lists: AtomicU64::new(0),
        }
    }

    /// How many reads were made.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// How many writes were made (those refused included).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// How many deletes were made.
    pub fn deletes(&self) -> u64 {
        self.deletes.load(Ordering::Relaxed)
    }

    /// How many pages of listings were read: a blob store answers a
    /// listing [`LIST_PAGE`] names a request, so each page costs a call
    /// (and its latency).
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl CheckpointStore for DelayedCheckpointStore {
    async fn prepare(&self) -> Result<(), StorageError> {
        tokio::time::sleep(self.latency).await;
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        self.inner.read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        self.inner.write(key, checkpoint, precondition, stamp).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.deletes.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        let keys = self.inner.list(prefix).await?;
        // Bounded: one more page per LIST_PAGE names.
        for _ in 1..keys.len().div_ceil(LIST_PAGE) {
            self.lists.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.latency).await;
        }
        Ok(keys)
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        self.inner.chunks()
    }
}
