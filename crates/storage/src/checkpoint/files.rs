//! [`JobCheckpoint`]'s files: checkpoints of any size, saved as chunks
//! named by a manifest that is the job's checkpoint document (see
//! [`crate::files`]), so the fence, the resume and the goodput stamp work
//! for them as for any checkpoint.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Blocking, Checkpoint, JobCheckpoint};
use crate::error::StorageError;
use crate::files::manifest::{ChunkKey, Content, Files, Manifest, job_prefix, name_of};
use crate::files::{
    CheckpointFiles, ChunkIndex, ChunkStore, Restored, SaveFilesError, SaveStats, Staged, Stager,
    TransferLimits, restore,
};

/// A handle's files: the chunks its job's latest manifest names (read on
/// first use), and what its saves sent that no written manifest names yet.
#[derive(Debug, Default)]
pub(crate) struct FilesState {
    pub(crate) limits: TransferLimits,
    index: Option<Arc<ChunkIndex>>,
    unnamed: Vec<ChunkKey>,
}

/// What [`JobCheckpoint::commit_files`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// The manifest was written: the files are saved.
    Saved(SaveStats),
    /// The files are those the job's checkpoint names already: nothing
    /// was written.
    Unchanged,
}

impl JobCheckpoint {
    /// Saves and restores files with `limits` transfers and bytes in
    /// flight (default [`TransferLimits::DEFAULT`]).
    pub fn with_transfer_limits(mut self, limits: TransferLimits) -> Self {
        self.files.limits = limits;
        self
    }

    /// Restores the files the job's checkpoint names under `roots` (each
    /// file under the root of its name; directories made as needed, links
    /// never followed), streamed and checked chunk by chunk. `None` if the
    /// checkpoint names no files (there is none, or it is not a manifest).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use std::sync::Arc;
    /// use spot_worker_storage::files::CheckpointFiles;
    /// use spot_worker_storage::{InMemoryCheckpointStore, JobCheckpoint};
    ///
    /// let store = Arc::new(InMemoryCheckpointStore::new());
    /// let (before, after) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    /// std::fs::create_dir(before.path().join("layers")).unwrap();
    /// let weights: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    /// std::fs::write(before.path().join("layers/0.bin"), &weights).unwrap();
    /// std::fs::write(before.path().join("step"), b"42").unwrap();
    ///
    /// let mut job = JobCheckpoint::load(store.clone(), "train-7").await.unwrap();
    /// let saved = job.save_files(&CheckpointFiles::dir(before.path())).await.unwrap();
    /// assert_eq!(saved.bytes, 3_000_002);
    ///
    /// // Another delivery resumes from it.
    /// let mut resumed = JobCheckpoint::load(store, "train-7").await.unwrap();
    /// let restored = resumed.restore_files(&CheckpointFiles::dir(after.path())).await.unwrap();
    /// assert_eq!(restored.unwrap().files, 2);
    /// assert_eq!(std::fs::read(after.path().join("layers/0.bin")).unwrap(), weights);
    /// // Unchanged files are not sent again.
    /// let again = resumed.save_files(&CheckpointFiles::dir(after.path())).await.unwrap();
    /// assert_eq!(again.sent_bytes, 0);
    /// # });
    /// ```
    pub async fn restore_files(
        &mut self,
        roots: &CheckpointFiles,
    ) -> Result<Option<Restored>, StorageError> {
        roots.check_names()?;
        let Some(manifest) = self.manifest()? else {
            return Ok(None);
        };
        let store = self.chunk_store()?;
        let (restored, index) = restore(store, &manifest, roots, self.files.limits).await?;
        self.files.index = Some(Arc::new(index));
        self.tell_leftover();
        Ok(Some(restored))
    }

