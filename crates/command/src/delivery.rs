//! One delivery: prepare the files, start the program in its own process
//! group, save its checkpoint file as it changes, stop it on a notice, and
//! turn its end into the delivery's outcome.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use spot_worker_consumer::{HandlerError, Job, permanent};
use spot_worker_storage::JobCheckpoint;
use time::OffsetDateTime;
use tokio::io::AsyncWriteExt;
use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::exit::{ExitStatus, RunnerEnded, Verdict, signal_name, verdict};
use crate::files::DeliveryDir;
use crate::group::{GroupGuard, kill_and_reap, signal_group};
use crate::handler::{CommandHandler, key_of};
use crate::look::{
    Look, StopLook, VANISHED_LOOK_AGAIN, joined, look, programs_fault, spawn_look,
    stop_beside_look, vanished,
};
use crate::output::{Stream, Tail, forward};
use crate::pace::{Pace, read_progress};
use crate::progress::from_progress;
use crate::saving::{FileVersion, Save, SaveTask};

/// The time kept, before the drain plan's release time, to save the
/// checkpoint file after SIGKILL: the program is killed this long before
/// the release (or half the time left, if less).
pub const SAVE_MARGIN: Duration = Duration::from_secs(1);

/// How long a stopped program has before SIGKILL when the worker gives no
/// release time (a lost lease, a consumer run without a deadline).
pub const GRACE_WITHOUT_DEADLINE: Duration = Duration::from_secs(10);

/// How long the end of a delivery waits for the program's output to be
/// read to its end (the pipes close as the group dies; only a process that
/// left the group can hold them longer).
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);

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

/// A write of the save-trouble record running beside the loop: the
/// record and how the write ended.
type Recording<'r> = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    crate::trouble::Record,
                    Result<(), spot_worker_storage::StorageError>,
                ),
            > + Send
            + 'r,
    >,
>;

/// How long the job's end waits for its save-trouble record to go.
const CLEAR_AT_END: Duration = Duration::from_secs(5);

/// A long-enough placeholder for "never" in `select!` branches.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

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
    /// one is known: the version stored ([`crate::saving`]).
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
    /// Why the last save ended [`Save::Later`], if it said.
    pub(crate) later_trouble: Option<(spot_worker_storage::SaveTroubleKind, String)>,
}

/// How long a job has left, and who says so (for the log).
#[derive(Clone, Copy, Debug)]
struct Left {
    time: Duration,
    from: &'static str,
}

/// The stop signal, as the checkpoint's versions are weighed against it.
pub(crate) struct Stopped {
    /// When it was sent (after the notice).
    pub(crate) at: Instant,
    /// The look at the checkpoint (file and directory) started with it
    /// ([`CheckpointFiles::fingerprint`], beside: the signal does not
    /// wait for it; [`stop_beside_look`]).
    ///
    /// [`CheckpointFiles::fingerprint`]: spot_worker_storage::files::CheckpointFiles::fingerprint
    pub(crate) look: StopLook,
}

impl<'a> Run<'a> {
    /// Starts the program and waits for it, saving its checkpoint file as it
    /// changes and stopping it on a notice, a timeout or a fault; returns
    /// once the program and its whole group are gone.
    async fn run_program(&mut self, message_id: &str) -> Result<Ended, HandlerError> {
        let config = &self.handler.config;
        let key = self.key.clone();
        // Before the start, so a file the program writes at once is new.
        // What is there now was restored: the job's stored version.
        self.saved_fingerprint = look(self.roots()).await.ok();
        let mut looked_at = self.saved_fingerprint.flatten();
        self.program_started = Some(std::time::Instant::now());
        let mut child = self.spawn(message_id, self.first_interval()).await?;
        let pgid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| format!("job {key}: the program has no process id"))?;
        let mut guard = GroupGuard { pgid, armed: true };
        let stderr_tail = Tail::default();
        let readers = self.start_io(&mut child, message_id, &stderr_tail);

