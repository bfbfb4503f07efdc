//! [`InMemoryCheckpointStore`]: checkpoints in a map, with ETags that change
//! on every write, the same preconditions as blob storage, and write stamps
//! kept with each checkpoint (as the blob store keeps them in the document).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::checkpoint::{Checkpoint, CheckpointStore, ETag, StoredCheckpoint, WritePrecondition};
use crate::error::StorageError;
use crate::files::ChunkStore;
use crate::memory::InMemoryChunkStore;
use crate::memory::outage::Outage;

/// A stored checkpoint, its ETag and the stamp it was written with.
type Entry = (Checkpoint, ETag, Option<String>);

/// An in-memory [`CheckpointStore`]. Clones share the same checkpoints (and
/// the same outage switch).
#[derive(Clone, Debug, Default)]
pub struct InMemoryCheckpointStore {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    outage: Outage,
    chunks: Arc<std::sync::OnceLock<InMemoryChunkStore>>,
}

impl InMemoryCheckpointStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The chunks of large checkpoints ([`CheckpointStore::chunks`]),
    /// sharing this store's outage switch.
    pub fn chunk_store(&self) -> InMemoryChunkStore {
        self.chunks
            .get_or_init(|| InMemoryChunkStore::sharing(self.outage.clone()))
            .clone()
    }

    /// Simulates an outage: while `false`, every [`CheckpointStore`] call
    /// (`prepare` included) fails with [`StorageError::Unavailable`] and
    /// changes nothing. The inspection methods below keep working.
    pub fn set_available(&self, available: bool) {
        self.outage.set_available(available);
    }

    /// False while an outage is simulated.
    pub fn is_available(&self) -> bool {
        self.outage.is_available()
    }

    /// The stored checkpoint for `key`, for assertions in tests.
    pub fn get(&self, key: &str) -> Option<Checkpoint> {
        self.lock()
            .get(key)
            .map(|(checkpoint, _, _)| checkpoint.clone())
    }

    /// The stored keys, sorted, for assertions in tests.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// How many checkpoints are stored.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no checkpoint is stored.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl CheckpointStore for InMemoryCheckpointStore {
    /// Nothing to create in memory; this only fails during a simulated
    /// outage.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.outage.check("checkpoint store")
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.outage.check("checkpoint store")?;
        Ok(self
            .lock()
            .get(key)
            .cloned()
            .map(|(checkpoint, etag, stamp)| StoredCheckpoint {
                checkpoint,
                etag,
                stamp,
            }))
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.store(key, checkpoint, precondition, stamp)
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.outage.check("checkpoint store")?;
        self.lock().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.outage.check("checkpoint store")?;
        let mut keys: Vec<String> = self
            .lock()
            .keys()
            .filter(|key| key.starts_with(prefix))
            .cloned()
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        Some(Arc::new(self.chunk_store()))
    }
}

impl InMemoryCheckpointStore {
    /// One write: checks the precondition and replaces checkpoint and stamp
    /// together (an unstamped write clears the stamp, as a blob upload
    /// replaces the whole document).
    fn store(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.outage.check("checkpoint store")?;
        let mut entries = self.lock();
        let current = entries.get(key).map(|(_, etag, _)| etag);
        let allowed = match (&precondition, current) {
            (WritePrecondition::Create, None) => true,
            (WritePrecondition::IfMatch(expected), Some(actual)) => expected == actual,
            _ => false,
        };
        if !allowed {
            return Err(StorageError::Conflict {
                key: key.to_owned(),
            });
        }
        let etag = ETag::new(format!("\"{}\"", uuid::Uuid::new_v4()));
        entries.insert(
            key.to_owned(),
            (checkpoint.clone(), etag.clone(), stamp.map(str::to_owned)),
        );
        Ok(etag)
    }
}

#[cfg(test)]
mod tests {
    //! What only the in-memory store does: simulated outages. The contract
    //! every checkpoint store meets runs in `tests/it/contract.rs`.

    use super::*;
    use serde_json::json;

    fn progress(n: i64) -> Checkpoint {
        Checkpoint::InProgress { progress: json!(n) }
    }

    #[tokio::test]
    async fn an_outage_fails_every_call_and_changes_nothing() {
        let store = InMemoryCheckpointStore::new();
        store.prepare().await.unwrap();
        store.clone().set_available(false);
        assert!(!store.is_available(), "clones share the outage");
        let errors = [
            store.prepare().await.unwrap_err(),
            store.read("k").await.unwrap_err(),
            store
                .write("k", &progress(1), WritePrecondition::Create, None)
                .await
                .unwrap_err(),
        ];
        for error in errors {
            assert!(error.is_transient(), "{error:?}");
        }
        assert!(store.is_empty());
        store.set_available(true);
        store.prepare().await.unwrap();
        store
            .write("k", &progress(1), WritePrecondition::Create, None)
            .await
            .unwrap();
    }
}