    /// Saves the files under `roots` as the job's checkpoint: stages them
    /// ([`JobCheckpoint::stage_files`]) and commits the manifest
    /// ([`JobCheckpoint::commit_files`]), the whole call counted as the
    /// save's cost. Unchanged files cost no upload; files the same as
    /// saved last, no write at all.
    pub async fn save_files(
        &mut self,
        roots: &CheckpointFiles,
    ) -> Result<SaveStats, SaveFilesError> {
        let started = Instant::now();
        let staged = self.stage_files(roots, u64::MAX).await?;
        let stats = staged.stats;
        let blocking = Blocking {
            written_before: started.elapsed(),
            awaited: true,
        };
        match self.commit_files(staged, blocking, None).await? {
            Committed::Saved(stats) => Ok(stats),
            Committed::Unchanged => Ok(stats),
        }
    }

    /// Sends the chunks of the files under `roots` (at most `limit` bytes
    /// of them) that the job's checkpoint does not name already, and
    /// returns the manifest naming them all, not yet written. Nothing
    /// waits on it but the caller: `spot-worker run` stages beside its
    /// program and commits when done. Dropping the future abandons the
    /// save; what it sent is deleted after a later commit.
    pub async fn stage_files(
        &mut self,
        roots: &CheckpointFiles,
        limit: u64,
    ) -> Result<Staged, SaveFilesError> {
        roots.check_names()?;
        let store = self.chunk_store()?;
        self.load_index(&store).await?;
        let empty = ChunkIndex::default();
        let FilesState {
            limits,
            index,
            unnamed,
        } = &mut self.files;
        let staged = Stager {
            store,
            prefix: job_prefix(&self.key),
            generation: rand::random(),
            known: index.as_deref().unwrap_or(&empty),
            limits: *limits,
            sent: unnamed,
        }
        .stage(roots, limit)
        .await;
        self.tell_leftover();
        staged
    }

    /// Writes the manifest of `staged` as the job's checkpoint, fenced like
    /// every save ([`JobCheckpoint::save_blocking`], `blocking` saying what
    /// it blocked); then deletes, beside, the chunks only the manifest it
    /// replaces named. Unchanged if the job's checkpoint is that manifest
    /// already.
    ///
    /// `written_at`, if known, is when the files' data was written, on
    /// this machine's monotonic clock: the save keeps the job's work up to
    /// then, however long the chunks took to send
    /// ([`JobCheckpoint::save_written`]); `None` keeps it up to this call.
    pub async fn commit_files(
        &mut self,
        staged: Staged,
        blocking: Blocking,
        written_at: Option<Instant>,
    ) -> Result<Committed, StorageError> {
        let progress = staged.manifest.to_progress();
        if self.progress() == Some(&progress) {
            return Ok(Committed::Unchanged);
        }
        let sent = (staged.stats.sent_blobs as u64, staged.stats.sent_bytes);
        let saved = self
            .save_measured(
                Checkpoint::InProgress { progress },
                blocking,
                sent,
                written_at,
            )
            .await;
        match saved {
            Ok(()) => {
                let new = Arc::new(staged.index);
                let mut doomed: Vec<String> = self
                    .files
                    .index
                    .as_ref()
                    .map(|old| old.dropped_by(&new))
                    .unwrap_or_default();
                doomed.extend(
                    std::mem::take(&mut self.files.unnamed)
                        .into_iter()
                        .filter(|key| !new.names_key(key))
                        .map(|key| name_of(&new.prefix, key)),
                );
                self.files.index = Some(new);
                self.tell_leftover();
                if let Ok(store) = self.chunk_store() {
                    spawn_removal(store, doomed);
                }
                Ok(Committed::Saved(staged.stats))
            }
            Err(error) => {
                // Another holder won, or the delivery is over: nothing names
                // what this save sent (a transient failure may have landed,
                // so what it sent stays until a later commit decides).
                if matches!(
                    error,
                    StorageError::Conflict { .. } | StorageError::JobCancelled { .. }
                ) && let Ok(store) = self.chunk_store()
                {
                    let prefix = job_prefix(&self.key);
                    let sent = std::mem::take(&mut self.files.unnamed);
                    spawn_removal(
                        store,
                        sent.into_iter().map(|key| name_of(&prefix, key)).collect(),
                    );
                    self.tell_leftover();
                }
                Err(error)
            }
        }
    }

