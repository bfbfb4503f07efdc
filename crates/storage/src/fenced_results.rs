//! [`FencedResults`]: a [`ResultStore`] as one delivery's handler sees it,
//! refusing writes once the delivery is no longer the handler's, the way
//! [`JobCheckpoint`](crate::JobCheckpoint) refuses checkpoint writes.
//!
//! Why: a handler that ignores cancellation (blocking code on the blocking
//! pool, a thread of its own) can outlive its delivery. Its message is then
//! released to another worker, and a result it writes late would race the
//! new holder's. Results written through the job's fence are refused from
//! the moment the consumer lets go of the delivery.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::StorageError;
use crate::result::{PutOutcome, ResultStore};

/// A [`ResultStore`] whose writes are fenced by one delivery: `put_new` is
/// refused with [`StorageError::JobCancelled`] once the message was released,
/// its lease lost, or its delivery settled. Reads are not fenced. Get one
/// from [`Job::results`](crate::Job::results).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use spot_worker_storage::{
///     CancellationToken, FencedResults, InMemoryResultStore, ResultStore, StorageError,
/// };
///
/// let store = InMemoryResultStore::new("results");
/// let fence = CancellationToken::new();
/// let results = FencedResults::new(Arc::new(store.clone()), "job-1", fence.clone());
/// results.put_new("a.json", b"1").await.unwrap();
/// fence.cancel(); // the message was released
/// let refused = results.put_new("b.json", b"2").await.unwrap_err();
/// assert!(matches!(refused, StorageError::JobCancelled { .. }));
/// assert_eq!(store.get("b.json").await.unwrap(), None);
/// # });
/// ```
#[derive(Clone)]
pub struct FencedResults {
    store: Arc<dyn ResultStore>,
    key: String,
    fence: CancellationToken,
}

impl std::fmt::Debug for FencedResults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedResults")
            .field("store", &self.store.name())
            .field("key", &self.key)
            .field("fenced", &self.is_fenced())
            .finish()
    }
}

impl FencedResults {
    /// `store`, written for the job `key` until `fence` is cancelled.
    pub fn new(
        store: Arc<dyn ResultStore>,
        key: impl Into<String>,
        fence: CancellationToken,
    ) -> Self {
        FencedResults {
            store,
            key: key.into(),
            fence,
        }
    }

    /// Whether writes are refused now.
    pub fn is_fenced(&self) -> bool {
        self.fence.is_cancelled()
    }

    fn refused(&self) -> StorageError {
        StorageError::JobCancelled {
            key: self.key.clone(),
        }
    }
}

#[async_trait]
impl ResultStore for FencedResults {
    fn name(&self) -> &str {
        self.store.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.store.prepare().await
    }

    /// [`ResultStore::put_new`] while the delivery is the handler's; refused
    /// once it is not, and a write still waiting for its answer when the
    /// fence closes is abandoned and reported as refused.
    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        if self.is_fenced() {
            return Err(self.refused());
        }
        tokio::select! {
            biased;
            () = self.fence.cancelled() => Err(self.refused()),
            put = self.store.put_new(name, body) => put,
        }
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.store.get(name).await
    }

    /// [`ResultStore::put_new_file`], fenced like [`FencedResults::put_new`].
    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        if self.is_fenced() {
            return Err(self.refused());
        }
        tokio::select! {
            biased;
            () = self.fence.cancelled() => Err(self.refused()),
            put = self.store.put_new_file(name, file, len) => put,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryResultStore;

    #[tokio::test]
    async fn writes_are_refused_once_fenced_and_reads_are_not() {
        let store = InMemoryResultStore::new("results");
        let fence = CancellationToken::new();
        let results = FencedResults::new(Arc::new(store.clone()), "j1", fence.clone());
        assert_eq!(
            results.put_new("a", b"1").await.unwrap(),
            PutOutcome::Created
        );
        fence.cancel();
        assert!(results.is_fenced());
        let refused = results.put_new("b", b"2").await.unwrap_err();
        assert!(
            matches!(&refused, StorageError::JobCancelled { key } if key == "j1"),
            "{refused:?}"
        );
        assert_eq!(store.get("b").await.unwrap(), None, "nothing written");
        assert_eq!(results.get("a").await.unwrap(), Some(b"1".to_vec()));
    }
}
