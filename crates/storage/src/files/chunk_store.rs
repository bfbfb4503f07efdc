//! [`ChunkStore`]: where the pieces of large checkpoints go. A checkpoint
//! store that can hold files beside its documents hands one out
//! ([`CheckpointStore::chunks`](crate::CheckpointStore::chunks)); the blob
//! store keeps them in the same container (and under the same retention
//! rule), the in-memory store in a map.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StorageError;

/// Immutable blobs of at most a few MiB, each written once under a name
/// the caller chooses (see `files::manifest` for how names are made: a
/// job's prefix, the content's hash and the save that sent it) and read
/// back whole. No listing: every chunk a job uses is named by its
/// manifest.
#[async_trait]
pub trait ChunkStore: Send + Sync + 'static {
    /// Stores `chunk` under `name`. Writing the same name again replaces
    /// it (names carry the content's hash, so it is the same bytes).
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError>;

    /// The chunk `name`, which must be exactly `len` bytes long: a longer
    /// or shorter one is [`StorageError::InvalidData`], read no further
    /// than `len` bytes, so nothing stored can make the reader allocate
    /// more than it asked for. `None` if there is no such chunk.
    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError>;

    /// Refreshes the chunk `name`'s last-modified date (what the
    /// container's retention rule measures) without sending its bytes:
    /// the blob store sets its metadata, a write that changes the date and
    /// nothing else. `false` if there is no such chunk.
    async fn touch(&self, name: &str) -> Result<bool, StorageError>;

    /// The time on the store's clock: what it stamps as a write's
    /// last-modified date (the wall clock, but for a test store whose
    /// clock a test moves). A store that wraps another forwards it.
    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }

    /// Deletes the chunk `name`; one that does not exist counts as deleted.
    async fn delete(&self, name: &str) -> Result<(), StorageError>;
}

impl fmt::Debug for dyn ChunkStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn ChunkStore")
    }
}
