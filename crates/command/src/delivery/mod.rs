//! One delivery: prepare the files, start the program in its own process
//! group, save its checkpoint file as it changes, stop it on a notice, and
//! turn its end into the delivery's outcome.

use std::path::PathBuf;
use std::time::Duration;

use spot_worker_consumer::{HandlerError, Job, permanent};
use spot_worker_storage::JobCheckpoint;
use tokio::time::Instant;

use crate::exit::{ExitStatus, RunnerEnded, Verdict, verdict};
use crate::files::DeliveryDir;
use crate::handler::{CommandHandler, key_of};
use crate::look::StopLook;
use crate::output::Tail;
use crate::pace::Pace;
use crate::progress::from_progress;
use crate::version_files::FileVersion;
use saving::SaveTask;

/// The time kept, before the drain plan's release time, to save the
/// checkpoint file after SIGKILL: the program is killed this long before
/// the release (or half the time left, if less).
pub const SAVE_MARGIN: Duration = Duration::from_secs(1);

/// How long a stopped program has before SIGKILL when the worker gives no
/// release time (a lost lease, a consumer run without a deadline).
pub const GRACE_WITHOUT_DEADLINE: Duration = Duration::from_secs(10);

/// How often the checkpoint file is looked at (its metadata only) until
/// its first save in a delivery, so the first save follows the file's
/// first appearance instead of waiting a whole `--checkpoint-every`.
pub const FIRST_SAVE_LOOK: Duration = Duration::from_millis(100);

/// Restores the job's saved checkpoint into the delivery directory: the
/// files a manifest names, or a checkpoint file saved whole by an older
/// runner (base64 in the document). Returns the restored file's version.
async fn restore(
    checkpoint: &mut JobCheckpoint,
    dir: &DeliveryDir,
    key: &str,
) -> Result<Option<FileVersion>, HandlerError> {
    let roots = spot_worker_storage::files::CheckpointFiles::default()
        .with_file("file", dir.checkpoint())
        .with_dir("dir", dir.checkpoint_dir());
    match checkpoint.manifest() {
        Ok(Some(_)) => {
            let restored = checkpoint
                .restore_files(&roots)
                .await
                .map_err(|e| format!("job {key}: restoring its checkpoint: {e}"))?;
            if let Some(restored) = restored {
                tracing::info!(job_key = %key, files = restored.files, bytes = restored.bytes, chunks = restored.chunks, took_ms = restored.took.as_millis() as u64, "resuming from the saved checkpoint");
            }
        }
        Ok(None) => {
            let saved = checkpoint
                .progress()
                .map(from_progress)
                .transpose()
                .map_err(|e| permanent(format!("job {key}: {e}")))?;
            if let Some(bytes) = &saved {
                std::fs::write(dir.checkpoint(), bytes)
                    .map_err(|e| format!("job {key}: writing the checkpoint file: {e}"))?;
                tracing::info!(job_key = %key, bytes = bytes.len(), "resuming from the saved checkpoint file");
            }
        }
        Err(error) => return Err(format!("job {key}: {error}").into()),
    }
    Ok(std::fs::symlink_metadata(dir.checkpoint())
        .ok()
        .map(|meta| FileVersion::of(&meta)))
}

/// The commit marker's path in the delivery's checkpoint directory.
fn run_dir_marker(dir: &DeliveryDir, marker: &str) -> PathBuf {
    dir.checkpoint_dir().join(marker)
}

mod pacing;
mod program;
pub(crate) mod saving;
mod trouble;

use pacing::Left;

