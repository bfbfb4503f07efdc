//! What a delivery leaves behind: its checkpoint (the file and the
//! directory) saved while the program runs and once it has ended, and on a
//! clean exit its result stored create-only and the job marked completed.
//!
//! A save runs on a task of its own beside the delivery's loop
//! ([`SaveTask`]): the loop only starts it and looks at its end, so a slow
//! or stalled store never holds up the stop signal, a timeout or a kill.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{HandlerError, permanent};
use spot_worker_storage::files::{CheckpointFiles, SaveFilesError, SaveStats};
use spot_worker_storage::{
    Blocking, CancellationToken, Committed, JobCheckpoint, PutOutcome, StorageError,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::delivery::Run;
use crate::settle::{AtMarker, MarkerStamp, at_marker, database_copy_changed};
use crate::store_refusal::{AfterStoreError, after_store_error};
use crate::trouble::kind_of;
use crate::version_files::{Roots, SavedFiles};
use crate::write_time::{Unmeasured, version_modified, written_at};
use spot_worker_storage::SaveTroubleKind;

/// What one save did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Save {
    /// The files are saved now.
    Saved,
    /// Nothing to save: no files, or the files saved last.
    Unchanged,
    /// Not saved this time (the store was not reachable): the next look
    /// tries again.
    Later,
    /// Not one state of the program yet (the directory changed while it
    /// was read, or was written since its commit marker): tried again
    /// promptly (`settle.rs`).
    Unsettled,
}

/// The end of a save task: its checkpoint handle back, and what it did
/// (or the program's fault: a checkpoint over the size limit, a save lost
/// to another holder of the job).
pub(crate) struct SaveEnd {
    pub(crate) checkpoint: JobCheckpoint,
    pub(crate) outcome: Result<Done, String>,
    /// What the look before the save found (the save's version, unless
    /// it changed while read: then the save ends [`Save::Later`]).
    pub(crate) fingerprint: Option<[u8; 32]>,
}

/// What a finished save reports.
pub(crate) struct Done {
    pub(crate) save: Save,
    /// The checkpoint file's version saved, if any.
    pub(crate) file: Option<FileVersion>,
    /// The commit marker saved with the version, if any.
    pub(crate) marker: Option<MarkerStamp>,
    /// The files of the version saved, if any.
    pub(crate) files: Option<SavedFiles>,
    /// What was passed over (a FIFO at the checkpoint path), with why.
    pub(crate) skipped: Vec<String>,
    pub(crate) stats: SaveStats,
    /// Why a [`Save::Later`] was not saved, for `status`
    /// ([`crate::trouble`]): the kind and the error, secrets removed.
    pub(crate) trouble: Option<(spot_worker_storage::SaveTroubleKind, String)>,
}

/// A save running beside the delivery's loop.
pub(crate) struct SaveTask {
    pub(crate) handle: JoinHandle<SaveEnd>,
    abandon: CancellationToken,
    /// What the checkpoint looked like when the save started.
    pub(crate) fingerprint: Option<[u8; 32]>,
}

impl SaveTask {
    /// Stops the save (the upload in flight is dropped; what it sent is
    /// deleted after a later save) and returns its end.
    pub(crate) async fn abandon(self) -> Option<SaveEnd> {
        self.abandon.cancel();
        self.handle.await.ok()
    }
}

/// What a save needs from its delivery, copied into its task.
struct SaveContext {
    roots: CheckpointFiles,
    /// The runner's own directory, for the copies of live databases
    /// ([`crate::sqlite_version`]).
    scratch: std::path::PathBuf,
    limit: u64,
    saved_file: Option<FileVersion>,
    /// The files of the version saved last in this delivery.
    saved_files: SavedFiles,
    /// Where the checkpoint's files are on disk.
    paths: Roots,
    ran_for: Duration,
    awaited: bool,
    /// When the stop signal was sent, if the checkpoint has changed since:
    /// what this save reads was written after it.
    written_after: Option<Instant>,
    /// When the program was sent its stop signal, if it was: a version
    /// whose files were written after it is new since the stop too, even
    /// when the look beside the signal already found it.
    stopped_at: Option<Instant>,
    /// The commit marker, if the program has one.
    marker: Option<Marker>,
}

