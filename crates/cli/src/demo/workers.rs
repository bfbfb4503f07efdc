//! The two workers as tasks, and what they report to the board.

use std::time::Instant;

use spot_worker_consumer::{HandlerError, Job, MessageHandler};
use spot_worker_primes::PrimesHandler;
use spot_worker_runtime::{Readiness, RunReport, WorkerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Who;
use super::board::Tracker;
use super::format::millis;

/// A worker running in a task.
pub(super) struct RunningWorker {
    pub(super) stop: CancellationToken,
    pub(super) task: JoinHandle<Result<RunReport, WorkerError>>,
}

/// Prints when `who` passes its warmup gate and starts taking jobs.
pub(super) async fn announce_ready(
    mut readiness: watch::Receiver<Readiness>,
    tracker: Tracker,
    who: Who,
    since: Instant,
) {
    // An error means the worker stopped before it was ready: nothing to say.
    if readiness.wait_for(Readiness::is_ready).await.is_ok() {
        tracker.say(format!(
            "{who} ready after {}: IMDS watched, storage reachable; taking jobs",
            millis(since.elapsed())
        ));
    }
}

/// Cancels `to` when `from` is cancelled; ends early once `to` is.
pub(super) async fn forward_cancel(from: CancellationToken, to: CancellationToken) {
    tokio::select! {
        () = from.cancelled() => to.cancel(),
        () = to.cancelled() => {}
    }
}

/// The primes job, telling the tracker when a delivery ran to the end.
pub(super) struct Reporting {
    pub(super) job: PrimesHandler,
    pub(super) tracker: Tracker,
}

impl MessageHandler for Reporting {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.job.handle(job).await?;
        self.tracker.finished();
        Ok(())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        self.job.job_key(body)
    }

    fn completion_marker(&self, body: &[u8]) -> Option<spot_worker_consumer::ResultMarker> {
        self.job.completion_marker(body)
    }

    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        self.job.verify_completed(body, result)
    }
}
