//! Deleting the chunks of a job's checkpoint files that no manifest needs,
//! beside whatever the job does next, on the strength of what the store
//! says rather than what the handle believes.
//!
//! A handle believes the chunks its last saves sent are named by nothing
//! when the write of the manifest naming them failed. That belief is wrong
//! when the write landed and only its answer was lost: another holder may
//! have read that manifest since (a duplicate delivery, or the next holder
//! after a lost lease) and reuse its chunks by name. So after a save that
//! lost to another holder, or whose job was released, the job's stored
//! checkpoint is read again, and only what its manifest does not name is
//! deleted; if the store cannot say (the read, or a page of the manifest,
//! fails), nothing is. A chunk left behind costs storage until the
//! container's retention rule removes it; a chunk deleted wrongly costs
//! the job.
//!
//! No later write can name a chunk the stored manifest does not: a save
//! names only chunks its handle sent or read in the manifest it is fenced
//! on, and that manifest is no longer stored, so its write fails.

use std::sync::Arc;

use super::{Checkpoint, CheckpointStore, StoredCheckpoint};
use crate::error::StorageError;
use crate::files::ChunkStore;
use crate::files::manifest::{ChunkKey, Manifest, name_of};

/// How many deletes of unused chunks run at once.
const REMOVALS_AT_ONCE: usize = 8;

/// Of the chunks `sent` (under `prefix`), those a stored checkpoint
/// `stored` does not name, its manifest's chunks being `named` (if it
/// holds a manifest): what may be deleted.
pub(crate) fn unnamed_by_stored(
    sent: Vec<ChunkKey>,
    named: Option<&crate::files::ChunkIndex>,
) -> Vec<ChunkKey> {
    match named {
        None => sent,
        Some(index) => sent
            .into_iter()
            .filter(|key| !index.names_key(key))
            .collect(),
    }
}

/// Deletes those of `sent` (chunks of the job `key`, under `prefix`) that
/// the job's stored checkpoint does not name, reading it first; deletes
/// nothing if the store cannot say. Returns the names deleted.
pub(crate) async fn remove_unless_stored(
    checkpoints: Arc<dyn CheckpointStore>,
    chunks: Arc<dyn ChunkStore>,
    key: String,
    prefix: String,
    sent: Vec<ChunkKey>,
) -> Vec<String> {
    if sent.is_empty() {
        return Vec::new();
    }
    let named = match stored_index(checkpoints.as_ref(), chunks.as_ref(), &key).await {
        Ok(named) => named,
        Err(error) => {
            tracing::info!(job_key = %key, %error, chunks = sent.len(), "the job's stored checkpoint could not be read, so the chunks its last save sent are kept (the container's retention rule removes them if nothing names them)");
            return Vec::new();
        }
    };
    let doomed: Vec<String> = unnamed_by_stored(sent, named.as_ref())
        .into_iter()
        .map(|chunk| name_of(&prefix, chunk))
        .collect();
    remove_all(chunks, doomed.clone()).await;
    doomed
}

/// The chunks the manifest stored as `key`'s checkpoint names; `None` if
/// what is stored is not a manifest (no checkpoint, a completed one, or
/// progress of another shape).
async fn stored_index(
    checkpoints: &dyn CheckpointStore,
    chunks: &dyn ChunkStore,
    key: &str,
) -> Result<Option<crate::files::ChunkIndex>, StorageError> {
    let Some(StoredCheckpoint {
        checkpoint: Checkpoint::InProgress { progress },
        ..
    }) = checkpoints.read(key).await?
    else {
        return Ok(None);
    };
    match Manifest::from_progress(&progress) {
        None => Ok(None),
        Some(manifest) => Ok(Some(super::files::index_of(chunks, &manifest?).await?)),
    }
}

/// Deletes `names`, a few at a time; returns how many failed.
pub(crate) async fn remove_all(store: Arc<dyn ChunkStore>, names: Vec<String>) -> usize {
    use futures_util::StreamExt as _;
    let total = names.len();
    let failed = futures_util::stream::iter(names)
        .map(|name| {
            let store = Arc::clone(&store);
            async move { store.delete(&name).await.err() }
        })
        .buffer_unordered(REMOVALS_AT_ONCE)
        .filter_map(|error| async move { error })
        .fold(0usize, |failed, error| async move {
            if failed == 0 {
                tracing::warn!(%error, "a checkpoint chunk no manifest names could not be deleted; the container's retention rule removes it");
            }
            failed + 1
        })
        .await;
    tracing::debug!(total, failed, "checkpoint chunks no manifest names deleted");
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::ChunkIndex;

    #[test]
    fn only_what_the_stored_manifest_does_not_name_may_go() {
        let stored = ChunkIndex::new("p".into(), vec![([1; 16], 1)], vec![([9; 16], 1)]);
        let sent = vec![([1; 16], 1), ([2; 16], 1), ([9; 16], 1), ([1; 16], 2)];
        // (what is stored, what may be deleted)
        let table: [(Option<&ChunkIndex>, Vec<ChunkKey>); 2] = [
            // No manifest stored (none, completed, or other progress).
            (None, sent.clone()),
            // The manifest names a chunk and a page; another save's copy
            // of the same content is another name.
            (Some(&stored), vec![([2; 16], 1), ([1; 16], 2)]),
        ];
        for (named, expected) in table {
            assert_eq!(unnamed_by_stored(sent.clone(), named), expected);
        }
    }
}