/// The checkpoint directory's commit marker, as a save weighs it.
#[derive(Clone)]
struct Marker {
    /// Its path in the checkpoint's manifest (`dir/...`).
    listed: String,
    /// Its path on disk.
    path: std::path::PathBuf,
    /// The marker saved (or restored) last.
    saved: Option<MarkerStamp>,
}

impl Run<'_> {
    /// The checkpoint's roots: `SPOT_WORKER_CHECKPOINT` and
    /// `SPOT_WORKER_CHECKPOINT_DIR`.
    pub(crate) fn roots(&self) -> CheckpointFiles {
        CheckpointFiles::default()
            .with_file("file", self.dir.checkpoint())
            .with_dir("dir", self.dir.checkpoint_dir())
    }

    /// Starts saving the checkpoint beside the loop (`awaited`: the
    /// delivery waits for it, the program has ended), `fingerprint` what a
    /// look just found there ([`crate::look`]: never walked here, on the
    /// runtime thread). Nothing if a save runs already, or the handle is
    /// gone.
    pub(crate) fn start_save(&mut self, awaited: bool, fingerprint: Option<[u8; 32]>) {
        if self.saving.is_some() {
            return;
        }
        let Some(checkpoint) = self.checkpoint.take() else {
            return;
        };
        // The save stamps the program's progress now (`progress_at_save`).
        if let Some(done) = crate::pace::progress_at_save(&self.dir.progress()) {
            self.job.report_progress_file_at_save(done);
        }
        let roots = self.roots();
        // A stop look not ended yet cannot say the version is new.
        let written_after = self
            .stopped
            .as_ref()
            .filter(|stopped| stopped.look.found().is_some_and(|then| then != fingerprint))
            .map(|stopped| stopped.at);
        let context = SaveContext {
            roots,
            scratch: self.dir.runners().to_path_buf(),
            limit: self.handler.config.checkpoint_max_bytes,
            saved_file: self.saved_file,
            saved_files: self.saved_files.clone(),
            paths: Roots {
                file: self.dir.checkpoint(),
                dir: self.dir.checkpoint_dir(),
            },
            ran_for: self
                .program_started
                .map(|started| started.elapsed())
                .unwrap_or_default(),
            awaited,
            written_after,
            stopped_at: self.stopped.as_ref().map(|stopped| stopped.at),
            marker: self
                .handler
                .config
                .checkpoint_marker
                .as_ref()
                .map(|marker| Marker {
                    listed: format!("dir/{marker}"),
                    path: self.dir.checkpoint_dir().join(marker),
                    saved: self.saved_marker,
                }),
        };
        tracing::debug!(job_key = %self.key, awaited, "saving the checkpoint beside the program");
        let abandon = CancellationToken::new();
        let key = self.key.clone();
        let stop = abandon.clone();
        let handle = tokio::spawn(async move {
            let mut checkpoint = checkpoint;
            let outcome = tokio::select! {
                outcome = save_once(&mut checkpoint, &context, &key) => outcome,
                () = stop.cancelled() => Ok(Done {
                    save: Save::Later,
                    file: None,
                    marker: None,
                    files: None,
                    skipped: Vec::new(),
                    stats: SaveStats::default(),
                    trouble: None,
                }),
            };
            SaveEnd {
                checkpoint,
                outcome,
                fingerprint,
            }
        });
        self.saving = Some(SaveTask {
            handle,
            abandon,
            fingerprint,
        });
    }

    /// Takes the end of a save: the handle back, the version saved, the
    /// measured throughput, and one warning per delivery for files passed
    /// over. A task that died takes the handle with it: then no save is
    /// made any more, and the delivery's outcome says why.
    pub(crate) fn save_ended(
        &mut self,
        joined: Result<SaveEnd, tokio::task::JoinError>,
    ) -> Result<Save, String> {
        let end = joined.map_err(|e| format!("the checkpoint's save failed: {e}"))?;
        self.checkpoint = Some(end.checkpoint);
        let done = end.outcome?;
        self.later_trouble = done.trouble.clone();
        if !done.skipped.is_empty() && !std::mem::replace(&mut self.skipped_warned, true) {
            tracing::warn!(job_key = %self.key, skipped = ?done.skipped, "not saved: the checkpoint paths must be regular files (or, under SPOT_WORKER_CHECKPOINT_DIR, directories of them); links, FIFOs and devices are passed over");
        }
        if done.save != Save::Later {
            // What is stored now: a final save of the same is no use.
            self.saved_fingerprint = Some(end.fingerprint);
        }
        if done.save == Save::Saved {
            self.handler.throughput.record(&done.stats);
            self.saved_file = done.file.or(self.saved_file);
            self.saved_marker = done.marker.or(self.saved_marker);
            if let Some(files) = done.files {
                self.saved_files = files;
            }
            self.last_complete = Some(std::time::Instant::now());
        }
        Ok(done.save)
    }

    /// The last save, once the program is gone; the program's fault (a
    /// checkpoint over the size limit) if it could not be saved for it,
    /// which the delivery's outcome then carries.
    ///
    /// A save still running is finished if it is saving what is there now,
    /// within the time left before the release; one saving an older
    /// version is abandoned for this one. This one is planned against the
    /// time left: at the throughput measured so far, a checkpoint that
    /// cannot be saved in time is not started, and the last complete
    /// checkpoint stands; the log says so either way.
    pub(crate) async fn save_final(&mut self) -> Option<String> {
        let until = self.job.deadline().map(|release| {
            release - FINAL_SAVE_SLACK.min(release.saturating_duration_since(Instant::now()))
        });
        if let Some(stopped) = self.stopped.as_mut() {
            stopped.look.fingerprint().await;
        }
        if let Some(task) = self.saving.take() {
            let now = match crate::look::look(self.roots()).await {
                Ok(now) => now,
                Err(error) => match crate::look::programs_fault(&error) {
                    Some(fault) => {
                        if let Some(end) = task.abandon().await {
                            self.checkpoint = Some(end.checkpoint);
                        }
                        return Some(self.final_fault(fault));
                    }
                    None => None,
                },
            };
            if task.fingerprint.is_some() && task.fingerprint == now {
                match self.finish_in_time(task, until).await {
                    Some(Ok(Save::Later | Save::Unsettled)) => {}
                    Some(Ok(_)) => return None,
                    Some(Err(fault)) => return Some(self.final_fault(fault)),
                    None => return None,
                }
            } else if let Some(end) = task.abandon().await {
                tracing::info!(job_key = %self.key, "a save of an older version of the checkpoint was abandoned for the final save");
                self.checkpoint = Some(end.checkpoint);
            }
        }
        if !self.fits(until).await {
            return None;
        }
        // A file that changed while read is read again (the program has
        // ended: it holds still now, unless something else writes it).
        for _ in 0..3 {
            let fingerprint = match crate::look::look(self.roots()).await {
                // Every look skips the version saved last; so does the
                // notice's: reading it again would spend drain time on
                // nothing (and take a renamed file for one rewritten).
                Ok(fingerprint) if is_saved_already(self.saved_fingerprint, fingerprint) => {
                    tracing::debug!(job_key = %self.key, "the checkpoint is the version saved last; nothing left to save");
                    return None;
                }
                Ok(fingerprint) => fingerprint,
                Err(error) => match crate::look::programs_fault(&error) {
                    Some(fault) => return Some(self.final_fault(fault)),
                    None => None,
                },
            };
            self.start_save(true, fingerprint);
            let task = self.saving.take()?;
            match self.finish_in_time(task, until).await {
                Some(Ok(Save::Unsettled)) if self.handler.config.checkpoint_marker.is_some() => {
                    // The program has ended: it will write no new marker.
                    tracing::info!(job_key = %self.key, "the checkpoint directory was written after its commit marker (SPOT_WORKER_CHECKPOINT_MARKER): the version at the last marker saved stands");
                    return None;
                }
                Some(Ok(Save::Later | Save::Unsettled)) => continue,
                Some(Ok(_)) | None => return None,
                Some(Err(fault)) => return Some(self.final_fault(fault)),
            }
        }
        tracing::warn!(job_key = %self.key, "the final save of the checkpoint did not succeed; the last complete checkpoint stands");
        None
    }

    fn final_fault(&self, fault: String) -> String {
        tracing::error!(job_key = %self.key, error = %fault, "the last checkpoint was not saved");
        fault
    }

    /// Waits for `task` until `until`; abandons it then (saying that the
    /// last complete checkpoint stands). `None` if abandoned.
    async fn finish_in_time(
        &mut self,
        task: SaveTask,
        until: Option<Instant>,
    ) -> Option<Result<Save, String>> {
        let SaveTask {
            mut handle,
            abandon,
            ..
        } = task;
        let joined = match until {
            None => (&mut handle).await,
            Some(until) => match tokio::time::timeout_at(until, &mut handle).await {
                Ok(joined) => joined,
                Err(_) => {
                    abandon.cancel();
                    if let Ok(end) = handle.await {
                        self.checkpoint = Some(end.checkpoint);
                    }
                    tracing::warn!(job_key = %self.key, since_last_complete = ?self.last_complete.map(|at| at.elapsed()), "the checkpoint's save did not finish before the release and was abandoned: the last complete checkpoint stands");
                    return None;
                }
            },
        };
        Some(self.save_ended(joined))
    }

    /// Whether a save of the checkpoint as it is now can finish before
    /// `until` at the throughput measured so far; logs why not.
    async fn fits(&self, until: Option<Instant>) -> bool {
        let (Some(until), Some(rate)) = (until, self.handler.throughput.bytes_per_second()) else {
            return true;
        };
        let size = crate::look::size(self.roots()).await.unwrap_or(0);
        let needs = Duration::from_secs_f64(size as f64 / rate);
        let left = until.saturating_duration_since(Instant::now());
        if needs <= left {
            return true;
        }
        tracing::warn!(
            job_key = %self.key,
            bytes = size,
            needs_ms = needs.as_millis() as u64,
            left_ms = left.as_millis() as u64,
            measured_mb_per_s = rate / 1e6,
            since_last_complete = ?self.last_complete.map(|at| at.elapsed()),
            "the final save would not finish before the release at the throughput measured: not started; the last complete checkpoint stands"
        );
        false
    }

    /// On a clean exit the checkpoint is not saved (the job is marked
    /// completed instead), but the limit holds all the same: a checkpoint
    /// over it is the program's fault, as at every other save.
    pub(crate) async fn check_final_size(&self) -> Result<(), String> {
        let limit = self.handler.config.checkpoint_max_bytes;
        match crate::look::size(self.roots()).await {
            Ok(size) if size > limit => Err(SaveFilesError::TooBig { size, limit }.to_string()),
            Err(error) => crate::look::programs_fault(&error).map_or(Ok(()), Err),
            Ok(_) => Ok(()),
        }
    }

    /// A clean exit: store the result file create-only (streamed; a file
    /// over `--result-max-bytes`, or not a regular file, is a counted
    /// failure before anything is read), then mark the job completed.
    pub(crate) async fn finish(
        &mut self,
        message_id: &str,
        keyed_by_body: bool,
    ) -> Result<(), HandlerError> {
        let key = self.key.clone();
        let config = &self.handler.config;
        let path = self.dir.result();
        // The program's to put anything at: never through a link, never
        // blocking on a FIFO, a regular file only.
        let opened = tokio::task::spawn_blocking(move || {
            let file = spot_worker_untrusted::open(&path, &spot_worker_untrusted::Owners::Any)?;
            let meta =
                file.metadata()
                    .map_err(|source| spot_worker_untrusted::UntrustedError::Io {
                        path: spot_worker_untrusted::escape_line(&path.to_string_lossy())
                            .into_owned(),
                        source,
                    })?;
            Ok::<_, spot_worker_untrusted::UntrustedError>((file, meta))
        })
        .await
        .map_err(|e| format!("job {key}: opening the result file: {e}"))?;
        let name = match opened {
            Err(missing) if missing.is_not_found() => None,
            Err(error) => {
                return Err(format!(
                    "job {key}: the program exited 0, but the result file {error}; no result stored"
                )
                .into());
            }
            Ok((file, meta)) => {
                let limit = config.result_max_bytes;
                if meta.len() > limit {
                    return Err(format!(
                        "job {key}: the program exited 0, but the result file is {} bytes, over the limit of {limit} bytes (SPOT_WORKER_RESULT_MAX_BYTES); no result stored",
                        meta.len()
                    )
                    .into());
                }
                let name = config.result_name_for(&key, message_id);
                if self.put_result(&name, file, meta.len()).await? == Stored::ByAnotherRun {
                    return Ok(());
                }
                Some(name)
            }
        };
        let Some(checkpoint) = self.checkpoint.as_mut() else {
            return Err(
                format!("job {key}: its checkpoint handle was lost with a failed save").into(),
            );
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
    /// success. Other bytes there are another run's result if the job's
    /// checkpoint says that run completed the job (two holders of one job
    /// both finished): this run is then a duplicate, settled as done with
    /// the stored result kept; else a permanent failure.
    async fn put_result(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<Stored, HandlerError> {
        let key = &self.key;
        let results = &self.handler.results;
        match results.put_new_file(name, file, len).await {
            Ok(PutOutcome::Created) => Ok(Stored::ByThisRun),
            Ok(PutOutcome::AlreadyExistsIdentical) => {
                tracing::info!(job_key = %key, result = %name, "the identical result already existed");
                Ok(Stored::ByThisRun)
            }
            Err(StorageError::Conflict { .. }) => {
                let completed = match self.checkpoint.as_ref() {
                    Some(checkpoint) => checkpoint.completed_in_store().await.map_err(|error| {
                        format!(
                            "job {key}: a different result is already stored as {name}; \
                             reading the job's checkpoint to see whether another run \
                             completed it failed: {error}"
                        )
                    })?,
                    None => None,
                };
                if completed.is_some() {
                    tracing::info!(job_key = %key, result = %name, "another run of this job completed it and stored its result; this run's result is not kept (a duplicate, not a failure)");
                    return Ok(Stored::ByAnotherRun);
                }
                Err(permanent(format!(
                    "job {key}: a different result is already stored as {name} in {}, and \
                     no run of this job completed it; send the job under a new key",
                    results.name()
                )))
            }
            Err(error) => Err(format!("job {key}: writing the result {name}: {error}").into()),
        }
    }
}

/// Whether a look that found `now` finds the version stored already
/// (`saved`: what the look before the last save, or the restore, found).
/// A look that found nothing matches only a save of nothing; ask only
/// after a look that succeeded (a failed one found no version at all).
fn is_saved_already(saved: Option<Option<[u8; 32]>>, now: Option<[u8; 32]>) -> bool {
    saved == Some(now)
}

/// Whose result a run's `Run::put_result` left stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// This run's (or identical bytes).
    ByThisRun,
    /// Another run's, which completed the job: this run is a duplicate.
    ByAnotherRun,
}

/// The time kept between the end of a final save and the release.
const FINAL_SAVE_SLACK: Duration = Duration::from_millis(100);

/// One save: stage the checkpoint's chunks, then commit its manifest.
async fn save_once(
    checkpoint: &mut JobCheckpoint,
    context: &SaveContext,
    key: &str,
) -> Result<Done, String> {
    let started = std::time::Instant::now();
    let later = |skipped, trouble: Option<(SaveTroubleKind, String)>| Done {
        save: Save::Later,
        file: None,
        marker: None,
        files: None,
        skipped,
        stats: SaveStats::default(),
        // Store errors come with their secrets removed by the backend
        // (`StorageError`'s messages are redacted where they are made).
        trouble,
    };
    let unsettled = Done {
        save: Save::Unsettled,
        ..later(Vec::new(), None)
    };
    let unchanged = Done {
        save: Save::Unchanged,
        ..later(Vec::new(), None)
    };
    // With a commit marker, nothing is read until the program has written
    // a new one.
    if let Some(marker) = &context.marker {
        let now = tokio::fs::symlink_metadata(&marker.path)
            .await
            .ok()
            .map(|meta| MarkerStamp::of(&meta));
        if now.is_none() || now == marker.saved {
            return Ok(unchanged);
        }
    }
    // A live database is read from a consistent copy; the copies go
    // when this save is done with them.
    let (roots, copies) = match consistent_databases(context).await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(job_key = %key, %error, "a SQLite database in the checkpoint directory could not be backed up, so the checkpoint is not saved this time; trying again later");
            return Ok(later(
                Vec::new(),
                Some((SaveTroubleKind::Unreadable, error)),
            ));
        }
    };
    let staged = match checkpoint.stage_files(&roots, context.limit).await {
        Ok(staged) => staged,
        Err(error @ SaveFilesError::TooBig { .. }) => {
            return Err(format!("{error} (SPOT_WORKER_CHECKPOINT_MAX_BYTES)"));
        }
        Err(error @ (SaveFilesError::TooMany { .. } | SaveFilesError::BadPath { .. })) => {
            return Err(error.to_string());
        }
        Err(SaveFilesError::Unstable) => {
            tracing::debug!(job_key = %key, "the checkpoint changed while it was read; read again shortly");
            return Ok(unsettled);
        }
        Err(SaveFilesError::Storage(error)) => {
            if let AfterStoreError::Fail(reason) = after_store_error(&error) {
                return Err(reason);
            }
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            return Ok(later(
                Vec::new(),
                Some((kind_of(&error), error.to_string())),
            ));
        }
        Err(error) => {
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            return Ok(later(
                Vec::new(),
                Some((SaveTroubleKind::Unreadable, error.to_string())),
            ));
        }
    };
    let skipped = staged.skipped().to_vec();
    let marker = match &context.marker {
        None => None,
        Some(marker) => match marker_rule(&staged, marker, &copies.as_of) {
            AtMarker::Take(stamp) => Some(stamp),
            AtMarker::NoMarker | AtMarker::Unchanged => return Ok(unchanged),
            AtMarker::WrittenSince(path) => {
                tracing::debug!(job_key = %key, %path, "the checkpoint directory was written after its commit marker; read again shortly");
                return Ok(unsettled);
            }
        },
    };
    if staged.is_empty() {
        return Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker: None,
            files: None,
            skipped,
            stats: staged.stats,
            trouble: None,
        });
    }
    let file = staged
        .versions()
        .iter()
        .find(|(path, _)| path == "file")
        .map(|(_, meta)| FileVersion::of(meta));
    let files = SavedFiles::of(staged.versions());
    let mut blocking = blocking(&staged, context).await;
    if context.awaited {
        blocking.written_before += started.elapsed();
    }
    // Both clocks at once, to put the version's modification time on the
    // monotonic one.
    let clocks = (std::time::SystemTime::now(), Instant::now());
    let written = version_written_at(&staged, context.written_after, clocks);
    let after_stop = context.written_after.is_some()
        || matches!((written, context.stopped_at), (Some(written), Some(stopped)) if written >= stopped);
    let written_at = crate::kept_until::kept_until(context.awaited, after_stop, written, clocks.1);
    let stats = staged.stats;
    match checkpoint.commit_files(staged, blocking, written_at).await {
        Ok(Committed::Saved(stats)) => {
            tracing::debug!(job_key = %key, bytes = stats.bytes, sent_bytes = stats.sent_bytes, sent_blobs = stats.sent_blobs, took_ms = stats.took.as_millis() as u64, written_in = ?blocking.written_before, "checkpoint saved");
            Ok(Done {
                save: Save::Saved,
                file,
                marker,
                files: Some(files),
                skipped,
                stats,
                trouble: None,
            })
        }
        Ok(Committed::Unchanged) => Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker,
            files: None,
            skipped,
            stats,
            trouble: None,
        }),
        // Released or lost: the next holder resumes from the last save.
        Err(StorageError::JobCancelled { .. }) => Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker: None,
            files: None,
            skipped,
            stats,
            trouble: None,
        }),
        Err(error @ StorageError::Conflict { .. }) => Err(format!(
            "saving its checkpoint lost to another holder of the job: {error}"
        )),
        Err(error) => {
            if let AfterStoreError::Fail(reason) = after_store_error(&error) {
                return Err(reason);
            }
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            Ok(later(skipped, Some((kind_of(&error), error.to_string()))))
        }
    }
}