impl CommandHandler {
    /// Runs the program for one delivery of `job`.
    pub(crate) async fn deliver(&self, job: &Job) -> Result<(), HandlerError> {
        let config = &self.config;
        let key = job.key().to_owned();
        let message_id = job.id().to_string();
        let keyed_by_body = match &config.job_key_field {
            Some(field) => {
                if key_of(job.body(), field).is_none() {
                    return Err(permanent(format!(
                        "the body is not a JSON object with a string or number field {field:?} \
                         to key the job by (--job-key)"
                    )));
                }
                true
            }
            None => false,
        };
        let checkpoint = job
            .checkpoint()
            .await
            .map_err(|e| format!("job {key}: reading its checkpoint: {e}"))?;
        if checkpoint.is_completed() {
            tracing::info!(job_key = %key, "already completed; not run again");
            return Ok(());
        }
        let dir = DeliveryDir::create(config.work_root.as_deref())
            .map_err(|e| format!("job {key}: creating the delivery directory: {e}"))?;
        let mut checkpoint = checkpoint.with_transfer_limits(config.transfer);
        let restored = tokio::select! {
            restored = restore(&mut checkpoint, &dir, &key) => restored?,
            () = job.cancellation().cancelled() => {
                return Err(format!("job {key}: not started, the worker is winding down").into());
            }
        };
        if job.cancellation().is_cancelled() {
            return Err(format!("job {key}: not started, the worker is winding down").into());
        }

        let failures = job
            .failures()
            .await
            .map_err(|e| format!("job {key}: reading its attempt record: {e}"))?;
        // The restored marker is the version saved: the program's next
        // marker is the next one.
        let restored_marker = config.checkpoint_marker.as_ref().and_then(|marker| {
            std::fs::symlink_metadata(run_dir_marker(&dir, marker))
                .ok()
                .map(|meta| crate::settle::MarkerStamp::of(&meta))
        });
        let mut run = Run {
            handler: self,
            job,
            failures,
            key: key.clone(),
            dir,
            checkpoint: Some(checkpoint),
            saving: None,
            saved_file: restored,
            saved_fingerprint: None,
            saved_marker: restored_marker,
            unsettled: 0,
            saved_files: Default::default(),
            last_complete: None,
            skipped_warned: false,
            program_started: None,
            pace: Pace::default(),
            progress_warned: false,
            spread_due: None,
            last_left: None,
            stopped: None,
            // A redelivery may find a record an earlier delivery left.
            trouble: crate::trouble::TroubleLog::new(&key, job.dequeue_count() != 1),
            later_trouble: None,
        };
        let ended = run.run_program(&message_id).await?;
        let Ended {
            status,
            ended,
            stderr,
        } = ended;
        let outcome = verdict(status, &ended, &config.permanent_exit_codes);
        tracing::info!(job_key = %key, message_id = %message_id, status = %status, outcome = ?outcome, "the program ended");
        let with_stderr = |reason: String| {
            let tail = stderr.text();
            if tail.is_empty() {
                format!("job {key}: {reason}")
            } else {
                format!("job {key}: {reason}; stderr ends with:\n{tail}")
            }
        };
        // A file over the limit at the last save is the program's fault
        // as at every other save: the reason says so.
        let unsaved = |reason: String, fault: Option<String>| match fault {
            Some(fault) => format!("{reason}; its last checkpoint file was not saved: {fault}"),
            None => reason,
        };
        match outcome {
            Verdict::Done => match run.check_final_size().await {
                Ok(()) => {
                    // Done: a save still running is no use any more.
                    if let Some(task) = run.saving.take()
                        && let Some(end) = task.abandon().await
                    {
                        run.checkpoint = Some(end.checkpoint);
                    }
                    let finished = run.finish(&message_id, keyed_by_body).await;
                    run.clear_trouble_at_end().await;
                    finished
                }
                Err(fault) => Err(with_stderr(format!(
                    "the program exited 0, but {fault}; no result stored"
                ))
                .into()),
            },
            Verdict::Released => {
                let fault = run.save_final().await;
                let reason = match fault {
                    None => format!(
                        "job {key}: the program was stopped for a notice or shutdown (it {status}); \
                         its checkpoint file is saved and the message handed back"
                    ),
                    // Not counted all the same: nothing a drain ends is.
                    Some(fault) => format!(
                        "job {key}: the program was stopped for a notice or shutdown (it {status}); \
                         its last checkpoint file was not saved ({fault}), so the next delivery \
                         resumes from the last save"
                    ),
                };
                Err(reason.into())
            }
            Verdict::Permanent(reason) => {
                let fault = run.save_final().await;
                Err(permanent(with_stderr(unsaved(reason, fault))))
            }
            Verdict::Failed(reason) => {
                let fault = run.save_final().await;
                Err(with_stderr(unsaved(reason, fault)).into())
            }
        }
    }
}

/// How the program ended.
struct Ended {
    status: ExitStatus,
    ended: RunnerEnded,
    stderr: Tail,
}

/// One delivery's program run and its checkpoint file.
pub(crate) struct Run<'a> {
    pub(crate) handler: &'a CommandHandler,
    pub(crate) job: &'a Job,
    /// Failures recorded before this delivery.
    pub(crate) failures: u32,
    pub(crate) key: String,
    pub(crate) dir: DeliveryDir,
    /// The job's checkpoint; `None` while a save holds it.
    pub(crate) checkpoint: Option<JobCheckpoint>,
    /// The save running beside the loop, if any.
    pub(crate) saving: Option<SaveTask>,
    /// The version of the file last saved (or restored).
    pub(crate) saved_file: Option<FileVersion>,
    /// What the look before the last save (or the restore) found, once
    /// one is known: the version stored ([`saving`]).
    pub(crate) saved_fingerprint: Option<Option<[u8; 32]>>,
    /// The commit marker last saved (or restored), with
    /// `SPOT_WORKER_CHECKPOINT_MARKER`.
    pub(crate) saved_marker: Option<crate::settle::MarkerStamp>,
    /// Reads in a row that found the checkpoint not one state (`settle.rs`).
    unsettled: u32,
    /// The files of the version saved last (what the cost of a save
    /// tells a file written in place by).
    pub(crate) saved_files: crate::version_files::SavedFiles,
    /// When the last save completed.
    pub(crate) last_complete: Option<std::time::Instant>,
    /// Whether passed-over checkpoint paths were said in the log.
    pub(crate) skipped_warned: bool,
    /// When the program was started.
    pub(crate) program_started: Option<std::time::Instant>,
    /// The program's pace, from its progress file.
    pace: Pace,
    /// Whether a malformed progress file was said in the log.
    progress_warned: bool,
    /// What the progress decided at the last look, so the log says each
    /// change once rather than every look.
    spread_due: Option<bool>,
    /// How long the job had left at the last look.
    last_left: Option<Left>,
    /// When the program was sent its stop signal, and the checkpoint's
    /// fingerprint then: a version other than it was written after the
    /// signal.
    pub(crate) stopped: Option<Stopped>,
    /// Saves that keep failing, as `status` is told of them.
    trouble: crate::trouble::TroubleLog,
    /// Why the last save ended [`Save::Later`](saving::Save::Later), if it said.
    pub(crate) later_trouble: Option<(spot_worker_storage::SaveTroubleKind, String)>,
}

/// The stop signal, as the checkpoint's versions are weighed against it.
pub(crate) struct Stopped {
    /// When it was sent (after the notice).
    pub(crate) at: Instant,
    /// The look at the checkpoint (file and directory) started with it
    /// ([`CheckpointFiles::fingerprint`], beside: the signal does not
    /// wait for it; [`stop_beside_look`](crate::look::stop_beside_look)).
    ///
    /// [`CheckpointFiles::fingerprint`]: spot_worker_storage::files::CheckpointFiles::fingerprint
    pub(crate) look: StopLook,
}
