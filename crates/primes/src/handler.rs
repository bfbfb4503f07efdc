//! The job as a [`MessageHandler`]: resume from the checkpoint, count chunk
//! by chunk on the blocking pool (so the runtime, and with it the lease
//! renewal, stays responsive), checkpoint after a chunk when a save is due,
//! save how far it got and stop when cancelled, and finish with a
//! create-only result.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use spot_worker_consumer::{HandlerError, Job, MessageHandler, ResultMarker, permanent};
use spot_worker_decisions::cadence::time_left;
use spot_worker_storage::{
    CancellationToken, JobCheckpoint, PutOutcome, ResultStore, StorageError,
};

use tokio::time::Instant;

use crate::config::{PrimesConfig, Progress};
use crate::job::{PrimesError, PrimesJob, PrimesResult, SavedProgress};
use crate::sieve::{BasePrimes, Counted};

/// The primes job as a [`MessageHandler`]; build it with [`handler`].
///
/// For each message: parse the [`PrimesJob`]; if its checkpoint (keyed by
/// `job_id`) is completed (written by earlier versions), make sure the
/// result exists and succeed without recomputing; otherwise resume from the
/// saved cursor and partial count, count the rest chunk by chunk
/// (checkpointing `{"cursor", "primes"}` after a chunk when a save is due,
/// see [`PrimesConfig::checkpoint_every`], and when cancelled), and write
/// `{job_id}.json` = `{"job_id":…,"start":…,"end":…,"primes":N}`
/// create-only. That result is the job's completion marker
/// ([`MessageHandler::completion_marker`]): no completed checkpoint is
/// written, the consumer reads nothing before a first delivery, and it
/// removes the job's progress once the message is deleted. A one-chunk job
/// thus costs its share of a receive, one result write and the delete. A
/// job that started from nothing looks for its result before its first
/// progress write, so a duplicate of a finished job stops there.
///
/// When [`Job::cancellation`] fires (the worker winds down, or the lease is
/// lost) the current chunk stops at its next segment (256 Ki numbers), the
/// part counted so far is saved if the checkpoint still accepts writes, and
/// the handler returns [`PrimesError::Interrupted`]; the consumer then
/// releases the message for the next worker, which resumes from there.
#[derive(Clone, Debug)]
pub struct PrimesHandler {
    results: Arc<dyn ResultStore>,
    config: PrimesConfig,
}

/// The primes job, writing its results to `results`. The consumer running
/// it must have a checkpoint store
/// ([`Consumer::with_checkpoints`](spot_worker_consumer::Consumer::with_checkpoints)).
pub fn handler(results: Arc<dyn ResultStore>, config: PrimesConfig) -> PrimesHandler {
    PrimesHandler { results, config }
}

impl MessageHandler for PrimesHandler {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.run(&job).await.map_err(into_handler_error)
    }

    /// The job id: duplicate messages for one job share its checkpoint, and
    /// the consumer deletes them once it is completed.
    fn job_key(&self, body: &[u8]) -> Option<String> {
        PrimesJob::parse(body).ok().map(|spec| spec.job_id)
    }

    /// The result `{job_id}.json`: written create-only when the job is done,
    /// it marks the job completed.
    fn completion_marker(&self, body: &[u8]) -> Option<ResultMarker> {
        PrimesJob::parse(body)
            .ok()
            .map(|spec| ResultMarker::new(Arc::clone(&self.results), spec.result_name()))
    }

    fn verify_completed(&self, body: &[u8], result: &Value) -> Result<(), HandlerError> {
        let spec = PrimesJob::parse(body).map_err(into_handler_error)?;
        completed_result(&spec, result)
            .map(|_| ())
            .map_err(into_handler_error)
    }
}

/// Marks the errors retrying cannot fix as permanent.
fn into_handler_error(error: PrimesError) -> HandlerError {
    if error.is_permanent() {
        permanent(error)
    } else {
        error.into()
    }
}

/// Where the job's saved progress ends, and when it was saved.
struct Saved {
    cursor: u64,
    at: Instant,
}

