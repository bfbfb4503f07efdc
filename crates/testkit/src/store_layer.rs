//! [`Layered`]: the one wrapper tests put around a [`CheckpointStore`]
//! (and the [`ChunkStore`] it hands out) to inject faults or record calls.
//! A [`Policy`] decides each call ([`Action`]: pass, fail before it
//! applies, refuse it for good, apply and lose the answer, wait first,
//! never answer, or answer without applying) and hears of each call that reached the store, so a
//! test writes what it wants to happen, not another implementation of the
//! trait. Tower-style: it wraps any store, a layer included.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::Arc;
//! use spot_worker_storage::{Checkpoint, CheckpointStore, InMemoryCheckpointStore, WritePrecondition};
//! use spot_worker_testkit::store_layer::{Action, Call, Layered, StoreCall};
//!
//! let inner = InMemoryCheckpointStore::new();
//! // Every write to a key under `locked/` fails before it applies.
//! let store = Layered::wrap(Arc::new(inner.clone()), |call: &Call<'_>| {
//!     if call.kind == StoreCall::CheckpointWrite && call.key.starts_with("locked/") {
//!         Action::FailBefore
//!     } else {
//!         Action::Pass
//!     }
//! });
//! let saved = Checkpoint::InProgress { progress: serde_json::json!(1) };
//! let refused = store.write("locked/a", &saved, WritePrecondition::Create, None).await;
//! assert!(refused.unwrap_err().is_transient());
//! store.write("open/a", &saved, WritePrecondition::Create, None).await.unwrap();
//! assert_eq!(inner.get("locked/a"), None);
//! assert_eq!(inner.get("open/a"), Some(saved));
//! # });
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use spot_worker_storage::files::ChunkStore;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, StorageError, StoredCheckpoint, WritePrecondition,
    async_trait,
};

/// A kind of store call.
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

/// One call a [`Policy`] decides: its kind, the key (checkpoint) or name
/// (chunk) it is about, and the checkpoint a write writes.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// What kind of call.
    pub kind: StoreCall,
    /// The checkpoint's key or the chunk's name.
    pub key: &'a str,
    /// What a [`StoreCall::CheckpointWrite`] writes.
    pub checkpoint: Option<&'a Checkpoint>,
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// It applies and answers.
    Pass,
    /// It fails `Unavailable` without reaching the store.
    FailBefore,
    /// It fails `Rejected` with this HTTP status without reaching the
    /// store: a refusal for good (a body too large, a name refused), not
    /// an outage.
    Reject(u16),
    /// It applies, then fails `Unavailable` (the answer was lost).
    LoseAnswer,
    /// It waits this long (tokio's clock), then applies and answers.
    Delay(Duration),
    /// It never answers (and never applies).
    Hang,
    /// It answers success without reaching the store (a delete a test
    /// wants kept from happening); for calls answering `()` or `true`,
    /// anything else passes.
    Ignore,
}

/// Decides each call of a [`Layered`] store, and hears of each that
/// reached the store.
pub trait Policy: Send + Sync + 'static {
    /// What happens to `call`.
    fn decide(&self, call: &Call<'_>) -> Action;

    /// `call` reached the store (passed, delayed, or applied with its
    /// answer lost); `answered` is whether the store answered success.
    fn reached(&self, call: &Call<'_>, answered: bool) {
        let _ = (call, answered);
    }
}

