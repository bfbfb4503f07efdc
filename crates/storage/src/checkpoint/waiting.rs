//! Dating a waiting job's checkpoint anew when its message is given a
//! fresh life (a lane move, a requeue, a re-send of the same job).
//!
//! The container's retention rule deletes blobs some days after their
//! last write. Saves and restores keep a manifest's blobs younger than
//! [`REFRESH_AFTER`](super::freshness::REFRESH_AFTER) (see `freshness`),
//! but a job that waits unrun does neither, while each move sends its
//! message again with a fresh time-to-live: without more, a job moved
//! weekly for longer than the retention would find its chunks, and its
//! manifest, gone. So whoever sends a job's message anew first calls
//! [`date_anew`]: if the job's manifest dates its blobs more than
//! `REFRESH_AFTER` ago, every blob it names is touched and the manifest
//! is written again with the new date (fenced by the ETag it was read
//! with, its write stamp kept, so a holder's fence and the lane rule's
//! view of the job's progress are unchanged). Hence when a message is
//! sent, no blob of its job's manifest is more than `REFRESH_AFTER` old,
//! and neither is the manifest: the message outlives neither while the
//! retention is at least its time-to-live plus `REFRESH_AFTER`.

use std::sync::Arc;

use super::freshness::{dated, dated_since, needs_refresh, touch_all};
use super::{Checkpoint, CheckpointStore, StoredCheckpoint, WritePrecondition};
use crate::error::StorageError;
use crate::files::manifest::Manifest;

/// What [`date_anew`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatedAnew {
    /// The job has no checkpoint files (no checkpoint, a completed one, or
    /// progress that is not a manifest), or its store keeps none.
    NoFiles,
    /// The manifest's blobs are recent enough: nothing written.
    Recent,
    /// Every blob the manifest names was touched and the manifest written
    /// again with the new date.
    Touched {
        /// How many blobs were touched.
        blobs: usize,
    },
    /// Every blob was touched, but the manifest changed meanwhile (a
    /// holder saved: its save dates its own blobs), so it was left as is.
    Superseded {
        /// How many blobs were touched.
        blobs: usize,
    },
}

/// Dates the checkpoint files of the job `key` anew if the retention rule
/// could reach them before a message sent now expires (see the module).
///
/// An error if the checkpoint or a blob could not be read or touched
/// (the caller should not give the message a fresh life on the strength
/// of it), or [`StorageError::InvalidData`] if a blob the manifest names
/// is missing already (the checkpoint cannot be restored, whatever is
/// sent).
pub async fn date_anew(
    store: &Arc<dyn CheckpointStore>,
    key: &str,
) -> Result<DatedAnew, StorageError> {
    let Some(chunks) = store.chunks() else {
        return Ok(DatedAnew::NoFiles);
    };
    let Some(StoredCheckpoint {
        checkpoint: Checkpoint::InProgress { progress },
        etag,
        stamp,
    }) = store.read(key).await?
    else {
        return Ok(DatedAnew::NoFiles);
    };
    let Some(manifest) = Manifest::from_progress(&progress) else {
        return Ok(DatedAnew::NoFiles);
    };
    let now = chunks.now();
    if !needs_refresh(dated_since(&progress), now) {
        return Ok(DatedAnew::Recent);
    }
    let index = super::files::index_of(chunks.as_ref(), &manifest?).await?;
    let names: Vec<String> = index.names().collect();
    let blobs = names.len();
    touch_all(chunks, names).await?;
    let progress = dated(progress, now);
    match store
        .write(
            key,
            &Checkpoint::InProgress { progress },
            WritePrecondition::IfMatch(etag),
            stamp.as_deref(),
        )
        .await
    {
        Ok(_) => Ok(DatedAnew::Touched { blobs }),
        Err(StorageError::Conflict { .. }) => Ok(DatedAnew::Superseded { blobs }),
        Err(error) => Err(error),
    }
}