        let started = Instant::now();
        let timeout_at = config.timeout.map(|timeout| started + timeout);
        let mut kill_at: Option<Instant> = None;
        let mut ended = RunnerEnded::No;
        // Until the first save, the file is looked at often, so progress
        // is kept from the moment it first appears; then at most every
        // `--checkpoint-every` or the worker's interval (`save_interval`).
        let mut next_save = started + FIRST_SAVE_LOOK;
        let mut saved_once = false;
        // A look at the checkpoint running beside the loop, if any.
        let mut looking: Option<JoinHandle<Look>> = None;
        // A write of the save-trouble record beside the loop, if any.
        let mut recording: Option<Recording<'_>> = None;
        let cancelled = self.job.cancellation().clone();
        let status = loop {
            tokio::select! {
                status = child.wait() => {
                    crate::reaper::program_reaped(pgid.unsigned_abs());
                    break status.map_err(|e| format!("job {key}: waiting for the program: {e}"))?;
                }
                () = cancelled.cancelled(), if ended != RunnerEnded::ForNotice => {
                    // The version there is now, before the signal: any
                    // other was written after it. Looked at beside, so
                    // however long the walk, the signal goes out now.
                    let at = Instant::now();
                    let roots = self.roots();
                    let (look, kill) =
                        stop_beside_look(move || roots.fingerprint(), || self.stop_for_notice(pgid));
                    self.stopped = Some(Stopped {
                        at,
                        look: StopLook::Running(look),
                    });
                    kill_at = Some(kill);
                    ended = RunnerEnded::ForNotice;
                }
                () = tokio::time::sleep_until(kill_at.unwrap_or(started + FAR)), if kill_at.is_some() => {
                    tracing::warn!(job_key = %key, "the program did not stop in time; killing its process group");
                    signal_group(pgid, libc::SIGKILL);
                    kill_at = None;
                }
                () = tokio::time::sleep_until(timeout_at.unwrap_or(started + FAR)), if timeout_at.is_some() && ended == RunnerEnded::No => {
                    tracing::warn!(job_key = %key, timeout = ?config.timeout, "the program ran longer than --timeout; killing it");
                    signal_group(pgid, libc::SIGKILL);
                    ended = RunnerEnded::ForTimeout;
                }
                joined = async { self.saving.as_mut().map(|task| &mut task.handle).expect("a save runs").await }, if self.saving.is_some() => {
                    let stamp = self.saving.as_ref().and_then(|task| task.fingerprint);
                    self.saving = None;
                    // Trouble (the store unreachable) waits a whole period.
                    let mut later = false;
                    let mut unsettled = false;
                    let mut record = None;
                    match self.save_ended(joined) {
                        Ok(Save::Saved) => {
                            saved_once = true;
                            looked_at = stamp;
                            record = self.trouble.cleared();
                        }
                        Ok(Save::Unchanged) => looked_at = stamp,
                        Ok(Save::Later) => {
                            later = true;
                            record = self.later_trouble.take().and_then(|(kind, error)| self.trouble_met(kind, &error));
                        }
                        Ok(Save::Unsettled) => {
                            unsettled = true;
                            record = self.trouble_met(
                                spot_worker_storage::SaveTroubleKind::NeverHeldStill,
                                "the checkpoint directory changed while it was read, or was written after its commit marker",
                            );
                        }
                        Err(fault) if ended == RunnerEnded::No => {
                            tracing::error!(job_key = %key, error = %fault, "killing the program");
                            signal_group(pgid, libc::SIGKILL);
                            ended = RunnerEnded::ForFault(fault);
                        }
                        Err(_) => {}
                    }
                    if let Some(record) = record {
                        self.record_beside(record, &mut recording);
                    }
                    let left = self.last_left;
                    // Trouble with the store says nothing of the directory.
                    let unsettled = if later { None } else { self.settle(unsettled) };
                    next_save = Instant::now()
                        + if let Some(retry) = unsettled {
                            retry
                        } else if later {
                            self.save_interval()
                        } else if saved_once {
                            self.next_look(left)
                        } else {
                            FIRST_SAVE_LOOK
                        };
                }
                // Once the program is being stopped, only its last version
                // is saved (`save_final`, after it ends): a save of one it
                // is still writing would take the release budget from it.
                () = tokio::time::sleep_until(next_save), if self.saving.is_none() && looking.is_none() && ended == RunnerEnded::No => {
                    // Before the first save only for the pace's first reading.
                    let left = if saved_once || !self.pace.started() {
                        self.time_left().await
                    } else {
                        None
                    };
                    self.last_left = left;
                    // Beside the loop: its end is the branch below.
                    looking = Some(spawn_look(self.roots()));
                }
                recorded = async { recording.as_mut().expect("a record is written").await }, if recording.is_some() => {
                    recording = None;
                    let (record, result) = recorded;
                    if let Err(error) = result {
                        tracing::debug!(job_key = %key, %error, "the save-trouble record could not be written; tried again at a later look");
                        self.trouble.failed(&record);
                    }
                }
                found = async { looking.as_mut().expect("a look runs").await }, if looking.is_some() => {
                    looking = None;
                    let left = self.last_left;
                    let stamp = match joined(found) {
                        Ok(stamp) => stamp,
                        // Being stopped already: its last save says it.
                        Err(_) if ended != RunnerEnded::No => continue,
                        Err(error) => match programs_fault(&error) {
                            // What no save can store: said now, not at
                            // the program's exit.
                            Some(fault) => {
                                tracing::error!(job_key = %key, error = %fault, "the checkpoint cannot be saved; killing the program");
                                signal_group(pgid, libc::SIGKILL);
                                ended = RunnerEnded::ForFault(fault);
                                continue;
                            }
                            None => {
                                tracing::warn!(job_key = %key, %error, "the checkpoint could not be looked at; trying again later");
                                if !vanished(&error)
                                    && let Some(record) = self.trouble_met(
                                        spot_worker_storage::SaveTroubleKind::Unreadable,
                                        &error.to_string(),
                                    )
                                {
                                    self.record_beside(record, &mut recording);
                                }
                                // A file that went between the walk's listing
                                // and its read: the program is writing, so the
                                // next look comes soon, not an interval later.
                                let wait = if vanished(&error) {
                                    VANISHED_LOOK_AGAIN.min(self.save_interval())
                                } else {
                                    self.save_interval()
                                };
                                next_save = Instant::now() + wait;
                                continue;
                            }
                        },
                    };
                    if ended != RunnerEnded::No {
                        continue;
                    }
                    let look = match (saved_once, left) {
                        (false, _) => stamp != looked_at,
                        (true, None) => stamp != looked_at,
                        // Looked at often once due (`next_look`): only a
                        // new version of the file is read.
                        (true, Some(_)) => self.is_due(left) && stamp != looked_at,
                    };
                    if look {
                        // Beside the loop: its end is the branch above.
                        self.start_save(false, stamp);
                    } else {
                        next_save = Instant::now()
                            + if saved_once {
                                self.next_look(left)
                            } else {
                                FIRST_SAVE_LOOK
                            };
                    }
                }
            }
        };
        // Whatever the program left running in its group goes with it.
        if !kill_and_reap(pgid).await {
            tracing::warn!(job_key = %key, pgid, "processes of the program's group outlived SIGKILL");
        }
        guard.armed = false;
        for reader in readers {
            let abort = reader.abort_handle();
            if tokio::time::timeout(OUTPUT_DRAIN, reader).await.is_err() {
                // A process that left the group still holds the pipe.
                abort.abort();
            }
        }
        Ok(Ended {
            status: exit_status(status),
            ended,
            stderr: stderr_tail,
        })
    }

    /// Counts reads in a row that found the checkpoint not one state of
    /// the program (`unsettled`), says once when it never holds still
    /// long enough, and returns how soon to read it again (`None`: it was
    /// one state, or the save did not get as far as reading).
    fn settle(&mut self, unsettled: bool) -> Option<Duration> {
        if !unsettled {
            if self.unsettled >= crate::settle::REPORT_AFTER {
                tracing::info!(job_key = %self.key, tries = self.unsettled, "the checkpoint was read as one state of the program again");
            }
            self.unsettled = 0;
            return None;
        }
        self.unsettled = self.unsettled.saturating_add(1);
        if crate::settle::report_now(self.unsettled) {
            let since_last_save = self.last_complete.map(|at| at.elapsed());
            let hint = if self.handler.config.checkpoint_marker.is_some() {
                "the program wrote the directory again before it could be read at its commit marker"
            } else {
                "the program writes the directory all the time; name a commit marker the program writes last (SPOT_WORKER_CHECKPOINT_MARKER, docs/command.md)"
            };
            let dir = self.dir.checkpoint_dir();
            tracing::warn!(job_key = %self.key, dir = %dir.display(), tries = self.unsettled, ?since_last_save, hint, "the checkpoint never held still long enough to be saved as one state of the program: the version saved last stands; still trying");
        }
        Some(crate::settle::retry_after(
            self.unsettled,
            self.save_interval(),
        ))
    }

    /// [`TroubleLog::met`](crate::trouble::TroubleLog::met) now.
    fn trouble_met(
        &mut self,
        kind: spot_worker_storage::SaveTroubleKind,
        error: &str,
    ) -> Option<crate::trouble::Record> {
        let last_saved = self
            .last_complete
            .map(|at| crate::trouble::wall_ago(at.elapsed()));
        self.trouble.met(
            kind,
            error,
            last_saved,
            (OffsetDateTime::now_utc(), std::time::Instant::now()),
        )
    }

    /// Starts writing `record` beside the loop (into `recording`); one
    /// write at a time: while one runs, this one is left to a later look.
    fn record_beside<'r>(
        &mut self,
        record: crate::trouble::Record,
        recording: &mut Option<Recording<'r>>,
    ) where
        'a: 'r,
    {
        if recording.is_some() {
            self.trouble.failed(&record);
            return;
        }
        let job: &'a Job = self.job;
        *recording = Some(Box::pin(async move {
            let result = match &record {
                crate::trouble::Record::Write(trouble) => {
                    job.record_save_trouble(Some(trouble)).await
                }
                crate::trouble::Record::Delete => job.record_save_trouble(None).await,
            };
            (record, result)
        }));
    }

    /// At the job's end, deletes a save-trouble record the store may hold
    /// (bounded: the job is done whether or not it goes).
    async fn clear_trouble_at_end(&mut self) {
        if !self.trouble.maybe_stored() {
            return;
        }
        let cleared = tokio::time::timeout(CLEAR_AT_END, self.job.record_save_trouble(None)).await;
        if !matches!(cleared, Ok(Ok(()))) {
            tracing::debug!(job_key = %self.key, "the save-trouble record was not deleted at the job's end; `status` shows it until it is");
        }
    }

    /// How long the runner waits between two looks at the checkpoint file:
    /// the fixed `--checkpoint-every`, or the worker's interval now.
    fn save_interval(&self) -> Duration {
        self.handler
            .config
            .checkpoint_every
            .unwrap_or_else(|| self.job.cadence().interval())
    }

    /// The interval the program is told (`SPOT_WORKER_CHECKPOINT_INTERVAL`):
    /// [`Run::save_interval`], or spread over the rest of the job the
    /// fleet's finished jobs say it has left.
    fn first_interval(&self) -> Duration {
        match (self.expected_left(), self.checkpoint.as_ref()) {
            (Some(left), Some(checkpoint)) => checkpoint.cadence().interval_before_end(left),
            _ => self.save_interval(),
        }
    }

    /// Whether the runner saves the checkpoint file (if changed) at a look
    /// after the first save: always, unless it knows how long the job has
    /// `left` (the program's progress, or the fleet's finished jobs), when
    /// the worker's interval spread over the rest of the job decides
    /// (docs/checkpoint-interval.md).
    fn is_due(&mut self, left: Option<Left>) -> bool {
        let (Some(left), Some(checkpoint)) = (left, self.checkpoint.as_ref()) else {
            return true;
        };
        let due = checkpoint.is_due_before_end(left.time);
        let since_last_save = checkpoint.since_last_save();
        if self.spread_due.replace(due) != Some(due) {
            let (left, from) = (left.time, left.from);
            tracing::debug!(job_key = %self.key, ?left, from, due, ?since_last_save, "the saves are spread over the rest of the job");
        }
        due
    }

    /// The time the job has left: from the program's progress file if it
    /// writes one, else the rest the fleet's finished jobs say a job that
    /// has done this much has left; `None` with `--checkpoint-every`, or
    /// when neither can say.
    async fn time_left(&mut self) -> Option<Left> {
        if let Some(time) = self.progress_left().await {
            return Some(Left {
                time,
                from: "the program's progress",
            });
        }
        self.expected_left().map(|time| Left {
            time,
            from: "the fleet's finished jobs",
        })
    }

    /// [`JobCheckpoint::expected_left`], unless `--checkpoint-every` fixes
    /// the interval (or a save holds the handle).
    fn expected_left(&self) -> Option<Duration> {
        if self.handler.config.checkpoint_every.is_some() {
            return None;
        }
        self.checkpoint.as_ref()?.expected_left()
    }

    /// How long until the next look after the first save: the time until
    /// the interval spread over the rest of the job has passed since the
    /// last save if the runner knows how long the job has `left`
    /// (at least [`FIRST_SAVE_LOOK`], as before the first save: a save
    /// due waits only for the program's next version of the file), else
    /// [`Run::save_interval`].
    fn next_look(&self, left: Option<Left>) -> Duration {
        match (left.map(|left| left.time), self.checkpoint.as_ref()) {
            (Some(left), Some(checkpoint)) => {
                let since = checkpoint.since_last_save();
                checkpoint
                    .cadence()
                    .interval_before_end(since.saturating_add(left))
                    .saturating_sub(since)
                    .max(FIRST_SAVE_LOOK)
            }
            _ => self.save_interval(),
        }
    }

    /// Reads the progress file (`SPOT_WORKER_PROGRESS`): the time the rest
    /// of the job takes at this delivery's pace, `None` without a file, a
    /// pace, or with `--checkpoint-every` (a fixed interval wins). The
    /// share read is reported to the job ([`Job::report_progress`]: the
    /// lane rule of a job with a deadline reads it). A malformed file is
    /// said once per delivery in the log and ignored.
    async fn progress_left(&mut self) -> Option<Duration> {
        // A job with a deadline reports its progress to the lane rule
        // (docs/deploying.md, "The two lanes") whatever the interval.
        let fixed = self.handler.config.checkpoint_every.is_some();
        if fixed && self.job.due().is_none() {
            return None;
        }
        let path = self.dir.progress();
        let read = tokio::task::spawn_blocking(move || read_progress(&path)).await;
        let reason = match read {
            Ok(Ok(done)) => {
                let done = done?;
                self.job.report_progress(done);
                if fixed {
                    return None;
                }
                return self.pace.left(done, std::time::Instant::now());
            }
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        if !std::mem::replace(&mut self.progress_warned, true) {
            tracing::warn!(job_key = %self.key, %reason, "the progress file (SPOT_WORKER_PROGRESS) is ignored; the checkpoint file is saved at the worker's interval");
        }
        None
    }

    /// The program, started in its own process group with the contract's
    /// environment, and tied to the runner's life (`spawner.rs`).
    async fn spawn(&self, message_id: &str, interval: Duration) -> Result<Child, HandlerError> {
        let config = &self.handler.config;
        let job = self.job;
        let mut contract: Vec<(&'static str, String)> = vec![
            ("SPOT_WORKER_JOB_KEY", self.key.clone()),
            ("SPOT_WORKER_MESSAGE_ID", message_id.to_owned()),
            ("SPOT_WORKER_DELIVERY", job.dequeue_count().to_string()),
            ("SPOT_WORKER_FAILURES", self.failures.to_string()),
            (
                "SPOT_WORKER_WORK_DIR",
                path_text(self.dir.work().to_path_buf()),
            ),
            ("SPOT_WORKER_CHECKPOINT", path_text(self.dir.checkpoint())),
            (
                "SPOT_WORKER_CHECKPOINT_DIR",
                path_text(self.dir.checkpoint_dir()),
            ),
            ("SPOT_WORKER_RESULT", path_text(self.dir.result())),
            ("SPOT_WORKER_PROGRESS", path_text(self.dir.progress())),
            ("SPOT_WORKER_NOTICE", path_text(self.dir.notice())),
            (
                "SPOT_WORKER_CHECKPOINT_INTERVAL",
                interval_seconds(interval),
            ),
        ];
        if let Some(user) = &config.program_user {
            // Who it is, not who its runner is; and its directories.
            contract.extend(user.env());
            self.dir.hand_over(user).map_err(|e| {
                format!(
                    "job {}: handing the delivery directory to user {}: {e}",
                    self.key, user.name
                )
            })?;
        }
        let env = crate::env::child_env(
            std::env::vars_os(),
            &*config.secret,
            &config.pass_env,
            &contract,
        );
        let mut command = tokio::process::Command::new(&config.program);
        command
            .args(&config.args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        crate::spawner::spawn_tied_to_runner(command, config.program_user.clone())
            .await
            .map_err(|e| {
                format!(
                    "job {}: starting {}: {e}",
                    self.key,
                    config.program.display()
                )
                .into()
            })
    }

    /// Feeds the body to stdin (then end of file) and forwards stdout and
    /// stderr to the log (at `--program-output`'s level).
    fn start_io(&self, child: &mut Child, message_id: &str, tail: &Tail) -> Vec<JoinHandle<()>> {
        if let Some(mut stdin) = child.stdin.take() {
            let body = self.job.body().to_vec();
            // A program that does not read its input is not an error.
            tokio::spawn(async move {
                let _ = stdin.write_all(&body).await;
                let _ = stdin.shutdown().await;
            });
        }
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(forward(
                stdout,
                Stream::Stdout,
                self.handler.config.output_level,
                self.key.clone(),
                message_id.to_owned(),
                None,
            )));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(forward(
                stderr,
                Stream::Stderr,
                self.handler.config.output_level,
                self.key.clone(),
                message_id.to_owned(),
                Some(tail.clone()),
            )));
        }
        readers
    }

    /// Stops the program for a notice: the stop signal to its group, the
    /// notice file, and the time SIGKILL follows.
    fn stop_for_notice(&self, pgid: i32) -> Instant {
        let now = Instant::now();
        let (deadline, kill_at) = match self.job.deadline() {
            Some(release) => {
                let left = release.saturating_duration_since(now);
                (release, release - SAVE_MARGIN.min(left / 2))
            }
            None => (now + GRACE_WITHOUT_DEADLINE, now + GRACE_WITHOUT_DEADLINE),
        };
        let signal = self.handler.config.stop_signal;
        signal_group(pgid, signal);
        let wall = OffsetDateTime::now_utc() + deadline.saturating_duration_since(now);
        if let Err(error) = self.dir.write_notice(wall) {
            tracing::warn!(job_key = %self.key, %error, "the notice file could not be written");
        }
        tracing::info!(
            job_key = %self.key,
            signal = %signal_name(signal),
            kill_in_ms = kill_at.saturating_duration_since(now).as_millis() as u64,
            "stopping the program for the drain"
        );
        kill_at
    }
}

/// `wait`'s status as an exit code or a signal.
fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitStatus::Code(code),
        (None, Some(signal)) => ExitStatus::Signal(signal),
        (None, None) => ExitStatus::Code(-1),
    }
}

fn path_text(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

/// An interval as the contract's whole seconds, rounded up and at least 1,
/// so a program that saves "every N seconds" never saves more often than
/// the runner looks.
fn interval_seconds(interval: Duration) -> String {
    let seconds = interval.as_secs() + u64::from(interval.subsec_nanos() > 0);
    seconds.max(1).to_string()
}
