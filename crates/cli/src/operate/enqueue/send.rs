//! Sending one job line: skip a job already done (`--skip-existing`), route
//! it to its lane's queue, send it, and say what became of it; a missing
//! queue stops the run.

use std::sync::Mutex;

use anyhow::{Context as _, Result};
use spot_worker_azure::{BlobCheckpointStore, BlobResultStore};
use spot_worker_decisions::lanes::Lane;
use spot_worker_storage::{
    CheckpointStore as _, MessageQueue as _, ResultStore as _, StorageError,
};

use super::lanes::Routing;

/// What became of one job line.
pub(super) enum Outcome {
    /// Sent to `lane`'s queue; `late`: its work no longer fits before its
    /// deadline.
    Sent {
        lane: Lane,
        late: bool,
    },
    Skipped,
    Failed(String),
}

/// What is checked before a job is sent again.
pub(super) struct Existing {
    pub(super) checkpoints: BlobCheckpointStore,
    pub(super) results: Option<(BlobResultStore, String)>,
}

impl Existing {
    /// True if job `job_id` is done: a completed checkpoint or a result.
    pub(super) async fn is_done(&self, job_id: &str) -> Result<bool> {
        let checkpoint = self
            .checkpoints
            .read(job_id)
            .await
            .with_context(|| format!("reading the checkpoint of job {job_id:?}"))?;
        if checkpoint.is_some_and(|stored| stored.checkpoint.is_completed()) {
            return Ok(true);
        }
        let Some((results, template)) = &self.results else {
            return Ok(false);
        };
        let name = template.replace("{job_id}", job_id);
        let result = results
            .get(&name)
            .await
            .with_context(|| format!("reading result {name:?}"))?;
        Ok(result.is_some())
    }
}

/// Everything a send task needs.
pub(super) struct Sender {
    pub(super) routing: Routing,
    pub(super) existing: Option<Existing>,
    /// Set once a send found a queue missing: nothing more is read.
    pub(super) queue_missing: Mutex<Option<String>>,
}

impl Sender {
    pub(super) async fn send(&self, text: String, job_id: Option<String>) -> Outcome {
        if let (Some(existing), Some(job_id)) = (&self.existing, &job_id) {
            match existing.is_done(job_id).await {
                Ok(true) => return Outcome::Skipped,
                Ok(false) => {}
                Err(e) => return Outcome::Failed(format!("{e:#}")),
            }
        }
        let routed = match self.routing.route(text.as_bytes()) {
            Ok(routed) => routed,
            Err(e) => return Outcome::Failed(format!("not sent: {e:#}")),
        };
        let sent = routed
            .queue
            .send_to_existing(&routed.text, std::time::Duration::ZERO)
            .await;
        match sent {
            Ok(_) => Outcome::Sent {
                lane: routed.lane,
                late: routed.late,
            },
            Err(StorageError::NotFound { .. }) => {
                let missing = missing_queue(routed.queue.name());
                *lock(&self.queue_missing) = Some(missing.clone());
                Outcome::Failed(format!("not sent: {missing}"))
            }
            Err(e) => Outcome::Failed(format!("not sent: {e}")),
        }
    }

    pub(super) fn queue_missing(&self) -> Option<String> {
        lock(&self.queue_missing).clone()
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why nothing more is sent once the queue turned out to be missing.
pub(super) fn missing_queue(name: &str) -> String {
    format!(
        "queue {name:?} does not exist; enqueue never creates it (the deployment does, \
         or a worker at its start): check SPOT_WORKER_QUEUE"
    )
}
