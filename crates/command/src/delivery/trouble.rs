//! Saves that do not go through in a delivery: a checkpoint that never
//! holds still long enough to be read as one state, and the save-trouble
//! record `status` shows while saves keep failing.

use std::time::Duration;

use spot_worker_consumer::Job;
use time::OffsetDateTime;

use super::Run;

/// A write of the save-trouble record running beside the loop: the
/// record and how the write ended.
pub(super) type Recording<'r> = std::pin::Pin<
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

impl<'a> Run<'a> {
    /// Counts reads in a row that found the checkpoint not one state of
    /// the program (`unsettled`), says once when it never holds still
    /// long enough, and returns how soon to read it again (`None`: it was
    /// one state, or the save did not get as far as reading).
    pub(super) fn settle(&mut self, unsettled: bool) -> Option<Duration> {
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
    pub(super) fn trouble_met(
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
    pub(super) fn record_beside<'r>(
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
    pub(super) async fn clear_trouble_at_end(&mut self) {
        if !self.trouble.maybe_stored() {
            return;
        }
        let cleared = tokio::time::timeout(CLEAR_AT_END, self.job.record_save_trouble(None)).await;
        if !matches!(cleared, Ok(Ok(()))) {
            tracing::debug!(job_key = %self.key, "the save-trouble record was not deleted at the job's end; `status` shows it until it is");
        }
    }
}