/// The save's roots, every SQLite database in the checkpoint directory
/// standing in as a consistent copy ([`crate::sqlite_version`]), on the
/// blocking pool.
async fn consistent_databases(
    context: &SaveContext,
) -> Result<(CheckpointFiles, crate::sqlite_version::Copies), String> {
    let (roots, scratch) = (context.roots.clone(), context.scratch.clone());
    tokio::task::spawn_blocking(move || {
        crate::sqlite_version::with_consistent_databases(&roots, &scratch)
    })
    .await
    .map_err(|e| format!("the backup of a SQLite database ended: {e}"))?
    .map_err(|e| e.to_string())
}

/// The marker rule ([`at_marker`]) for the version `staged` read: the
/// directory's files, each with its change time, against the marker read
/// with them. The checkpoint file (`SPOT_WORKER_CHECKPOINT`) is a version
/// of its own (renamed whole) and is not weighed; a live database's copy
/// (one of `databases`) is weighed by when it was made and the last commit
/// it holds ([`database_copy_changed`]), not by its file's times alone.
fn marker_rule(
    staged: &spot_worker_storage::files::Staged,
    marker: &Marker,
    databases: &std::collections::BTreeMap<String, std::time::SystemTime>,
) -> AtMarker {
    let versions = staged.versions();
    let read = versions
        .iter()
        .find(|(path, _)| *path == marker.listed)
        .map(|(_, meta)| MarkerStamp::of(meta));
    let others = versions
        .iter()
        .filter(|(path, _)| *path != marker.listed && path != "file")
        .map(|(path, meta)| {
            let changed = match (read, databases.get(path)) {
                (Some(marker), Some(as_of)) => {
                    database_copy_changed(meta, Some(*as_of), marker.changed())
                }
                _ => crate::settle::changed(meta),
            };
            (path.as_str(), changed)
        });
    at_marker(read, marker.saved, others)
}

