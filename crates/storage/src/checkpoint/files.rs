//! [`JobCheckpoint`]'s files: checkpoints of any size, saved as chunks
//! named by a manifest that is the job's checkpoint document (see
//! [`crate::files`]), so the fence, the resume and the goodput stamp work
//! for them as for any checkpoint.

use std::sync::Arc;

use std::time::SystemTime;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cleanup::{remove_all, remove_unless_stored};
use super::freshness::{dated, dated_since, needs_refresh, older, touch_all};
use super::{Blocking, Checkpoint, JobCheckpoint};
use crate::error::StorageError;
use crate::files::manifest::{ChunkKey, Content, Files, Manifest, job_prefix, name_of};
use crate::files::{
    CheckpointFiles, ChunkIndex, ChunkStore, SaveFilesError, SaveStats, Staged, Stager,
    TransferLimits,
};

/// A handle's files: the chunks its job's latest manifest names (read on
/// first use), and what its saves sent that no written manifest names yet.
#[derive(Debug, Default)]
pub(crate) struct FilesState {
    pub(crate) limits: TransferLimits,
    pub(super) index: Option<Arc<ChunkIndex>>,
    unnamed: Vec<ChunkKey>,
    /// Deletes of unused chunks this handle started, running beside.
    removals: Vec<JoinHandle<()>>,
    /// No blob `index` names was written before this (see `freshness`);
    /// `None`: unknown.
    pub(super) dated_since: Option<SystemTime>,
    /// No blob of `unnamed` was written before this.
    unnamed_since: Option<SystemTime>,
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
        if self.files.unnamed.is_empty() || self.files.unnamed_since.is_none() {
            self.files.unnamed_since = Some(store.now());
        }
        let empty = ChunkIndex::default();
        let FilesState {
            limits,
            index,
            unnamed,
            ..
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
        let since = match self.dated(&staged).await {
            Ok(since) => since,
            Err(error) => {
                if let Some(notes) = &self.notes {
                    notes.note(&error);
                }
                return Err(error);
            }
        };
        let progress = dated(staged.manifest.to_progress(), since);
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
                self.files.dated_since = Some(since);
                self.files.unnamed_since = None;
                self.tell_leftover();
                if let Ok(store) = self.chunk_store() {
                    self.files.removals.extend(spawn_removal(store, doomed));
                }
                Ok(Committed::Saved(staged.stats))
            }
            Err(error) => {
                // Another holder won, or the delivery is over. What this
                // handle sent may be named all the same: a write of ours
                // whose answer was lost may have landed, and another holder
                // may have read it since. Only what the stored checkpoint
                // does not name goes (see `cleanup`); after a transient
                // failure it all stays until a later commit decides.
                if matches!(
                    error,
                    StorageError::Conflict { .. } | StorageError::JobCancelled { .. }
                ) && let Ok(chunks) = self.chunk_store()
                {
                    let sent = std::mem::take(&mut self.files.unnamed);
                    self.files.unnamed_since = None;
                    self.tell_leftover();
                    let removal = remove_unless_stored(
                        Arc::clone(&self.store),
                        chunks,
                        self.key.clone(),
                        job_prefix(&self.key),
                        sent,
                    );
                    self.files.removals.push(tokio::spawn(async move {
                        removal.await;
                    }));
                }
                Err(error)
            }
        }
    }

    /// The date the manifest of `staged` gives its blobs: the oldest
    /// write among them, known from the manifest it builds on and the
    /// saves since; touched first if that is too old (see `freshness`).
    async fn dated(&mut self, staged: &Staged) -> Result<SystemTime, StorageError> {
        let store = self.chunk_store()?;
        let now = store.now();
        let reused = match self.files.index {
            Some(_) => self.files.dated_since,
            None => Some(now),
        };
        if let Some(since) = older(reused, Some(self.files.unnamed_since.unwrap_or(now)))
            && !needs_refresh(Some(since), now)
        {
            return Ok(since);
        }
        touch_all(store, staged.index.names().collect()).await?;
        Ok(now)
    }

    /// Waits for the deletes of unused chunks this handle started (they
    /// run beside its saves): for a test, or a process about to exit.
    pub async fn removals_done(&mut self) {
        for removal in std::mem::take(&mut self.files.removals) {
            // A delete that panicked deleted less: nothing to undo.
            let _ = removal.await;
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
        self.files.removals.extend(spawn_removal(store, doomed));
    }

    pub(super) fn chunk_store(&self) -> Result<Arc<dyn ChunkStore>, StorageError> {
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
        self.files.dated_since = self.progress().and_then(dated_since);
        self.tell_leftover();
        Ok(())
    }

    /// Tells the delivery what this handle's files use, for the consumer
    /// to remove once the job has succeeded.
    pub(super) fn tell_leftover(&self) {
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
pub(super) async fn index_of(
    store: &dyn ChunkStore,
    manifest: &Manifest,
) -> Result<ChunkIndex, StorageError> {
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

/// Deletes `names` beside whatever the caller does next, a few at a time;
/// a failure is logged and left to the container's retention rule.
pub fn spawn_removal(store: Arc<dyn ChunkStore>, names: Vec<String>) -> Option<JoinHandle<()>> {
    if names.is_empty() {
        return None;
    }
    Some(tokio::spawn(async move {
        remove_all(store, names).await;
    }))
}