impl Saved {
    fn at(cursor: u64) -> Self {
        Saved {
            cursor,
            at: Instant::now(),
        }
    }

    /// Whether `every` has passed since the last save.
    fn due(&self, every: Duration) -> bool {
        self.at.elapsed() >= every
    }
}

/// The result a completed checkpoint holds, if it is `spec`'s: the same job
/// id and range. Another range under the same id is a permanent error,
/// never a silent skip with the old count.
fn completed_result(spec: &PrimesJob, result: &Value) -> Result<PrimesResult, PrimesError> {
    let done = serde_json::from_value::<PrimesResult>(result.clone())
        .ok()
        .filter(|done| done.job_id == spec.job_id)
        .ok_or_else(|| PrimesError::BadCheckpoint {
            job_id: spec.job_id.clone(),
            reason: format!("the completed checkpoint holds {result}"),
        })?;
    if !done.is_for(spec) {
        return Err(PrimesError::DifferentJob {
            job_id: spec.job_id.clone(),
            done_start: done.start,
            done_end: done.end,
            primes: done.primes,
            start: spec.start,
            end: spec.end,
        });
    }
    Ok(done)
}

impl PrimesHandler {
    async fn run(&self, job: &Job) -> Result<(), PrimesError> {
        let spec = PrimesJob::parse(job.body())?;
        let storage = |action: &'static str| {
            let job_id = spec.job_id.clone();
            move |source: StorageError| PrimesError::Storage {
                job_id,
                action,
                source,
            }
        };
        let mut checkpoint = job
            .checkpoint_for(&spec.job_id)
            .await
            .map_err(storage("reading the checkpoint"))?;

        if let Some(result) = checkpoint.result() {
            let done = completed_result(&spec, result)?;
            // The result is written before the checkpoint completes, so it
            // exists; one create-only write makes sure (and costs nothing
            // but a request) instead of trusting that nobody deleted it.
            self.put_result(job, &spec, &done).await?;
            tracing::info!(job_id = %spec.job_id, primes = done.primes, "already completed; not recomputed");
            return Ok(());
        }

        let resumed = resume_point(&spec, &checkpoint)?;
        let SavedProgress {
            mut cursor,
            mut primes,
        } = resumed;
        if cursor > spec.start {
            tracing::info!(job_id = %spec.job_id, cursor, primes, "resuming from the checkpoint");
        }
        // Nothing was read (a first delivery reads nothing, see
        // `completion_marker`) or nothing was there: a duplicate of a
        // finished job would count it all again, so a job of more than one
        // chunk looks for its result first. A one-chunk job does not pay
        // that read: a duplicate recounts one chunk and its create-only
        // result write finds the identical result.
        let spans_chunks = spec.end - spec.start > self.config.chunk_size.get();
        if checkpoint.latest().is_none()
            && spans_chunks
            && let Some(done) = self.finished_already(&spec).await
        {
            tracing::info!(job_id = %spec.job_id, primes = done.primes, "already completed by another message; not recomputed");
            return Ok(());
        }
        let cancelled = job.cancellation().clone();
        let interrupted = |saved_cursor| PrimesError::Interrupted {
            job_id: spec.job_id.clone(),
            saved_cursor,
            start: spec.start,
            end: spec.end,
        };

        let end = spec.end;
        let base = Arc::new(
            tokio::task::spawn_blocking(move || BasePrimes::covering(end))
                .await
                .map_err(|e| self.sieve_failed(&spec, &e))?,
        );
        let mut chunks = 0_u64;
        let mut saved = Saved::at(cursor);
        // This delivery's pace, for the time the rest of the job takes.
        let (counting_since, first_cursor) = (Instant::now(), cursor);