/// What saving the version `staged` read blocks: what writing it cost the
/// program ([`save_cost`](crate::save_cost::save_cost): the span of the
/// files it wrote whole, never the age of a file written in place), and
/// the upload if awaited. A write that cannot be measured makes the
/// upload's own time the cost, as if the program had waited for it, said
/// once per runner in the log.
async fn blocking(staged: &spot_worker_storage::files::Staged, context: &SaveContext) -> Blocking {
    let versions = staged.versions().to_vec();
    let saved = context.saved_files.clone();
    let roots = context.paths.clone();
    let saved_file = context.saved_file;
    // Reads the first bytes of new files (is it a database?): off the
    // runtime's threads.
    let files = tokio::task::spawn_blocking(move || {
        let mut files = crate::version_files::version_files(&versions, &saved, &roots);
        // The file restored at the delivery's start counts as saved.
        for ((path, meta), file) in versions.iter().zip(files.iter_mut()) {
            file.saved_before |= path == "file" && saved_file == Some(FileVersion::of(meta));
        }
        files
    })
    .await;
    let program_started = std::time::SystemTime::now()
        .checked_sub(context.ran_for)
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    // The runner holds none of the program's writes (yet): nothing to add.
    let held = Duration::ZERO;
    let Ok(files) = files else {
        // The runtime is shutting down: the upload stands for the write.
        return Blocking::CALL;
    };
    match crate::save_cost::save_cost(&files, program_started, held) {
        Ok(written_before) => Blocking {
            written_before,
            awaited: context.awaited,
        },
        Err(why) => {
            unmeasured_once(why);
            Blocking::CALL
        }
    }
}

