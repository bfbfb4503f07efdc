//! [`InMemoryResultStore`]: create-only results in a map, with the same
//! outcomes as blob storage written with `If-None-Match: *`, and large
//! results written as blob storage writes them: staged as blocks that
//! belong to the blob (not to the upload), committed by their list of ids
//! ([`BlockBlobs`]). So two writers of one result interleave here as they
//! do on Azure, and a fault search can find what that breaks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::error::StorageError;
use crate::memory::outage::Outage;
use crate::result::{PutOutcome, ResultStore};
use crate::result_blocks::{self, BlockBlobs};

/// Blob storage's block size for results (up to 195 GiB).
const BLOCK: u64 = 4 * 1024 * 1024;

#[derive(Debug, Default)]
struct Blobs {
    /// Committed results.
    committed: BTreeMap<String, Vec<u8>>,
    /// Uncommitted blocks, per blob, by id.
    staged: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

/// An in-memory [`ResultStore`]. Clones share the same results (and the same
/// outage switch).
#[derive(Clone, Debug)]
pub struct InMemoryResultStore {
    name: Arc<str>,
    blobs: Arc<Mutex<Blobs>>,
    outage: Outage,
    block: u64,
}

impl InMemoryResultStore {
    /// An empty store called `name`, staging results over 4 MiB in blocks
    /// of 4 MiB, as blob storage does.
    pub fn new(name: &str) -> Self {
        InMemoryResultStore {
            name: Arc::from(name),
            blobs: Arc::default(),
            outage: Outage::default(),
            block: BLOCK,
        }
    }

    /// This store with blocks of `bytes` (at least 1): small results
    /// staged in several blocks, so tests stay small.
    #[must_use]
    pub fn with_block_size(mut self, bytes: u64) -> Self {
        self.block = bytes.max(1);
        self
    }

    /// Simulates an outage: while `false`, every [`ResultStore`] call
    /// (`prepare` included) fails with [`StorageError::Unavailable`] and
    /// changes nothing. The inspection methods below keep working.
    pub fn set_available(&self, available: bool) {
        self.outage.set_available(available);
    }

    /// False while an outage is simulated.
    pub fn is_available(&self) -> bool {
        self.outage.is_available()
    }

    /// The names of the stored results, sorted, for assertions in tests.
    pub fn names(&self) -> Vec<String> {
        self.lock().committed.keys().cloned().collect()
    }

    /// The stored bytes of `name`, for assertions in tests (no outage).
    pub fn stored(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().committed.get(name).cloned()
    }

    /// How many uncommitted blocks the blob `name` has.
    pub fn staged_blocks(&self, name: &str) -> usize {
        self.lock().staged.get(name).map_or(0, BTreeMap::len)
    }

    /// How many results are stored.
    pub fn len(&self) -> usize {
        self.lock().committed.len()
    }

    /// True when no result is stored.
    pub fn is_empty(&self) -> bool {
        self.lock().committed.is_empty()
    }

    // A poisoned lock only means a test panicked elsewhere; every critical
    // section here is panic-free, so the maps are consistent.
    fn lock(&self) -> MutexGuard<'_, Blobs> {
        self.blobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check(&self, name: Option<&str>) -> Result<(), StorageError> {
        self.outage.check(&format!("result store {}", self.name))?;
        if name.is_some_and(str::is_empty) {
            return Err(StorageError::InvalidArgument(
                "a result name must not be empty".to_owned(),
            ));
        }
        Ok(())
    }
}

fn conflict(name: &str) -> StorageError {
    StorageError::Conflict {
        key: name.to_owned(),
    }
}

#[async_trait]
impl BlockBlobs for InMemoryResultStore {
    fn container(&self) -> &str {
        &self.name
    }

    async fn prepare_container(&self) -> Result<(), StorageError> {
        self.check(None)
    }

    fn block_size(&self, _len: u64) -> u64 {
        self.block
    }

    async fn put_blob_new(&self, name: &str, body: &[u8]) -> Result<(), StorageError> {
        self.check(Some(name))?;
        let mut blobs = self.lock();
        if blobs.committed.contains_key(name) {
            return Err(conflict(name));
        }
        blobs.committed.insert(name.to_owned(), body.to_vec());
        blobs.staged.remove(name);
        Ok(())
    }

    async fn stage_block(&self, name: &str, id: &str, block: &[u8]) -> Result<(), StorageError> {
        self.check(Some(name))?;
        self.lock()
            .staged
            .entry(name.to_owned())
            .or_default()
            .insert(id.to_owned(), block.to_vec());
        Ok(())
    }