        while cursor < spec.end {
            if cancelled.is_cancelled() {
                let progress = SavedProgress { cursor, primes };
                let saved_cursor = self
                    .save_if_new(&mut checkpoint, &mut saved, progress)
                    .await?;
                return Err(interrupted(saved_cursor));
            }
            let chunk_start = cursor;
            let chunk_end = cursor
                .saturating_add(self.config.chunk_size.get())
                .min(spec.end);
            let counted = count_chunk(&base, chunk_start, chunk_end, &cancelled)
                .await
                .map_err(|e| self.sieve_failed(&spec, &e))?;
            let cut_short = counted.reached < chunk_end;
            if counted.reached > chunk_start {
                (cursor, primes) = (counted.reached, primes + counted.primes);
                // With `progress saved`, what the chaos run measures redone
                // work by (the work a delivery did after its last save).
                tracing::debug!(job_id = %spec.job_id, cursor, "chunk counted");
                // A chunk cut short by cancellation is saved as far as it
                // got (while the worker winds down, checkpoint writes are
                // still allowed); the last chunk is not, the result follows.
                let due = match self.config.checkpoint_every {
                    Some(every) => saved.due(every),
                    // The job knows its end: the saves are spread over what
                    // is left rather than one falling just before the end.
                    // A sieve's pace barely changes along a range.
                    None => match time_left(
                        cursor.saturating_sub(first_cursor) as f64,
                        counting_since.elapsed(),
                        spec.end.saturating_sub(cursor) as f64,
                    ) {
                        Some(left) => checkpoint.is_due_before_end(left),
                        None => checkpoint.is_due(),
                    },
                };
                if cut_short || (cursor < spec.end && due) {
                    let progress = SavedProgress { cursor, primes };
                    self.save_if_new(&mut checkpoint, &mut saved, progress)
                        .await?;
                }
                chunks += 1;
                if let Some(hook) = &self.config.on_progress {
                    hook(&Progress {
                        job_id: spec.job_id.clone(),
                        start: spec.start,
                        end: spec.end,
                        chunk_start,
                        cursor,
                        primes,
                    });
                }
            }
            if cut_short {
                return Err(interrupted(saved.cursor));
            }
        }

