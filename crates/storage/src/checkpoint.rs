//! The [`CheckpointStore`] trait (small documents keyed by job, every write
//! fenced by an ETag) and [`JobCheckpoint`], the per-job handle that carries
//! the ETag from read to write so a worker that lost its message cannot
//! overwrite newer progress.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::StorageError;

/// An opaque version tag of a stored checkpoint; it changes on every write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ETag(String);

impl ETag {
    /// Wraps an ETag string (as the store returned it, quotes included).
    pub fn new(etag: impl Into<String>) -> Self {
        ETag(etag.into())
    }

    /// The ETag as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The condition a checkpoint write must meet, or it fails with
/// [`StorageError::Conflict`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WritePrecondition {
    /// The checkpoint must not exist yet (`If-None-Match: *`).
    Create,
    /// The checkpoint must still have this ETag (`If-Match`).
    IfMatch(ETag),
}

/// A job's saved state: progress to resume from, or its final result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Checkpoint {
    /// The job is under way; `progress` is whatever the handler needs to
    /// resume.
    InProgress {
        /// Handler-defined progress.
        progress: Value,
    },
    /// The job finished; a redelivered message for it can be deleted without
    /// redoing the work.
    Completed {
        /// Handler-defined result.
        result: Value,
    },
}

impl Checkpoint {
    /// True for [`Checkpoint::Completed`].
    pub fn is_completed(&self) -> bool {
        matches!(self, Checkpoint::Completed { .. })
    }

    /// Serializes to the JSON document stores keep.
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, StorageError> {
        serde_json::to_vec(self).map_err(|e| {
            StorageError::InvalidArgument(format!("checkpoint does not serialize: {e}"))
        })
    }

    /// Parses a stored JSON document; `what` names it in the error.
    pub fn from_json_bytes(bytes: &[u8], what: &str) -> Result<Self, StorageError> {
        serde_json::from_slice(bytes).map_err(|e| StorageError::InvalidData {
            what: what.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// A store of checkpoints keyed by job. Implementations: `InMemoryCheckpointStore`
/// here, `BlobCheckpointStore` in `spot-worker-azure`.
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Makes the store ready for a worker: creates its container if it is
    /// missing and proves this worker can write to it (`BlobCheckpointStore`
    /// writes and deletes a small probe blob under `.spot-worker/`), so a
    /// warmup gate can refuse to take work while storage is unreachable or
    /// misconfigured. Idempotent; call it again after a failure.
    async fn prepare(&self) -> Result<(), StorageError>;

    /// The latest checkpoint for `key` and its ETag, or `None` if there is none.
    async fn read(&self, key: &str) -> Result<Option<(Checkpoint, ETag)>, StorageError>;

    /// Writes `checkpoint` for `key` if `precondition` holds and returns the
    /// new ETag; otherwise fails with [`StorageError::Conflict`].
    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
    ) -> Result<ETag, StorageError>;
}

// Lets types holding a store derive Debug.
impl fmt::Debug for dyn CheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn CheckpointStore")
    }
}

/// One job's checkpoint: what was read on delivery, and the ETag that fences
/// every later write.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use serde_json::json;
/// use spot_worker_storage::{InMemoryCheckpointStore, JobCheckpoint, StorageError};
///
/// let store = Arc::new(InMemoryCheckpointStore::new());
/// let mut mine = JobCheckpoint::load(store.clone(), "job-1").await?;
/// let mut stale = JobCheckpoint::load(store.clone(), "job-1").await?;
/// mine.save_progress(json!({"row": 10})).await?;
/// // A worker holding an older view cannot overwrite newer progress.
/// let err = stale.save_progress(json!({"row": 5})).await.unwrap_err();
/// assert!(matches!(err, StorageError::Conflict { .. }));
/// // Resuming reads the latest progress.
/// let resumed = JobCheckpoint::load(store, "job-1").await?;
/// assert_eq!(resumed.progress(), Some(&json!({"row": 10})));
/// # Ok::<(), StorageError>(())
/// # }).unwrap();
/// ```
pub struct JobCheckpoint {
    store: Arc<dyn CheckpointStore>,
    key: String,
    latest: Option<(Checkpoint, ETag)>,
    cancelled: Option<CancellationToken>,
}

impl fmt::Debug for JobCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobCheckpoint")
            .field("key", &self.key)
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl JobCheckpoint {
    /// Reads the latest checkpoint for `key`.
    pub async fn load(
        store: Arc<dyn CheckpointStore>,
        key: impl Into<String>,
    ) -> Result<Self, StorageError> {
        let key = key.into();
        let latest = store.read(&key).await?;
        Ok(JobCheckpoint {
            store,
            key,
            latest,
            cancelled: None,
        })
    }

    /// Refuses every write once `token` is cancelled (the consumer passes the
    /// job's token, cancelled when its lease is lost or on shutdown).
    pub fn fenced_by(mut self, token: CancellationToken) -> Self {
        self.cancelled = Some(token);
        self
    }

    /// The checkpoint key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The latest checkpoint known to this handle.
    pub fn latest(&self) -> Option<&Checkpoint> {
        self.latest.as_ref().map(|(checkpoint, _)| checkpoint)
    }

    /// The ETag of [`JobCheckpoint::latest`].
    pub fn etag(&self) -> Option<&ETag> {
        self.latest.as_ref().map(|(_, etag)| etag)
    }

    /// The saved progress, if the job is in progress.
    pub fn progress(&self) -> Option<&Value> {
        match self.latest() {
            Some(Checkpoint::InProgress { progress }) => Some(progress),
            _ => None,
        }
    }

    /// The saved result, if the job completed.
    pub fn result(&self) -> Option<&Value> {
        match self.latest() {
            Some(Checkpoint::Completed { result }) => Some(result),
            _ => None,
        }
    }

    /// True once a completed checkpoint was saved or read.
    pub fn is_completed(&self) -> bool {
        self.latest().is_some_and(Checkpoint::is_completed)
    }

    /// Saves progress (see [`JobCheckpoint::save`]).
    pub async fn save_progress(&mut self, progress: Value) -> Result<(), StorageError> {
        self.save(Checkpoint::InProgress { progress }).await
    }

    /// Saves the final result (see [`JobCheckpoint::save`]).
    pub async fn complete(&mut self, result: Value) -> Result<(), StorageError> {
        self.save(Checkpoint::Completed { result }).await
    }

    /// Writes `checkpoint`, fenced by the ETag this handle last saw.
    ///
    /// Idempotent: if the write conflicts but the store already holds exactly
    /// `checkpoint` (a retried write whose first attempt landed), it succeeds.
    /// Any other conflict is returned as [`StorageError::Conflict`] and the
    /// job should stop.
    pub async fn save(&mut self, checkpoint: Checkpoint) -> Result<(), StorageError> {
        if self
            .cancelled
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
        {
            return Err(StorageError::JobCancelled {
                key: self.key.clone(),
            });
        }
        let precondition = match self.etag() {
            Some(etag) => WritePrecondition::IfMatch(etag.clone()),
            None => WritePrecondition::Create,
        };
        match self.store.write(&self.key, &checkpoint, precondition).await {
            Ok(etag) => {
                self.latest = Some((checkpoint, etag));
                Ok(())
            }
            Err(StorageError::Conflict { key }) => match self.store.read(&self.key).await? {
                Some((stored, etag)) if stored == checkpoint => {
                    self.latest = Some((stored, etag));
                    Ok(())
                }
                _ => Err(StorageError::Conflict { key }),
            },
            Err(other) => Err(other),
        }
    }
}