    async fn commit_blocks_new(&self, name: &str, ids: &[String]) -> Result<(), StorageError> {
        self.check(Some(name))?;
        let mut blobs = self.lock();
        if blobs.committed.contains_key(name) {
            return Err(conflict(name));
        }
        let Some(staged) = blobs.staged.get(name) else {
            return Err(conflict(name));
        };
        let mut body = Vec::new();
        for id in ids {
            // Azure's InvalidBlockList: another commit discarded it.
            let block = staged.get(id).ok_or_else(|| conflict(name))?;
            body.extend_from_slice(block);
        }
        blobs.staged.remove(name);
        blobs.committed.insert(name.to_owned(), body);
        Ok(())
    }

    async fn get_blob(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.check(Some(name))?;
        Ok(self.lock().committed.get(name).cloned())
    }
}

#[async_trait]
impl ResultStore for InMemoryResultStore {
    fn name(&self) -> &str {
        &self.name
    }

    /// Nothing to create in memory; this only fails during a simulated
    /// outage.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.check(None)
    }

    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        result_blocks::put_new(self, name, body).await
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.get_blob(name).await
    }

    /// Reads the file whole (it is kept in memory anyway); one over a
    /// block is staged in blocks and committed by their list.
    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        self.check(Some(name))?;
        result_blocks::put_new_file(self, name, file, len).await
    }
}

#[cfg(test)]
mod tests {
    //! What only the in-memory store does: simulated outages. The contract
    //! every result store meets runs in `tests/it/contract.rs`.

    use super::*;

    #[tokio::test]
    async fn an_outage_fails_every_call_and_changes_nothing() {
        let store = InMemoryResultStore::new("results");
        store.clone().set_available(false);
        assert!(!store.is_available(), "clones share the outage");
        let errors = [
            store.prepare().await.unwrap_err(),
            store.put_new("a", b"1").await.unwrap_err(),
            store.get("a").await.unwrap_err(),
        ];
        for error in errors {
            assert!(error.is_transient(), "{error:?}");
            assert!(
                error.to_string().contains("result store results"),
                "{error}"
            );
        }
        assert!(store.is_empty());
        store.set_available(true);
        store.prepare().await.unwrap();
        assert_eq!(store.put_new("a", b"1").await, Ok(PutOutcome::Created));
    }

    /// Uncommitted blocks belong to the blob: staged under one id by two
    /// uploads, the later one's bytes are what a commit of that id stores
    /// (which is why each upload names its blocks alone), and a commit
    /// discards every other uncommitted block, so a list naming one is
    /// refused as a conflict.
    #[tokio::test]
    async fn staged_blocks_belong_to_the_blob() {
        let store = InMemoryResultStore::new("results").with_block_size(2);
        let ids = |prefix: &str| vec![format!("{prefix}0"), format!("{prefix}1")];
        for (id, block) in [("0", b"aa"), ("1", b"aa"), ("0", b"bb")] {
            store.stage_block("r", id, block).await.unwrap();
        }
        store.commit_blocks_new("r", &ids("")).await.unwrap();
        assert_eq!(
            store.stored("r").unwrap(),
            b"bbaa",
            "a mixture, as on Azure"
        );
        assert_eq!(store.staged_blocks("r"), 0);

        store.stage_block("s", "x0", b"aa").await.unwrap();
        store.stage_block("s", "y0", b"bb").await.unwrap();
        store.stage_block("s", "y1", b"bb").await.unwrap();
        store.commit_blocks_new("s", &ids("y")).await.unwrap();
        store.stage_block("s", "x1", b"aa").await.unwrap();
        let late = store.commit_blocks_new("s", &ids("x")).await.unwrap_err();
        assert!(matches!(late, StorageError::Conflict { .. }), "{late:?}");
        assert_eq!(store.stored("s").unwrap(), b"bbbb");
    }

    /// A result over one block goes through staging; two uploads of
    /// different bytes settle: the first is stored whole, the second is a
    /// conflict, the same bytes again are identical.
    #[tokio::test]
    async fn a_large_result_is_staged_and_settles_by_comparing() {
        use std::io::Write as _;
        let store = InMemoryResultStore::new("results").with_block_size(4);
        let file = |bytes: &[u8]| {
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(bytes).unwrap();
            file
        };
        let put = |bytes: &'static [u8]| {
            let store = store.clone();
            let file = file(bytes);
            async move { store.put_new_file("r", file, bytes.len() as u64).await }
        };
        assert_eq!(put(b"0123456789").await, Ok(PutOutcome::Created));
        assert_eq!(
            put(b"0123456789").await,
            Ok(PutOutcome::AlreadyExistsIdentical)
        );
        assert!(matches!(
            put(b"9876543210").await,
            Err(StorageError::Conflict { .. })
        ));
        assert_eq!(store.stored("r").unwrap(), b"0123456789");
    }
}