    /// The manifest in the job's checkpoint, if it holds one.
    pub fn manifest(&self) -> Result<Option<Manifest>, StorageError> {
        self.progress()
            .and_then(Manifest::from_progress)
            .transpose()
    }

    /// Deletes, beside, every chunk this handle knows its job's files use:
    /// the job is done with them (its checkpoint was marked completed).
    pub(crate) fn remove_files(&mut self) {
        let Ok(store) = self.chunk_store() else {
            return;
        };
        let prefix = job_prefix(&self.key);
        let mut doomed: Vec<String> = self
            .files
            .index
            .take()
            .map(|index| index.names().collect())
            .unwrap_or_default();
        doomed.extend(
            std::mem::take(&mut self.files.unnamed)
                .into_iter()
                .map(|key| name_of(&prefix, key)),
        );
        self.tell_leftover();
        spawn_removal(store, doomed);
    }

    fn chunk_store(&self) -> Result<Arc<dyn ChunkStore>, StorageError> {
        self.store.chunks().ok_or_else(|| {
            StorageError::InvalidArgument(
                "this checkpoint store keeps no files (CheckpointStore::chunks)".to_owned(),
            )
        })
    }

    /// Reads the chunks the job's manifest names, if not known yet.
    async fn load_index(&mut self, store: &Arc<dyn ChunkStore>) -> Result<(), StorageError> {
        if self.files.index.is_some() {
            return Ok(());
        }
        let Some(manifest) = self.manifest()? else {
            return Ok(());
        };
        let index = index_of(store.as_ref(), &manifest).await?;
        self.files.index = Some(Arc::new(index));
        self.tell_leftover();
        Ok(())
    }

    /// Tells the delivery what this handle's files use, for the consumer
    /// to remove once the job has succeeded.
    fn tell_leftover(&self) {
        if let Some(leftover) = &self.leftover
            && let Ok(store) = self.chunk_store()
        {
            let prefix = job_prefix(&self.key);
            leftover.files(
                store,
                self.files.index.clone(),
                self.files
                    .unnamed
                    .iter()
                    .map(|key| name_of(&prefix, *key))
                    .collect(),
            );
        }
    }
}

/// The chunks a manifest names (its pages read, not its chunks).
async fn index_of(store: &dyn ChunkStore, manifest: &Manifest) -> Result<ChunkIndex, StorageError> {
    let prefix = &manifest.prefix;
    let mut blobs = Vec::new();
    let entries = match &manifest.files {
        Files::Listed(entries) => entries.clone(),
        Files::Table(table) => {
            blobs.push(table.key());
            crate::files::fetch_table(store, prefix, table).await?
        }
    };
    let mut chunks = Vec::new();
    for entry in &entries {
        match &entry.content {
            Content::Inline(_) => {}
            Content::Chunks(list) => chunks.extend(list.iter().map(|c| c.key())),
            Content::Pages(pages) => {
                for page in pages {
                    blobs.push(page.chunk.key());
                    let listed = crate::files::fetch_page(store, prefix, page).await?;
                    chunks.extend(listed.iter().map(|c| c.key()));
                }
            }
        }
    }
    Ok(ChunkIndex::new(prefix.clone(), chunks, blobs))
}

/// How many deletes of unused chunks run at once.
const REMOVALS_AT_ONCE: usize = 8;

/// Deletes `names` beside whatever the caller does next, a few at a time;
/// a failure is logged and left to the container's retention rule.
pub(crate) fn spawn_removal(store: Arc<dyn ChunkStore>, names: Vec<String>) {
    if names.is_empty() {
        return;
    }
    tokio::spawn(remove_all(store, names));
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
