//! [`LostAnswerStore`]: any [`CheckpointStore`] (and the [`ChunkStore`]
//! it hands out) whose calls fail on a plan the test writes, either
//! before they reach the store or after they applied: the answer lost on
//! the way back ([`Fault::AnswerLost`], what a timeout, a reset connection
//! or a dropped response does to a write that landed). The caller sees
//! `Unavailable` either way and cannot tell which; a correct caller must
//! treat such a write as possibly landed.
//!
//! Faults are planned per kind of call ([`StoreCall`]), first planned
//! first used, or decided for every call by a function of the call (a
//! seeded fault search: [`LostAnswerStore::deciding`]). Every fault that
//! fired is recorded, so a test can say what happened.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::Arc;
//! use spot_worker_storage::{Checkpoint, CheckpointStore, InMemoryCheckpointStore, WritePrecondition};
//! use spot_worker_testkit::lost_answers::{Fault, LostAnswerStore, StoreCall};
//!
//! let inner = InMemoryCheckpointStore::new();
//! let store = LostAnswerStore::new(Arc::new(inner.clone()));
//! store.plan(StoreCall::CheckpointWrite, Fault::AnswerLost);
//! let saved = Checkpoint::InProgress { progress: serde_json::json!(1) };
//! let answer = store.write("job", &saved, WritePrecondition::Create, None).await;
//! assert!(answer.unwrap_err().is_transient());
//! assert_eq!(inner.get("job"), Some(saved), "it landed all the same");
//! assert_eq!(store.fired(), [(StoreCall::CheckpointWrite, Fault::AnswerLost)]);
//! # });
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use spot_worker_storage::files::ChunkStore;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, StorageError, StoredCheckpoint, WritePrecondition,
    async_trait,
};

/// A kind of store call a fault can be planned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreCall {
    /// [`CheckpointStore::read`].
    CheckpointRead,
    /// [`CheckpointStore::write`].
    CheckpointWrite,
    /// [`CheckpointStore::delete`].
    CheckpointDelete,
    /// [`ChunkStore::put`].
    ChunkPut,
    /// [`ChunkStore::get`].
    ChunkGet,
    /// [`ChunkStore::touch`].
    ChunkTouch,
    /// [`ChunkStore::delete`].
    ChunkDelete,
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fails as `Unavailable` without reaching the store.
    Before,
    /// Applied by the store, then answered `Unavailable`.
    AnswerLost,
}

/// Decides the fault of each call, if any (a seeded search's dice).
pub type Decider = Box<dyn FnMut(StoreCall) -> Option<Fault> + Send>;

#[derive(Default)]
struct Plan {
    /// `None`: a call planned to go through (so a fault lands on a later one).
    planned: HashMap<StoreCall, VecDeque<Option<Fault>>>,
    decider: Option<Decider>,
    fired: Vec<(StoreCall, Fault)>,
}

/// A checkpoint store with planned faults (see the module doc). Clones
/// share the plan and the record.
#[derive(Clone)]
pub struct LostAnswerStore {
    inner: Arc<dyn CheckpointStore>,
    plan: Arc<Mutex<Plan>>,
}

impl std::fmt::Debug for LostAnswerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostAnswerStore").finish_non_exhaustive()
    }
}

impl LostAnswerStore {
    /// `inner`, with no fault planned.
    pub fn new(inner: Arc<dyn CheckpointStore>) -> Self {
        LostAnswerStore {
            inner,
            plan: Arc::default(),
        }
    }

    /// `inner`, each call's fault decided by `decider` (after any planned
    /// with [`LostAnswerStore::plan`]).
    pub fn deciding(inner: Arc<dyn CheckpointStore>, decider: Decider) -> Self {
        let store = Self::new(inner);
        store.lock().decider = Some(decider);
        store
    }

    /// The next call of kind `call` not yet planned gets `fault`.
    pub fn plan(&self, call: StoreCall, fault: Fault) {
        self.lock()
            .planned
            .entry(call)
            .or_default()
            .push_back(Some(fault));
    }

    /// The next call of kind `call` not yet planned goes through: a
    /// fault planned after it lands on the one after.
    pub fn plan_clean(&self, call: StoreCall) {
        self.lock().planned.entry(call).or_default().push_back(None);
    }

    /// The faults that fired, in order.
    pub fn fired(&self) -> Vec<(StoreCall, Fault)> {
        self.lock().fired.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fault(&self, call: StoreCall) -> Option<Fault> {
        let mut plan = self.lock();
        let fault = match plan.planned.get_mut(&call).and_then(VecDeque::pop_front) {
            Some(planned) => planned,
            None => plan.decider.as_mut().and_then(|decide| decide(call)),
        };
        if let Some(fault) = fault {
            plan.fired.push((call, fault));
        }
        fault
    }

    /// Runs `apply` under the fault planned for `call`.
    async fn call<T>(
        &self,
        call: StoreCall,
        apply: impl std::future::Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let lost = |when: &str| StorageError::Unavailable {
            message: format!("{call:?}: {when} (a planned fault)"),
        };
        match self.fault(call) {
            None => apply.await,
            Some(Fault::Before) => Err(lost("failed before it reached the store")),
            Some(Fault::AnswerLost) => {
                // Applied; whatever it answered is lost.
                let _ = apply.await;
                Err(lost("applied, then its answer was lost"))
            }
        }
    }
}

#[async_trait]
impl CheckpointStore for LostAnswerStore {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.call(StoreCall::CheckpointRead, self.inner.read(key))
            .await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.call(
            StoreCall::CheckpointWrite,
            self.inner.write(key, checkpoint, precondition, stamp),
        )
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.call(StoreCall::CheckpointDelete, self.inner.delete(key))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        let inner = self.inner.chunks()?;
        Some(Arc::new(LostAnswerChunks {
            inner,
            faults: self.clone(),
        }))
    }
}

/// The chunk store of a [`LostAnswerStore`], under the same plan.
struct LostAnswerChunks {
    inner: Arc<dyn ChunkStore>,
    faults: LostAnswerStore,
}

#[async_trait]
impl ChunkStore for LostAnswerChunks {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        self.faults
            .call(StoreCall::ChunkPut, self.inner.put(name, chunk))
            .await
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        self.faults
            .call(StoreCall::ChunkGet, self.inner.get(name, len))
            .await
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        self.faults
            .call(StoreCall::ChunkTouch, self.inner.touch(name))
            .await
    }

    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        self.faults
            .call(StoreCall::ChunkDelete, self.inner.delete(name))
            .await
    }
}
