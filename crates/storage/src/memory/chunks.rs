//! [`InMemoryChunkStore`]: the chunks of large checkpoints in a map, as
//! the blob store keeps them in its container.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StorageError;
use crate::files::ChunkStore;
use crate::memory::outage::Outage;

/// An in-memory [`ChunkStore`]. Clones share the same chunks (and the
/// outage switch of the checkpoint store that hands it out).
#[derive(Clone, Debug, Default)]
pub struct InMemoryChunkStore {
    chunks: Arc<Mutex<BTreeMap<String, Bytes>>>,
    outage: Outage,
}

impl InMemoryChunkStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn sharing(outage: Outage) -> Self {
        InMemoryChunkStore {
            chunks: Arc::default(),
            outage,
        }
    }

    /// The stored names, sorted, for assertions in tests.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The bytes stored in all chunks.
    pub fn stored_bytes(&self) -> u64 {
        self.lock().values().map(|b| b.len() as u64).sum()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.chunks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check(&self, name: &str) -> Result<(), StorageError> {
        self.outage.check("chunk store")?;
        if name.is_empty() {
            return Err(StorageError::InvalidArgument(
                "a chunk name must not be empty".to_owned(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl ChunkStore for InMemoryChunkStore {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        self.check(name)?;
        self.lock().insert(name.to_owned(), chunk);
        Ok(())
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        self.check(name)?;
        match self.lock().get(name) {
            None => Ok(None),
            Some(bytes) if bytes.len() == len => Ok(Some(bytes.clone())),
            Some(bytes) => Err(StorageError::InvalidData {
                what: format!("chunk {name}"),
                reason: format!("{} bytes, not the {len} expected", bytes.len()),
            }),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        self.check(name)?;
        self.lock().remove(name);
        Ok(())
    }
}
