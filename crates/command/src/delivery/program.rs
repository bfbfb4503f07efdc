//! The program's run in one delivery: its process group and contract
//! environment, the loop that looks at and saves its checkpoint while it
//! runs, the stop on a notice, and its exit status.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use spot_worker_consumer::HandlerError;
use time::OffsetDateTime;
use tokio::io::AsyncWriteExt;
use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::saving::Save;
use crate::exit::{ExitStatus, RunnerEnded, signal_name};
use crate::group::{GroupGuard, kill_and_reap, signal_group};
use crate::look::{
    Look, StopLook, VANISHED_LOOK_AGAIN, joined, look, programs_fault, spawn_look,
    stop_beside_look, vanished,
};
use crate::output::{Stream, Tail, forward};

use super::trouble::Recording;
use super::{Ended, FIRST_SAVE_LOOK, GRACE_WITHOUT_DEADLINE, Run, SAVE_MARGIN, Stopped};

/// How long the end of a delivery waits for the program's output to be
/// read to its end (the pipes close as the group dies; only a process that
/// left the group can hold them longer).
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);

/// A long-enough placeholder for "never" in `select!` branches.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl<'a> Run<'a> {
    /// Starts the program and waits for it, saving its checkpoint file as it
    /// changes and stopping it on a notice, a timeout or a fault; returns
    /// once the program and its whole group are gone.
    pub(super) async fn run_program(&mut self, message_id: &str) -> Result<Ended, HandlerError> {
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

    /// The program, started in its own process group with the contract's
    /// environment, and tied to the runner's life (`spawner.rs`).
    pub(super) async fn spawn(
        &self,
        message_id: &str,
        interval: Duration,
    ) -> Result<Child, HandlerError> {
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
    pub(super) fn start_io(
        &self,
        child: &mut Child,
        message_id: &str,
        tail: &Tail,
    ) -> Vec<JoinHandle<()>> {
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
    pub(super) fn stop_for_notice(&self, pgid: i32) -> Instant {
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
