//! What a delivery leaves behind: its checkpoint file saved (while the
//! program runs and once it has ended), and on a clean exit its result
//! stored create-only and the job marked completed.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use spot_worker_storage::{
    Blocking, Checkpoint, HandlerError, JobCheckpoint, PutOutcome, StorageError, permanent,
};

use crate::delivery::Run;
use crate::progress::{ProgressError, read_stable, read_stable_version, to_progress};
use crate::write_time::{Unmeasured, write_duration, written_at};

/// What one look at the checkpoint file did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Save {
    /// Its bytes are saved now.
    Saved,
    /// Nothing to save: no file, or the bytes last saved.
    Unchanged,
    /// Not saved this time (it kept changing while read, the store was
    /// not reachable): the next look tries again.
    Later,
}

impl Run<'_> {
    /// Saves the checkpoint file if it changed since the last save. An
    /// error is a fault of the program's (a file over the size limit), for
    /// which it is stopped; other trouble is only logged (the next look, or
    /// the final save, tries again).
    pub(crate) async fn save_if_changed(
        &mut self,
        checkpoint: &mut JobCheckpoint,
    ) -> Result<Save, String> {
        // The upload runs beside the program: only its writing blocked it.
        self.save_changed(checkpoint, false).await
    }

    /// [`Run::save_if_changed`]; `awaited` if the delivery waits for the
    /// upload (the program has ended).
    async fn save_changed(
        &mut self,
        checkpoint: &mut JobCheckpoint,
        awaited: bool,
    ) -> Result<Save, String> {
        let path = self.dir.checkpoint();
        let limit = self.handler.config.checkpoint_max_bytes;
        let read = tokio::task::spawn_blocking(move || read_stable_version(&path, limit)).await;
        // Both clocks at once, to put the version's modification time on
        // the monotonic one.
        let (wall_now, now) = (std::time::SystemTime::now(), tokio::time::Instant::now());
        let (bytes, meta) = match read {
            Ok(Ok(Some(read))) => read,
            Ok(Ok(None)) => return Ok(Save::Unchanged),
            Ok(Err(error @ ProgressError::TooBig { .. })) => return Err(error.to_string()),
            Ok(Err(error)) => {
                tracing::warn!(job_key = %self.key, %error, "the checkpoint file was not saved this time");
                return Ok(Save::Later);
            }
            Err(error) => {
                tracing::warn!(job_key = %self.key, %error, "reading the checkpoint file failed");
                return Ok(Save::Later);
            }
        };
        if self.last_saved.as_deref() == Some(bytes.as_slice()) {
            return Ok(Save::Unchanged);
        }
        let version = FileVersion::of(&meta);
        let blocking = self.blocking(&meta, version, awaited);
        let progress = Checkpoint::InProgress {
            progress: to_progress(&bytes),
        };
        let saved = match self.written_at(&meta, wall_now, now) {
            Some(written_at) => {
                checkpoint
                    .save_written(progress, blocking, written_at)
                    .await
            }
            None => checkpoint.save_blocking(progress, blocking).await,
        };
        match saved {
            Ok(()) => {
                tracing::debug!(job_key = %self.key, bytes = bytes.len(), written_in = ?blocking.written_before, "checkpoint file saved");
                self.last_saved = Some(bytes);
                self.saved_file = Some(version);
                Ok(Save::Saved)
            }
            // Released or lost: the next holder resumes from the last save.
            Err(StorageError::JobCancelled { .. }) => Ok(Save::Unchanged),
            Err(error @ StorageError::Conflict { .. }) => Err(format!(
                "saving its checkpoint file lost to another holder of the job: {error}"
            )),
            Err(error) => {
                tracing::warn!(job_key = %self.key, %error, "the checkpoint file could not be saved; trying again later");
                Ok(Save::Later)
            }
        }
    }

    /// The last save, once the program is gone; the program's fault (a
    /// file over the size limit) if the file could not be saved for it,
    /// which the delivery's outcome then carries.
    pub(crate) async fn save_final(&mut self, checkpoint: &mut JobCheckpoint) -> Option<String> {
        let fault = self.save_changed(checkpoint, true).await.err()?;
        tracing::error!(job_key = %self.key, error = %fault, "the last checkpoint file was not saved");
        Some(fault)
    }

    /// What saving the version of the checkpoint file `meta` describes
    /// blocks: the program's writing of it, measured from the file
    /// ([`write_duration`]), and the upload if `awaited`. A write that
    /// cannot be measured makes the upload's own time the cost, as if the
    /// program had waited for it (what was measured before writes were),
    /// said once per runner in the log.
    fn blocking(&self, meta: &std::fs::Metadata, version: FileVersion, awaited: bool) -> Blocking {
        let ran_for = self
            .program_started
            .map(|started| started.elapsed())
            .unwrap_or_default();
        // Linux always gives a modification time; without one there would
        // be nothing to measure from, as without a birth time.
        let written = meta
            .modified()
            .map_err(|_| Unmeasured::NoBirthTime)
            .and_then(|modified| {
                write_duration(
                    meta.created().ok(),
                    modified,
                    self.saved_file == Some(version),
                    ran_for,
                )
            });
        match written {
            Ok(written_before) => Blocking {
                written_before,
                awaited,
            },
            Err(why) => {
                unmeasured_once(why);
                Blocking::CALL
            }
        }
    }

    /// When the version `meta` describes was written, on the monotonic
    /// clock (`wall_now` and `now` read together as it was read): its
    /// modification time ([`written_at`]); what saving it keeps of the
    /// program's work. A version that is new since the stop signal was
    /// written after it, whatever its modification time says: a file
    /// system stamps times from a clock that ticks only every few
    /// milliseconds, and a program that saves on the signal may well do
    /// so within the tick. `None` for a time the clock cannot tell: the
    /// save then keeps the work up to its call.
    fn written_at(
        &self,
        meta: &std::fs::Metadata,
        wall_now: std::time::SystemTime,
        now: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        let mapped = written_at(meta.modified().ok()?, wall_now, now)?;
        Some(match &self.stopped {
            Some(stopped) if stopped.version != Some(FileStamp::of(meta)) => mapped.max(stopped.at),
            _ => mapped,
        })
    }

    /// On a clean exit the file is not saved (the job is marked completed
    /// instead), but the limit holds all the same: a file over it is the
    /// program's fault, as at every other save.
    pub(crate) async fn check_final_size(&self) -> Result<(), String> {
        let path = self.dir.checkpoint();
        let limit = self.handler.config.checkpoint_max_bytes;
        let size =
            tokio::task::spawn_blocking(move || std::fs::metadata(path).map(|m| m.len())).await;
        match size {
            Ok(Ok(size)) if size > limit => Err(ProgressError::TooBig { size, limit }.to_string()),
            _ => Ok(()),
        }
    }

    /// A clean exit: store the result file create-only, then mark the job
    /// completed.
    pub(crate) async fn finish(
        &mut self,
        checkpoint: &mut JobCheckpoint,
        message_id: &str,
        keyed_by_body: bool,
    ) -> Result<(), HandlerError> {
        let key = self.key.clone();
        let config = &self.handler.config;
        let path = self.dir.result();
        let read = tokio::task::spawn_blocking(move || read_stable(&path, u64::MAX))
            .await
            .map_err(|e| format!("job {key}: reading the result file: {e}"))?
            .map_err(|e| format!("job {key}: {e}"))?;
        let name = match read {
            Some(bytes) => {
                let name = config.result_name_for(&key, message_id);
                self.put_result(&name, &bytes).await?;
                Some(name)
            }
            None => None,
        };
        // A job keyed by its body is marked completed so duplicates are
        // deleted unrun; one keyed by its message id only if it saved
        // progress (its message is deleted next, nothing else can ask).
        if keyed_by_body || checkpoint.latest().is_some() {
            match checkpoint.complete(json!({ "result": name })).await {
                Ok(()) | Err(StorageError::JobCancelled { .. }) => {}
                Err(error) => {
                    return Err(format!("job {key}: marking it completed: {error}").into());
                }
            }
        }
        tracing::info!(job_key = %key, result = name.as_deref().unwrap_or("(none)"), "job completed");
        Ok(())
    }

    /// Stores the result create-only; the same bytes already there are
    /// success, other bytes a permanent failure.
    async fn put_result(&self, name: &str, bytes: &[u8]) -> Result<(), HandlerError> {
        let key = &self.key;
        let results = &self.handler.results;
        match results.put_new(name, bytes).await {
            Ok(PutOutcome::Created) => Ok(()),
            Ok(PutOutcome::AlreadyExistsIdentical) => {
                tracing::info!(job_key = %key, result = %name, "the identical result already existed");
                Ok(())
            }
            Err(StorageError::Conflict { .. }) => Err(permanent(format!(
                "job {key}: a different result is already stored as {name} in {}; \
                 send the job under a new key",
                results.name()
            ))),
            Err(error) => Err(format!("job {key}: writing the result {name}: {error}").into()),
        }
    }
}

