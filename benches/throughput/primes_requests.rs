//! The deployed worker's storage requests per job: a [`Worker`] of 2 slots
//! running the `primes` job (`examples/primes.rs`'s handler and settings)
//! on N one-chunk jobs from Azurite, every request counted by kind by the
//! testkit's doubles around the queue, the checkpoint store and the result
//! store, against the fewest the protocol allows (a share of a receive, the
//! delete, one create-only result write).

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use spot_worker::runtime::Worker;
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::{PrimesConfig, PrimesJob};
use spot_worker_testkit::counting::{CountingResults, CountingStore};
use spot_worker_testkit::faulty::FaultyQueue;

use crate::requests::Requests;
use crate::setup::{Bench, all_deleted, bounded, worker_config};
use crate::{Options, PATIENCE};

/// Slots of the worker, as in issue 16's count of the deployed example.
pub const SLOTS: u8 = 2;

/// What one run asked of storage.
pub struct PrimesRequests {
    pub jobs: u64,
    /// Queue and checkpoint requests, with the result store's writes
    /// counted as creates and its reads as blob reads.
    pub requests: Requests,
    /// Result writes and reads alone.
    pub result_puts: u64,
    pub result_gets: u64,
}

impl Bench {
    /// Drains `options.primes_jobs` one-chunk primes jobs with one worker.
    pub async fn primes_requests(&self, options: &Options) -> Result<PrimesRequests> {
        let site = &self.site;
        let queues = site.queues("primes-requests").await?;
        let jobs = options.primes_jobs;
        bounded("sending the primes jobs", async {
            for i in 0..jobs {
                let job = PrimesJob::new(format!("j{i}"), 0, 1_000 + i as u64)?;
                queues
                    .queue
                    .send(&job.to_message(), std::time::Duration::ZERO)
                    .await?;
            }
            Ok(())
        })
        .await?;
        let checkpoints = site
            .storage
            .checkpoint_store(&format!("ckpt-{}", queues.name))?;
        checkpoints.prepare().await?;
        let results = site.storage.result_store(&format!("res-{}", queues.name))?;
        results.prepare().await?;
        let (checkpoints, results) = (
            CountingStore::new(checkpoints),
            CountingResults::new(results),
        );
        let queue = FaultyQueue::new(queues.queue);
        let calls = Arc::clone(queue.faults());
        let mut config = worker_config(&queues.name);
        config.concurrency = usize::from(SLOTS);
        let worker = Worker::new(config, Arc::new(queue), Arc::new(queues.poison))
            .with_checkpoints(Arc::new(checkpoints.clone()));
        let stop = worker.shutdown_token();
        let result_store: Arc<dyn ResultStore> = Arc::new(results.clone());
        let running = tokio::spawn(worker.run(spot_worker_primes::handler(
            result_store,
            PrimesConfig::default(),
        )));
        all_deleted(&calls, jobs).await?;
        stop.cancel();
        let report = tokio::time::timeout(PATIENCE, running)
            .await
            .context("the worker did not stop")???;
        ensure!(
            report.stats.succeeded == jobs as u64,
            "the worker handled {} of {jobs} jobs",
            report.stats.succeeded
        );
        let mut requests = Requests::of(&calls, Some(checkpoints.calls()));
        let (puts, gets) = (results.calls().puts(), results.calls().gets());
        requests.create += puts as f64;
        requests.blob_read += gets as f64;
        Ok(PrimesRequests {
            jobs: jobs as u64,
            requests,
            result_puts: puts,
            result_gets: gets,
        })
    }
}

/// The table: requests per job by kind, against the minimum.
pub fn print_primes_requests(run: &PrimesRequests) {
    let per_job = run.requests.per(run.jobs);
    let minimum = Requests::minimum(SLOTS, true, 0);
    println!(
        "## The deployed worker (`primes`), {} one-chunk jobs, one worker of {SLOTS} slots: storage requests per job
",
        run.jobs
    );
    println!("{}", Requests::HEADER);
    println!("{}", per_job.row("spot-worker `primes`"));
    println!(
        "{}",
        minimum.row("protocol minimum (receive / slots, delete, one create-only result)")
    );
    println!(
        "\nresult writes {} and reads {} in all ({:.3} and {:.3} per job, in `create` and `blob read`); {:.2} × the minimum (goal ≤ 1.1)\n",
        run.result_puts,
        run.result_gets,
        run.result_puts as f64 / run.jobs as f64,
        run.result_gets as f64 / run.jobs as f64,
        per_job.total() / minimum.total()
    );
}
