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

    /// [`ResultStore::put_new`] of the first `len` bytes of `file`, read
    /// from it as they are sent: a store that can stream (the blob store:
    /// in blocks, a few at a time) holds a bounded part of it in memory
    /// whatever its size. The default reads it whole into memory, up to
    /// [`WHOLE_RESULT_MAX`]; a larger one is refused.
    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        if len > WHOLE_RESULT_MAX {
            return Err(StorageError::InvalidArgument(format!(
                "a result of {len} bytes: this result store reads results whole, up to {WHOLE_RESULT_MAX} bytes"
            )));
        }
        let body = read_whole(file, len).await?;
        self.put_new(name, &body).await
    }
}

/// The largest result [`ResultStore::put_new_file`] reads whole by default.
pub const WHOLE_RESULT_MAX: u64 = 64 * 1024 * 1024;

/// The first `len` bytes of `file` (from its start), read on a blocking
/// thread; a file shorter than `len` is an error (it changed).
pub async fn read_whole(file: std::fs::File, len: u64) -> Result<Vec<u8>, StorageError> {
    let read = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut body = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut body, 0).map(|()| body)
    })
    .await
    .map_err(|e| StorageError::InvalidArgument(format!("reading the result: {e}")))?;
    read.map_err(|e| StorageError::InvalidArgument(format!("reading the result: {e}")))
}

// Lets types holding a store derive Debug.
impl fmt::Debug for dyn ResultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dyn ResultStore({})", self.name())
    }
}
