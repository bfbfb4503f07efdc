//! What a delivery leaves behind: its checkpoint (the file and the
//! directory) saved while the program runs and once it has ended, and on a
//! clean exit its result stored create-only and the job marked completed.
//!
//! A save runs on a task of its own beside the delivery's loop
//! ([`SaveTask`]): the loop only starts it and looks at its end, so a slow
//! or stalled store never holds up the stop signal, a timeout or a kill.

use std::time::Duration;

use spot_worker_storage::files::{CheckpointFiles, SaveStats};
use spot_worker_storage::{CancellationToken, JobCheckpoint};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::delivery::Run;
use crate::settle::MarkerStamp;
use crate::version_files::FileVersion;
use crate::version_files::{Roots, SavedFiles};

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
}

mod ending;
mod one_save;
mod result;

use one_save::save_once;
