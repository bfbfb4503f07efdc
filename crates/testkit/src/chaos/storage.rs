//! The run's storage, as the harness itself sees it: a fresh Azurite, the
//! queue, its poison queue and the results container, read with the
//! harness's own client (never through a worker), to enqueue the workload
//! and to tell when it is all done.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use spot_worker::azure::{AzureQueue, AzureStorage, BlobResultStore, RetryConfig, StorageConfig};
use spot_worker::storage::{MessageQueue as _, PoisonRecord, ResultStore as _};
use spot_worker_decisions::lanes::Lane;
use spot_worker_primes::PrimesJob;

use super::command_jobs::COMMAND_QUEUE;
use super::front::AzuriteFront;
use super::lanes::{REGULAR_QUEUE, deadline_message};
use super::workload::Workload;
use super::{QUEUE, RESULTS};
use crate::Azurite;

/// Azurite and the harness's clients of what the workers use.
pub(super) struct RunStorage {
    /// Shared with the schedule, which stops and starts it (the outage).
    pub(super) azurite: Arc<Mutex<Azurite>>,
    pub(super) queue: AzureQueue,
    /// The regular lane's queue (empty unless the run has lanes).
    pub(super) regular: AzureQueue,
    pub(super) poison: AzureQueue,
    pub(super) results: BlobResultStore,
    /// The `spot-worker run` VMs' queue and its poison queue (empty unless
    /// the run has command jobs).
    pub(super) command: AzureQueue,
    pub(super) command_poison: AzureQueue,
}

/// The messages sent, by id.
pub(super) struct Enqueued {
    /// The job of each valid message.
    pub(super) job_of_message: HashMap<String, usize>,
    /// The long job's message, if the run has one.
    pub(super) long_job_message: Option<String>,
}

/// The storage state the run waits for: every result written, every
/// malformed message poisoned, nothing left in the queue.
pub(super) struct Progress {
    /// Jobs with a result.
    pub(super) done: usize,
    /// The bodies of the poison records (the message as it was enqueued).
    pub(super) poison: Vec<String>,
    pub(super) queued: u64,
}

impl Progress {
    /// Whether the workload is done: every job has a result, at least the
    /// malformed messages are poisoned (the checks say if more were), and
    /// the queue is empty.
    pub(super) fn is_finished(&self, jobs: usize, malformed: usize) -> bool {
        self.done == jobs && self.poison.len() >= malformed && self.queued == 0
    }
}

impl RunStorage {
    /// Starts Azurite and creates the queues and the container.
    pub(super) async fn start() -> Result<RunStorage> {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await?
            .context("starting azurite (run `npm ci --prefix tools/azurite`)")?;
        let connection_string = azurite.connection_string();
        let azurite = Arc::new(Mutex::new(azurite));
        let storage = storage_client(&connection_string)?;
        let queue = storage.queue(QUEUE)?;
        let regular = storage.queue(REGULAR_QUEUE)?;
        let poison = storage.poison_queue(QUEUE)?;
        let results = storage.result_store(RESULTS)?;
        let command = storage.queue(COMMAND_QUEUE)?;
        let command_poison = storage.poison_queue(COMMAND_QUEUE)?;
        command.prepare().await?;
        command_poison.prepare().await?;
        queue.prepare().await?;
        regular.prepare().await?;
        poison.prepare().await?;
        results.prepare().await?;
        Ok(RunStorage {
            azurite,
            queue,
            regular,
            poison,
            results,
            command,
            command_poison,
        })
    }

    /// Sends every message of the workload, in its order.
    pub(super) async fn enqueue(&self, workload: &Workload, long_job: bool) -> Result<Enqueued> {
        let mut job_of_message: HashMap<String, usize> = HashMap::new();
        let mut long_job_message = None;
        for (job, body) in &workload.messages {
            let id = match job {
                Some(job) if workload.deadline_jobs.contains(job) => {
                    let (lane, text) = deadline_message(body)?;
                    let queue = match lane {
                        Lane::Spot => &self.queue,
                        Lane::Regular => &self.regular,
                    };
                    queue.send(&text, Duration::ZERO).await?
                }
                _ => self.queue.send(body, Duration::ZERO).await?,
            };
            if let Some(job) = job {
                job_of_message.insert(id.as_str().to_owned(), *job);
                if *job == 0 && long_job {
                    long_job_message = Some(id.as_str().to_owned());
                }
            }
        }
        Ok(Enqueued {
            job_of_message,
            long_job_message,
        })
    }

    /// Starts the front the workers reach Azurite through (the harness's
    /// own clients go round it), dropping answers to a share `rate` of the
    /// workers' writes, drawn from `seed`.
    pub(super) async fn front(
        &self,
        rate: f64,
        seed: u64,
        started: std::time::Instant,
    ) -> Result<AzuriteFront> {
        let (blob, queue) = {
            let azurite = self.azurite.lock().unwrap();
            (azurite.blob_endpoint(), azurite.queue_endpoint())
        };
        AzuriteFront::start(&blob, &queue, rate, seed, started).await
    }

    /// Resolves once storage shows the workload done (polled: storage has no
    /// notifications), asking only for the results still missing.
    pub(super) async fn wait_until_done(&self, workload: &Workload) {
        let mut done = HashSet::new();
        loop {
            if let Ok(progress) = self.progress(&workload.jobs, &mut done).await
                && progress.is_finished(workload.jobs.len(), workload.malformed.len())
            {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Where storage stands; `done` holds the jobs known to have a result
    /// and is extended.
    pub(super) async fn progress(
        &self,
        jobs: &[PrimesJob],
        done: &mut HashSet<usize>,
    ) -> Result<Progress> {
        for (i, job) in jobs.iter().enumerate() {
            if !done.contains(&i) && self.results.get(&job.result_name()).await?.is_some() {
                done.insert(i);
            }
        }
        let done = done.len();
        let poison = self
            .poison
            .peek(32)
            .await?
            .into_iter()
            .map(|m| match PoisonRecord::from_message_text(&m.body) {
                Ok(PoisonRecord {
                    body: Some(body), ..
                }) => body,
                _ => m.body,
            })
            .collect();
        let queued = self.queue.approximate_message_count().await?
            + self.regular.approximate_message_count().await?;
        Ok(Progress {
            done,
            poison,
            queued,
        })
    }
}

/// The harness's client: short retries, so a read during the Azurite
/// outage fails soon and is simply polled again.
fn storage_client(connection_string: &str) -> Result<AzureStorage> {
    let mut config = StorageConfig::from_connection_string(connection_string)?;
    config.retry = RetryConfig {
        max_retries: 3,
        initial_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(500),
        max_elapsed: Duration::from_secs(5),
    };
    Ok(AzureStorage::new(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_is_done_only_with_every_result_the_poison_and_an_empty_queue() {
        let poison = |n: usize| vec![String::new(); n];
        // (jobs done, poison records, queued, finished) of 10 jobs, 2 malformed
        let table = [
            (10, 2, 0, true),
            // More poison than malformed: done; the checks name the extra.
            (10, 3, 0, true),
            (9, 2, 0, false),
            (10, 1, 0, false),
            (10, 2, 1, false),
        ];
        for (done, poisoned, queued, finished) in table {
            let progress = Progress {
                done,
                poison: poison(poisoned),
                queued,
            };
            assert_eq!(
                progress.is_finished(10, 2),
                finished,
                "{done} {poisoned} {queued}"
            );
        }
    }
}
