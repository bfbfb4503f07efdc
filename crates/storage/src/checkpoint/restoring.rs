//! [`JobCheckpoint::restore_files`]: restoring a job's checkpoint files,
//! through a race with another holder's save (the newer manifest restored
//! instead) and with the blobs dated anew if the retention rule could
//! reach them soon (see `freshness`).

use std::sync::Arc;

use super::JobCheckpoint;
use super::freshness::{dated_since, needs_refresh, touch_all};
use crate::error::StorageError;
use crate::files::{CheckpointFiles, ChunkStore, Restored, restore};

/// How many times a restore starts again from a newer manifest, when the
/// job's checkpoint moved on under it, before it leaves the job to the
/// holder that keeps moving it.
const RESTORE_ATTEMPTS: usize = 4;

impl JobCheckpoint {
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
    ///
    /// A restore that races another holder's save (the holder replaced the
    /// manifest and deleted what only the older one named) is not a
    /// failure: the stored checkpoint is read again and, if it moved on,
    /// the newer manifest restored instead (a few times at most; then, or
    /// if what is stored now is no manifest, [`StorageError::Conflict`]:
    /// the other holder has the job, and the consumer waits for it rather
    /// than count a failure).
    pub async fn restore_files(
        &mut self,
        roots: &CheckpointFiles,
    ) -> Result<Option<Restored>, StorageError> {
        roots.check_names()?;
        let restored = self.restore_latest(roots).await;
        if let (Err(error), Some(notes)) = (&restored, &self.notes) {
            notes.note(error);
        }
        restored
    }

    async fn restore_latest(
        &mut self,
        roots: &CheckpointFiles,
    ) -> Result<Option<Restored>, StorageError> {
        let Some(mut manifest) = self.manifest()? else {
            return Ok(None);
        };
        let store = self.chunk_store()?;
        for _ in 0..RESTORE_ATTEMPTS {
            let failed =
                match restore(Arc::clone(&store), &manifest, roots, self.files.limits).await {
                    Ok((restored, index)) => {
                        self.files.index = Some(Arc::new(index));
                        self.files.dated_since = self.progress().and_then(dated_since);
                        self.tell_leftover();
                        self.refresh_restored(&store).await;
                        return Ok(Some(restored));
                    }
                    Err(failed) => failed,
                };
            if !self.moved_on().await? {
                return Err(failed);
            }
            tracing::info!(job_key = %self.key, error = %failed, "the job's checkpoint moved on while it was restored (another holder saved); restoring the newer one");
            manifest = match self.manifest() {
                Ok(Some(newer)) => newer,
                _ => break,
            };
        }
        Err(StorageError::Conflict {
            key: self.key.clone(),
        })
    }

    /// Reads the job's checkpoint again: whether it changed since this
    /// handle read it (then the handle holds the newer one, as if it had
    /// been loaded now, and its next write is fenced by it).
    async fn moved_on(&mut self) -> Result<bool, StorageError> {
        self.requests += 1;
        let stored = self.store.read(&self.key).await?;
        if stored.as_ref().map(|s| &s.etag) == self.etag() {
            return Ok(false);
        }
        if let Some(leftover) = &self.leftover {
            leftover.saw(stored.as_ref().map(|s| &s.checkpoint));
        }
        self.latest = stored.map(|s| (s.checkpoint, s.etag));
        self.files.index = None;
        self.files.dated_since = None;
        Ok(true)
    }

    /// Touches the blobs of the manifest just restored if they may be
    /// near the retention rule's age (see `freshness`): the job resumed
    /// after a wait keeps them. A failure is logged: the next save tries.
    async fn refresh_restored(&mut self, store: &Arc<dyn ChunkStore>) {
        let now = store.now();
        let Some(index) = self.files.index.clone() else {
            return;
        };
        if !needs_refresh(self.files.dated_since, now) {
            return;
        }
        match touch_all(Arc::clone(store), index.names().collect()).await {
            Ok(()) => self.files.dated_since = Some(now),
            Err(error) => {
                tracing::warn!(job_key = %self.key, %error, "the restored checkpoint's chunks could not be dated anew; the next save tries again");
            }
        }
    }
}
