//! [`InMemoryResultStore`]: create-only results in a map, with the same
//! outcomes as blob storage written with `If-None-Match: *`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::error::StorageError;
use crate::memory::outage::Outage;
use crate::result::{PutOutcome, ResultStore};

/// An in-memory [`ResultStore`]. Clones share the same results (and the same
/// outage switch).
#[derive(Clone, Debug)]
pub struct InMemoryResultStore {
    name: Arc<str>,
    entries: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    outage: Outage,
}

impl InMemoryResultStore {
    /// An empty store called `name`.
    pub fn new(name: &str) -> Self {
        InMemoryResultStore {
            name: Arc::from(name),
            entries: Arc::default(),
            outage: Outage::default(),
        }
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
        self.lock().keys().cloned().collect()
    }

    /// How many results are stored.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no result is stored.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    // A poisoned lock only means a test panicked elsewhere; every critical
    // section here is panic-free, so the map is consistent.
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.entries
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
        self.check(Some(name))?;
        let mut entries = self.lock();
        match entries.get(name) {
            None => {
                entries.insert(name.to_owned(), body.to_vec());
                Ok(PutOutcome::Created)
            }
            Some(stored) if stored == body => Ok(PutOutcome::AlreadyExistsIdentical),
            Some(_) => Err(StorageError::Conflict {
                key: name.to_owned(),
            }),
        }
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.check(Some(name))?;
        Ok(self.lock().get(name).cloned())
    }

    /// Reads the file whole (it is kept in memory anyway).
    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        self.check(Some(name))?;
        let body = crate::result::read_whole(file, len).await?;
        self.put_new(name, &body).await
    }
}

#[cfg(test)]
mod tests {
    //! What only the in-memory store does: simulated outages. The contract
    //! every result store meets runs in `tests/contract.rs`.

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
}