        let done = PrimesResult::of(&spec, primes);
        if let Err(error) = self.put_result(job, &spec, &done).await {
            // Keep the count for the retry: a result store outage then
            // costs one write, not the whole job again.
            let progress = SavedProgress { cursor, primes };
            if let Err(save_error) = self
                .save_if_new(&mut checkpoint, &mut saved, progress)
                .await
            {
                tracing::warn!(job_id = %spec.job_id, error = %save_error, "the finished count could not be saved either");
            }
            return Err(error);
        }
        // The result is the completion marker: no completed checkpoint is
        // written, and the consumer removes the progress left behind.
        tracing::info!(
            job_id = %spec.job_id,
            primes,
            chunks,
            resumed_from = resumed.cursor,
            "job completed"
        );
        Ok(())
    }

    /// Saves `progress` unless it is saved already; returns the cursor the
    /// next delivery resumes from. A write refused because the message was
    /// released or its lease lost leaves the last saved progress as that.
    async fn save_if_new(
        &self,
        checkpoint: &mut JobCheckpoint,
        saved: &mut Saved,
        progress: SavedProgress,
    ) -> Result<u64, PrimesError> {
        if progress.cursor <= saved.cursor {
            return Ok(saved.cursor);
        }
        match checkpoint.save_progress(progress.to_value()).await {
            Ok(()) => {
                tracing::debug!(cursor = progress.cursor, "progress saved");
                *saved = Saved::at(progress.cursor);
            }
            Err(StorageError::JobCancelled { .. }) => {}
            Err(source) => {
                return Err(PrimesError::Storage {
                    job_id: checkpoint.key().to_owned(),
                    action: "saving progress",
                    source,
                });
            }
        }
        Ok(saved.cursor)
    }

    /// The job's result, if it exists already and is `spec`'s. Only a
    /// shortcut: whatever stops it from answering (an outage, a result that
    /// is not this job's) is left to the create-only result write at the
    /// end, which never overwrites and says what it found.
    async fn finished_already(&self, spec: &PrimesJob) -> Option<PrimesResult> {
        let name = spec.result_name();
        let bytes = match self.results.get(&name).await {
            Ok(stored) => stored?,
            Err(error) => {
                tracing::warn!(job_id = %spec.job_id, result = %name, %error, "could not look for an earlier result; counting");
                return None;
            }
        };
        let value = serde_json::from_slice::<Value>(&bytes).ok()?;
        completed_result(spec, &value).ok()
    }

    /// Writes the result create-only; an identical existing result (from an
    /// earlier attempt or a racing worker) is success. Fenced by the
    /// delivery ([`Job::results`]): refused once its message was released.
    async fn put_result(
        &self,
        job: &Job,
        spec: &PrimesJob,
        done: &PrimesResult,
    ) -> Result<(), PrimesError> {
        let name = spec.result_name();
        let results = job.results(Arc::clone(&self.results));
        match results.put_new(&name, &done.to_bytes()).await {
            Ok(PutOutcome::Created) => Ok(()),
            Ok(PutOutcome::AlreadyExistsIdentical) => {
                tracing::info!(job_id = %spec.job_id, result = %name, "the identical result already existed");
                Ok(())
            }
            Err(StorageError::Conflict { .. }) => {
                let stored = match results.get(&name).await {
                    Ok(Some(bytes)) => {
                        // The result of the same id for another range
                        // says so (a duplicate on its first delivery is
                        // only stopped here).
                        if let Ok(value) = serde_json::from_slice::<Value>(&bytes)
                            && let Err(error @ PrimesError::DifferentJob { .. }) =
                                completed_result(spec, &value)
                        {
                            return Err(error);
                        }
                        String::from_utf8_lossy(&bytes).into_owned()
                    }
                    Ok(None) => "(deleted since)".to_owned(),
                    Err(e) => format!("(could not be read: {e})"),
                };
                Err(PrimesError::DifferentResult {
                    job_id: spec.job_id.clone(),
                    stored,
                })
            }
            Err(source) => Err(PrimesError::Storage {
                job_id: spec.job_id.clone(),
                action: "writing the result",
                source,
            }),
        }
    }

    fn sieve_failed(&self, spec: &PrimesJob, error: &tokio::task::JoinError) -> PrimesError {
        PrimesError::Sieve {
            job_id: spec.job_id.clone(),
            reason: error.to_string(),
        }
    }
}

/// Counts `[lo, hi)` on the blocking pool, stopping early (at a segment
/// boundary, within milliseconds) once `cancelled` fires, so a cancelled job
/// stops burning CPU even if its handler future was dropped meanwhile.
async fn count_chunk(
    base: &Arc<BasePrimes>,
    lo: u64,
    hi: u64,
    cancelled: &CancellationToken,
) -> Result<Counted, tokio::task::JoinError> {
    let (base, cancelled) = (Arc::clone(base), cancelled.clone());
    tokio::task::spawn_blocking(move || base.count(lo, hi, || cancelled.is_cancelled())).await
}

/// Where to start: the saved progress, checked against the job, or the
/// beginning.
fn resume_point(
    spec: &PrimesJob,
    checkpoint: &JobCheckpoint,
) -> Result<SavedProgress, PrimesError> {
    let Some(saved) = checkpoint.progress() else {
        return Ok(SavedProgress {
            cursor: spec.start,
            primes: 0,
        });
    };
    let bad = |reason: String| PrimesError::BadCheckpoint {
        job_id: spec.job_id.clone(),
        reason,
    };
    let progress: SavedProgress = serde_json::from_value(saved.clone()).map_err(|e| {
        bad(format!(
            "progress {saved} is not {{\"cursor\",\"primes\"}}: {e}"
        ))
    })?;
    let in_range = (spec.start..=spec.end).contains(&progress.cursor);
    // More primes than numbers would mean the progress is from another job
    // (`||` keeps the subtraction to cursors inside the range).
    if !in_range || progress.primes > progress.cursor - spec.start {
        return Err(bad(format!(
            "progress {saved} does not fit the range [{}, {})",
            spec.start, spec.end
        )));
    }
    Ok(progress)
}