/// When the version `staged` read was written, on the monotonic clock
/// (`clocks`: the wall clock and the monotonic one, read together): what
/// saving it keeps of the program's work ([`written_at`]), however it is
/// uploaded, in chunks or whole. The checkpoint file's modification time
/// if there is one (the contract's version: the program renames it over
/// the path once its state is complete). A checkpoint directory alone has
/// no such mark of a complete version (the program writes its files one
/// by one, and nothing says which was last), so its newest modification
/// time among the files read stands for it: nothing in the version is
/// younger.
///
/// A version new since the stop signal (`written_after`) was written
/// after it, whatever its modification time says: a file system stamps
/// times from a clock that ticks only every few milliseconds, and a
/// program that saves on the signal may well do so within the tick.
/// `None` for a time the clock cannot tell: the save then keeps the work
/// up to its call.
fn version_written_at(
    staged: &spot_worker_storage::files::Staged,
    written_after: Option<Instant>,
    (wall_now, now): (std::time::SystemTime, Instant),
) -> Option<Instant> {
    let modified = version_modified(
        staged
            .versions()
            .iter()
            .map(|(path, meta)| (path.as_str(), meta.modified().ok())),
    )?;
    let mapped = written_at(modified, wall_now, now)?;
    Some(written_after.map_or(mapped, |after| mapped.max(after)))
}