impl<F> Policy for F
where
    F: Fn(&Call<'_>) -> Action + Send + Sync + 'static,
{
    fn decide(&self, call: &Call<'_>) -> Action {
        self(call)
    }
}

/// `inner` with every call (its chunk store's too) decided by a policy
/// `P`. Clones share the policy.
pub struct Layered<P> {
    inner: Arc<dyn CheckpointStore>,
    policy: Arc<P>,
}

impl<P> Clone for Layered<P> {
    fn clone(&self) -> Self {
        Layered {
            inner: Arc::clone(&self.inner),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<P> std::fmt::Debug for Layered<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layered").finish_non_exhaustive()
    }
}

impl<P: Policy> Layered<P> {
    /// `inner`, each call decided by `policy`.
    pub fn wrap(inner: Arc<dyn CheckpointStore>, policy: P) -> Self {
        Layered {
            inner,
            policy: Arc::new(policy),
        }
    }

    /// The store beneath, without the policy.
    pub fn inner(&self) -> &Arc<dyn CheckpointStore> {
        &self.inner
    }

    /// The policy (what a recording policy recorded).
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Runs `apply` (not yet started) as the policy decides for `call`;
    /// `ignored` is the answer of an [`Action::Ignore`]d call, if it has one.
    async fn call<T>(
        &self,
        call: Call<'_>,
        ignored: Option<T>,
        apply: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let lost = |how: &str| StorageError::Unavailable {
            message: format!("simulated fault: {:?} {} ({how})", call.kind, call.key),
        };
        let answer = match self.policy.decide(&call) {
            Action::FailBefore => return Err(lost("not applied")),
            Action::Reject(status) => {
                return Err(StorageError::Rejected {
                    status,
                    message: format!("simulated refusal: {:?} {}", call.kind, call.key),
                });
            }
            Action::Hang => std::future::pending::<Result<T, StorageError>>().await,
            Action::Ignore if ignored.is_some() => return ignored.ok_or_else(|| lost("ignored")),
            Action::Delay(delay) => {
                tokio::time::sleep(delay).await;
                apply.await
            }
            Action::LoseAnswer => {
                let answer = apply.await;
                self.policy.reached(&call, answer.is_ok());
                return Err(lost("applied, answer lost"));
            }
            Action::Pass | Action::Ignore => apply.await,
        };
        self.policy.reached(&call, answer.is_ok());
        answer
    }
}

fn on(kind: StoreCall, key: &str) -> Call<'_> {
    Call {
        kind,
        key,
        checkpoint: None,
    }
}

#[async_trait]
impl<P: Policy> CheckpointStore for Layered<P> {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        let call = on(StoreCall::CheckpointRead, key);
        self.call(call, None, self.inner.read(key)).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        let call = Call {
            kind: StoreCall::CheckpointWrite,
            key,
            checkpoint: Some(checkpoint),
        };
        let write = self.inner.write(key, checkpoint, precondition, stamp);
        self.call(call, None, write).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let call = on(StoreCall::CheckpointDelete, key);
        self.call(call, Some(()), self.inner.delete(key)).await
    }

    /// Let through: no fault plan yet needs a listing to fail.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        let chunks = self.inner.chunks()?;
        Some(Arc::new(LayeredChunks {
            inner: chunks,
            layer: self.clone(),
        }))
    }
}

/// The chunk store of a [`Layered`] store, under the same policy.
struct LayeredChunks<P> {
    inner: Arc<dyn ChunkStore>,
    layer: Layered<P>,
}

#[async_trait]
impl<P: Policy> ChunkStore for LayeredChunks<P> {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        let call = on(StoreCall::ChunkPut, name);
        self.layer
            .call(call, None, self.inner.put(name, chunk))
            .await
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        let call = on(StoreCall::ChunkGet, name);
        self.layer.call(call, None, self.inner.get(name, len)).await
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        let call = on(StoreCall::ChunkTouch, name);
        self.layer
            .call(call, Some(true), self.inner.touch(name))
            .await
    }

    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        let call = on(StoreCall::ChunkDelete, name);
        self.layer
            .call(call, Some(()), self.inner.delete(name))
            .await
    }
}

/// A [`Policy`] that passes every call and keeps a copy of every job
/// checkpoint written successfully (keys under `.spot-worker/`, the
/// library's own records, left out); optionally it keeps every chunk too
/// (chunk deletes [`Action::Ignore`]d), so each version saved can be
/// restored afterwards.
#[derive(Debug, Default)]
pub struct KeepWrites {
    written: Mutex<Vec<Checkpoint>>,
    keep_chunks: bool,
}

impl KeepWrites {
    /// Records writes; chunks are deleted as the library asks.
    pub fn new() -> Self {
        KeepWrites::default()
    }

