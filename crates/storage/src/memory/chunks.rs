//! [`InMemoryChunkStore`]: the chunks of large checkpoints in a map, as
//! the blob store keeps them in its container, each with its last-modified
//! date on a clock a test moves ([`InMemoryChunkStore::advance_clock`]),
//! and the container's retention rule as a sweep a test runs
//! ([`InMemoryChunkStore::expire_older_than`]): what Azure's lifecycle
//! management does about once a day.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StorageError;
use crate::files::ChunkStore;
use crate::memory::outage::Outage;

/// An in-memory [`ChunkStore`]. Clones share the same chunks (and the
/// outage switch of the checkpoint store that hands it out).
#[derive(Clone, Debug, Default)]
pub struct InMemoryChunkStore {
    chunks: Arc<Mutex<BTreeMap<String, Stored>>>,
    /// How far the store's clock is ahead of the wall clock.
    ahead: Arc<Mutex<Duration>>,
    outage: Outage,
}

/// A chunk and its last-modified date.
#[derive(Clone, Debug)]
struct Stored {
    bytes: Bytes,
    modified: SystemTime,
}

impl InMemoryChunkStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn sharing(outage: Outage) -> Self {
        InMemoryChunkStore {
            chunks: Arc::default(),
            ahead: Arc::default(),
            outage,
        }
    }

    /// Moves the store's clock (its [`ChunkStore::now`], which dates its
    /// writes) `by` forward.
    pub fn advance_clock(&self, by: Duration) {
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        *ahead = ahead.saturating_add(by);
    }

    /// The retention rule: deletes every chunk last modified more than
    /// `retention` ago on the store's clock (Azure's
    /// `daysAfterModificationGreaterThan`); returns their names.
    pub fn expire_older_than(&self, retention: Duration) -> Vec<String> {
        let now = self.now();
        let mut chunks = self.lock();
        let expired: Vec<String> = chunks
            .iter()
            .filter(|(_, stored)| {
                now.duration_since(stored.modified)
                    .is_ok_and(|age| age > retention)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &expired {
            chunks.remove(name);
        }
        expired
    }

    /// When the chunk `name` was last modified, on the store's clock.
    pub fn modified(&self, name: &str) -> Option<SystemTime> {
        self.lock().get(name).map(|stored| stored.modified)
    }

    /// The stored names, sorted, for assertions in tests.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The bytes stored in all chunks.
    pub fn stored_bytes(&self) -> u64 {
        self.lock().values().map(|s| s.bytes.len() as u64).sum()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Stored>> {
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
        let modified = self.now();
        self.lock().insert(
            name.to_owned(),
            Stored {
                bytes: chunk,
                modified,
            },
        );
        Ok(())
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        self.check(name)?;
        let now = self.now();
        Ok(self
            .lock()
            .get_mut(name)
            .map(|stored| stored.modified = now)
            .is_some())
    }

    fn now(&self) -> SystemTime {
        let ahead = *self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        SystemTime::now() + ahead
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        self.check(name)?;
        match self.lock().get(name).map(|stored| &stored.bytes) {
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