/// A version of the checkpoint file: its device, inode and birth time, so
/// that a new file renamed over the old one (the contract) is told from
/// the old one written again in place, even when the file system reuses
/// the inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileVersion {
    dev: u64,
    ino: u64,
    born: Option<std::time::SystemTime>,
}

impl FileVersion {
    /// The version `meta` describes.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            born: meta.created().ok(),
        }
    }
}

/// Says once per runner and reason why a program's checkpoint writes are
/// not measured: the cost the interval and the ledger use is then the
/// upload's time.
fn unmeasured_once(why: Unmeasured) {
    static SAID: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];
    let slot = match why {
        Unmeasured::NoBirthTime => 0,
        Unmeasured::RewrittenInPlace => 1,
        Unmeasured::TimesOutOfOrder => 2,
        Unmeasured::LongerThanTheRun => 3,
    };
    if !SAID[slot].swap(true, Ordering::Relaxed) {
        tracing::warn!(reason = %why, "how long the program takes to write its checkpoint file is not measured; the upload's time stands for it (docs/checkpoint-interval.md)");
    }
}

/// What identifies a version of a file without reading it: its device,
/// inode, birth, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileStamp {
    version: FileVersion,
    len: u64,
    modified: (i64, i64),
}

impl FileStamp {
    /// The stamp of the version `meta` describes.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            version: FileVersion::of(meta),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The stamp of the file at `path`; `None` if there is none.
pub(crate) fn file_stamp(path: &std::path::Path) -> Option<FileStamp> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| FileStamp::of(&meta))
}
