//! When a delivery looks at and saves its checkpoint: the fixed or the
//! worker's interval, or that interval spread over the time the job has
//! left (from the program's progress file or the fleet's finished jobs).

use std::time::Duration;

use crate::pace::read_progress;

use super::{FIRST_SAVE_LOOK, Run};

/// How long a job has left, and who says so (for the log).
#[derive(Clone, Copy, Debug)]
pub(super) struct Left {
    pub(super) time: Duration,
    pub(super) from: &'static str,
}

impl<'a> Run<'a> {
    /// How long the runner waits between two looks at the checkpoint file:
    /// the fixed `--checkpoint-every`, or the worker's interval now.
    pub(super) fn save_interval(&self) -> Duration {
        self.handler
            .config
            .checkpoint_every
            .unwrap_or_else(|| self.job.cadence().interval())
    }

    /// The interval the program is told (`SPOT_WORKER_CHECKPOINT_INTERVAL`):
    /// [`Run::save_interval`], or spread over the rest of the job the
    /// fleet's finished jobs say it has left.
    pub(super) fn first_interval(&self) -> Duration {
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
    pub(super) fn is_due(&mut self, left: Option<Left>) -> bool {
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
    pub(super) async fn time_left(&mut self) -> Option<Left> {
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

    /// [`JobCheckpoint::expected_left`](spot_worker_storage::JobCheckpoint::expected_left), unless `--checkpoint-every` fixes
    /// the interval (or a save holds the handle).
    pub(super) fn expected_left(&self) -> Option<Duration> {
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
    pub(super) fn next_look(&self, left: Option<Left>) -> Duration {
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
    pub(super) async fn progress_left(&mut self) -> Option<Duration> {
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
}
