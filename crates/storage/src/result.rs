//! The [`ResultStore`] trait: where jobs write their final results, each
//! one create-only, so two workers racing on one job (a redelivery while the
//! first worker was still running, say) can never leave conflicting results.
//! Writing the same result again is harmless, which makes a retried job
//! idempotent.

use std::fmt;

use async_trait::async_trait;

use crate::error::StorageError;

/// What [`ResultStore::put_new`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PutOutcome {
    /// The result did not exist; it does now.
    Created,
    /// The result already existed with exactly these bytes (an earlier
    /// attempt, or another worker that computed the same thing); nothing
    /// was written.
    AlreadyExistsIdentical,
}

/// Named, write-once results. Implementations: `InMemoryResultStore` here,
/// `BlobResultStore` in `spot-worker-azure`.
#[async_trait]
pub trait ResultStore: Send + Sync + 'static {
    /// The store's name (the container, for blob storage), for logs.
    fn name(&self) -> &str;

    /// Makes the store ready for a worker: creates its container if it is
    /// missing and proves this worker can write to it (`BlobResultStore`
    /// writes and deletes a small probe blob under `.spot-worker/`).
    /// Idempotent; call it again after a failure.
    async fn prepare(&self) -> Result<(), StorageError>;

    /// Stores `body` under `name` unless something is stored there already.
    ///
    /// If `name` exists with exactly `body`, nothing is written and the
    /// outcome is [`PutOutcome::AlreadyExistsIdentical`]; if it exists with
    /// other bytes, the call fails with [`StorageError::Conflict`] and the
    /// stored result is left as it is.
    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError>;

    /// The stored bytes of `name`, or `None` if there is no such result.
    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError>;
}

// Lets types holding a store derive Debug.
impl fmt::Debug for dyn ResultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dyn ResultStore({})", self.name())
    }
}