/// A version of the checkpoint file: its device, inode and birth time, so
/// that a new file renamed over the old one (the contract) is told from
/// the old one written again in place, even when the file system reuses
/// the inode number. Kept per save with the modification time it had, for
/// what a save protects (the goodput ledger).
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
    static SAID: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let slot = match why {
        Unmeasured::NoBirthTime => 0,
        Unmeasured::TimesOutOfOrder => 1,
    };
    if !SAID[slot].swap(true, Ordering::Relaxed) {
        tracing::warn!(reason = %why, "how long the program takes to write its checkpoint file is not measured; the upload's time stands for it (docs/checkpoint-interval.md)");
    }
}

/// The throughput of the worker's checkpoint saves (bytes of checkpoint
/// read and saved per second, unchanged chunks included), for planning a
/// final save against the time left.
#[derive(Debug, Default)]
pub(crate) struct Throughput(std::sync::Mutex<Option<f64>>);

impl Throughput {
    /// Takes in a save of `stats`: the latest measurement weighs half.
    fn record(&self, stats: &SaveStats) {
        let seconds = stats.took.as_secs_f64();
        // Small saves say little about a large one.
        if stats.bytes < 16 * 1024 * 1024 || seconds <= 0.0 {
            return;
        }
        let rate = stats.bytes as f64 / seconds;
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *kept = Some(kept.map_or(rate, |old| (old + rate) / 2.0));
    }

    /// The measured rate, if any.
    pub(crate) fn bytes_per_second(&self) -> Option<f64> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