    /// Records writes and keeps every chunk.
    pub fn keeping_chunks() -> Self {
        KeepWrites {
            written: Mutex::default(),
            keep_chunks: true,
        }
    }

    /// Every job checkpoint written, in order.
    pub fn written(&self) -> Vec<Checkpoint> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Policy for KeepWrites {
    fn decide(&self, call: &Call<'_>) -> Action {
        if self.keep_chunks && call.kind == StoreCall::ChunkDelete {
            Action::Ignore
        } else {
            Action::Pass
        }
    }

    fn reached(&self, call: &Call<'_>, answered: bool) {
        if let (true, Some(checkpoint)) = (answered, call.checkpoint)
            && !call.key.starts_with(".spot-worker/")
        {
            self.written
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(checkpoint.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_storage::InMemoryCheckpointStore;

    fn saved(n: u64) -> Checkpoint {
        Checkpoint::InProgress {
            progress: serde_json::json!(n),
        }
    }

    #[tokio::test]
    async fn a_lost_answer_applies_and_a_failure_before_does_not() {
        let inner = InMemoryCheckpointStore::new();
        let store = Layered::wrap(Arc::new(inner.clone()), |call: &Call<'_>| match call.key {
            "lost" => Action::LoseAnswer,
            "before" => Action::FailBefore,
            _ => Action::Pass,
        });
        for key in ["lost", "before"] {
            let answer = store
                .write(key, &saved(1), WritePrecondition::Create, None)
                .await;
            assert!(answer.unwrap_err().is_transient(), "{key}");
        }
        assert_eq!(inner.get("lost"), Some(saved(1)));
        assert_eq!(inner.get("before"), None);
    }

    #[tokio::test]
    async fn a_rejection_fails_for_good_with_its_status_and_does_not_apply() {
        let inner = InMemoryCheckpointStore::new();
        let store = Layered::wrap(Arc::new(inner.clone()), |call: &Call<'_>| {
            if call.kind == StoreCall::ChunkPut {
                Action::Reject(413)
            } else {
                Action::Pass
            }
        });
        let chunks = store.chunks().unwrap();
        let refused = chunks.put("c", Bytes::from_static(b"x")).await.unwrap_err();
        assert!(
            matches!(refused, StorageError::Rejected { status: 413, .. }),
            "{refused:?}"
        );
        assert!(!refused.is_transient(), "{refused:?}");
        assert!(inner.chunk_store().names().is_empty(), "not applied");
        store
            .write("job", &saved(1), WritePrecondition::Create, None)
            .await
            .unwrap();
        assert_eq!(inner.get("job"), Some(saved(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_waits_and_a_hang_never_answers() {
        let inner = InMemoryCheckpointStore::new();
        let store = Layered::wrap(Arc::new(inner.clone()), |call: &Call<'_>| match call.key {
            "slow" => Action::Delay(Duration::from_secs(5)),
            "stuck" => Action::Hang,
            _ => Action::Pass,
        });
        let started = tokio::time::Instant::now();
        assert_eq!(store.read("slow").await, Ok(None));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let stuck = tokio::time::timeout(Duration::from_secs(600), store.read("stuck")).await;
        assert!(stuck.is_err(), "a hung call never answers");
    }

    #[tokio::test]
    async fn keep_writes_records_job_checkpoints_and_keeps_chunks() {
        let inner = InMemoryCheckpointStore::new();
        let store = Layered::wrap(Arc::new(inner.clone()), KeepWrites::keeping_chunks());
        for (key, n) in [("job", 1), (".spot-worker/attempts/job", 2), ("other", 3)] {
            let _ = store
                .write(key, &saved(n), WritePrecondition::Create, None)
                .await;
        }
        assert_eq!(store.policy().written(), [saved(1), saved(3)]);
        let chunks = store.chunks().unwrap();
        chunks.put("c", Bytes::from_static(b"x")).await.unwrap();
        chunks.delete("c").await.unwrap();
        assert_eq!(inner.chunk_store().names(), ["c"], "the delete was ignored");
    }
}
