//! The [`CheckpointStore`] trait (small documents keyed by job, every write
//! fenced by an ETag) and [`JobCheckpoint`], the per-job handle that carries
//! the ETag from read to write so a worker that lost its message cannot
//! overwrite newer progress.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spot_worker_decisions::cadence::{DEFAULT_SEED_EVICTIONS_PER_HOUR, IntervalSource};

use crate::error::StorageError;
use crate::files::ChunkStore;

mod cleanup;
mod files;
mod freshness;
mod job;
mod leftover;
mod measure;
mod notes;
mod restoring;
mod save_clock;
mod waiting;

pub use files::Committed;
pub use measure::Blocking;
pub use waiting::{DatedAnew, date_anew};

use files::FilesState;
pub use files::spawn_removal;
pub use job::JobCheckpoint;
pub use leftover::{Left, Leftover, remove_after_success};

pub use notes::CheckpointNotes;
pub use save_clock::SaveClock;

use measure::SaveMeasurement;

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

    /// Parses a stored JSON document; `what` names it in the error. A
    /// write stamp in it (see [`Checkpoint::to_json_bytes_stamped`]) is
    /// ignored.
    pub fn from_json_bytes(bytes: &[u8], what: &str) -> Result<Self, StorageError> {
        Self::from_json_bytes_stamped(bytes, what).map(|(checkpoint, _)| checkpoint)
    }

    /// Serializes to the JSON document stores keep, with `stamp` (see
    /// [`CheckpointStore::write`]) in its `written_by` field:
    /// `{"status":"in_progress","progress":…,"written_by":"…"}`. Readers that
    /// do not know stamps ignore the extra field.
    pub fn to_json_bytes_stamped(&self, stamp: &str) -> Result<Vec<u8>, StorageError> {
        let mut document = serde_json::to_value(self).map_err(|e| {
            StorageError::InvalidArgument(format!("checkpoint does not serialize: {e}"))
        })?;
        // Internally tagged: always an object with `status` and one payload
        // field, so `written_by` cannot collide with anything.
        let Some(fields) = document.as_object_mut() else {
            return Err(StorageError::InvalidArgument(
                "checkpoint does not serialize to a JSON object".to_owned(),
            ));
        };
        fields.insert(STAMP_FIELD.to_owned(), Value::String(stamp.to_owned()));
        serde_json::to_vec(&document).map_err(|e| {
            StorageError::InvalidArgument(format!("checkpoint does not serialize: {e}"))
        })
    }

    /// Parses a stored JSON document and its write stamp, if it has one (a
    /// stamp that is not a string counts as none: it cannot prove anything).
    pub fn from_json_bytes_stamped(
        bytes: &[u8],
        what: &str,
    ) -> Result<(Self, Option<String>), StorageError> {
        let invalid = |e: serde_json::Error| StorageError::InvalidData {
            what: what.to_owned(),
            reason: e.to_string(),
        };
        let mut document: Value = serde_json::from_slice(bytes).map_err(invalid)?;
        let stamp = document
            .as_object_mut()
            .and_then(|fields| fields.remove(STAMP_FIELD))
            .and_then(|stamp| match stamp {
                Value::String(stamp) => Some(stamp),
                _ => None,
            });
        let checkpoint = serde_json::from_value(document).map_err(invalid)?;
        Ok((checkpoint, stamp))
    }
}

/// The field of a stored checkpoint document that holds its write stamp.
const STAMP_FIELD: &str = "written_by";

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

    /// The latest checkpoint for `key`, with its ETag and the stamp of the
    /// write that stored it; `None` if there is none.
    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError>;

    /// Writes `checkpoint` for `key` if `precondition` holds and returns the
    /// new ETag; otherwise fails with [`StorageError::Conflict`].
    ///
    /// `stamp` is an opaque token naming this write, stored atomically with
    /// the checkpoint (a write without one clears the old one), so that
    /// [`read`](CheckpointStore::read) returns it. [`JobCheckpoint`] stamps
    /// every write with its own random writer id and a sequence number:
    /// after a conflict, the stamp is what proves whether the stored
    /// checkpoint is this handle's own earlier attempt (an SDK retry whose
    /// first try landed) or another worker's write. The payload cannot prove
    /// that: a worker that lost its message may well write the same progress
    /// as the new owner.
    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError>;

    /// Deletes the checkpoint for `key`; deleting one that does not exist
    /// succeeds. The consumer deletes attempt records with it when their
    /// message is gone; operators delete abandoned checkpoints.
    async fn delete(&self, key: &str) -> Result<(), StorageError>;

    /// The keys that start with `prefix`, in name order (every page: a
    /// blob store lists 5,000 a request). Only the fleet's records use it
    /// (`lanes::spot_capacity`: each Spot worker's notes, merged by the
    /// reader), under a prefix whose records are few and cleaned; never
    /// the job checkpoints.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError>;

    /// Where the chunks of large checkpoints go
    /// ([`JobCheckpoint::save_files`]), beside the documents (the blob
    /// store: the same container). `None` (the default): this store keeps
    /// documents only, and saving files through it fails. A store that
    /// wraps another should hand out the inner one's.
    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        None
    }
}

/// A checkpoint as stored: its content, the ETag that fences the next
/// write, and the stamp of the write that stored it (`None` if it was
/// written without one).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCheckpoint {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Its ETag.
    pub etag: ETag,
    /// The stamp of the write that stored it.
    pub stamp: Option<String>,
}

/// A shared store is a store: wrappers (a counting store in a test) can
/// take the `Arc` a consumer holds. Everything is forwarded.
#[async_trait]
impl CheckpointStore for Arc<dyn CheckpointStore> {
    async fn prepare(&self) -> Result<(), StorageError> {
        (**self).prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        (**self).read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        (**self).write(key, checkpoint, precondition, stamp).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        (**self).delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        (**self).list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        (**self).chunks()
    }
}

// Lets types holding a store derive Debug.
impl fmt::Debug for dyn CheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn CheckpointStore")
    }
}

/// Whether `error` means the checkpoint store cannot serve this worker now
/// (a transient failure; a refusal of its credentials; its container
/// missing, or `NotFound` from a backend that cannot tell): it says nothing
/// about the job, so it never counts as a failure. Waiting fixes an outage;
/// a refusal or a missing container that persists pauses the consumer's
/// intake until the store answers again (see `consumer::store_health`).
pub fn store_unreachable(error: &StorageError) -> bool {
    error.is_transient()
        || matches!(
            error,
            StorageError::NotFound { .. }
                | StorageError::Refused { .. }
                | StorageError::MissingContainer { .. }
        )
}
