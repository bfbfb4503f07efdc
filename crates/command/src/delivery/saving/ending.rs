//! The save at a delivery's end: the program's last version saved, planned
//! against the time left before the release, and the final size checked
//! on a clean exit.

use std::time::Duration;

use spot_worker_storage::files::SaveFilesError;
use tokio::time::Instant;

use crate::delivery::Run;

use super::{Save, SaveTask};

/// The time kept between the end of a final save and the release.
const FINAL_SAVE_SLACK: Duration = Duration::from_millis(100);

/// Whether a look that found `now` finds the version stored already
/// (`saved`: what the look before the last save, or the restore, found).
/// A look that found nothing matches only a save of nothing; ask only
/// after a look that succeeded (a failed one found no version at all).
fn is_saved_already(saved: Option<Option<[u8; 32]>>, now: Option<[u8; 32]>) -> bool {
    saved == Some(now)
}

impl Run<'_> {
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
}
