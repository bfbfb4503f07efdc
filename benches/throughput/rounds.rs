//! Parts 1 and 2, the throughput rounds: the same pre-filled backlog
//! drained by each loop (the worker, with and without checkpoints, the
//! plain SDK loop, the Python SDK loops), round after round, with the CPU
//! each run cost Azurite and the client, and the storage requests it made.
//! The worker with and without checkpoints also runs against an Azurite
//! whose blob and queue services are separate processes, as Azure's front
//! ends are: in one process a checkpoint's blob requests take CPU from the
//! queue requests.
//! Also the long jobs whose leases are renewed. The tables are printed by
//! `rounds_report.rs` and `requests.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use spot_worker::runtime::Worker;
use spot_worker::storage::{CheckpointStore, HandlerError, Job, MessageQueue, handler_fn};
use spot_worker_testkit::Topology;
use spot_worker_testkit::bench::python_dir;
use spot_worker_testkit::counting::CountingStore;
use spot_worker_testkit::faulty::FaultyQueue;
use tokio::process::Command;
use tokio::time::Instant;

use crate::requests::Requests;
use crate::setup::{
    AzuriteCpu, Bench, Queues, Site, all_deleted, bounded, drain_time, worker_config,
};
use crate::{BATCH, Options, PATIENCE, VISIBILITY};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loop {
    SpotWorker,
    SpotWorkerCheckpoints,
    /// The two above, on an Azurite with blob and queue in separate
    /// processes.
    SpotWorkerSeparate,
    SpotWorkerCheckpointsSeparate,
    RawRust,
    PythonSequential,
    PythonThreads,
}

impl Loop {
    pub fn label(self) -> &'static str {
        match self {
            Loop::SpotWorker => "spot-worker `Worker` (leases, no checkpoints)",
            Loop::SpotWorkerCheckpoints => "spot-worker `Worker`, 1 checkpoint write per message",
            Loop::SpotWorkerSeparate => "spot-worker `Worker`, separate blob and queue processes",
            Loop::SpotWorkerCheckpointsSeparate => {
                "spot-worker `Worker`, 1 checkpoint write per message, separate blob and queue processes"
            }
            Loop::RawRust => "raw Rust loop (`AzureQueue`: receive 32, 32 concurrent deletes)",
            Loop::PythonSequential => "Python SDK loop, sequential deletes",
            Loop::PythonThreads => "Python SDK loop, 32 delete threads",
        }
    }
}

/// One drained backlog.
#[derive(Clone)]
pub struct Drained {
    pub elapsed: Duration,
    pub messages: u64,
    pub receives: u64,
    /// Every storage request of the run, by kind.
    pub requests: Requests,
    /// CPU seconds over the run: Azurite's (each process), and the
    /// client's (this process for the Rust loops, the Python process for
    /// Python).
    pub azurite_cpu: AzuriteCpu,
    pub client_cpu: Duration,
    /// Wall time the CPU figures cover (a little more than `elapsed` for
    /// the worker, whose warm-up gate is in it).
    pub cpu_window: Duration,
}

impl Drained {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

pub type Rounds = Vec<HashMap<Loop, Drained>>;

/// What the worker's handler does with each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Nothing: the queue path alone.
    Trivial,
    /// Reads its checkpoint and writes it once.
    Checkpoint,
    /// Runs for `duration` under leases of `visibility`, renewed as it goes.
    Long {
        duration: Duration,
        visibility: Duration,
    },
}

impl Bench {
    pub async fn throughput(&self, options: &Options) -> Result<Rounds> {
        let separate = Site::start(Topology::Separate).await?;
        eprintln!("checkpoint cost, second topology: {}", separate.describe());
        let mut loops = vec![
            Loop::SpotWorker,
            Loop::RawRust,
            Loop::SpotWorkerCheckpoints,
            Loop::SpotWorkerSeparate,
            Loop::SpotWorkerCheckpointsSeparate,
        ];
        if self.python.is_some() {
            loops.extend([Loop::PythonThreads, Loop::PythonSequential]);
        }
        let mut rounds = Vec::new();
        for round in 0..options.rounds {
            let mut results = HashMap::new();
            // Rotate the order so no loop always runs first (or after the
            // slowest).
            for i in 0..loops.len() {
                let which = loops[(i + round) % loops.len()];
                let drained = self.drain(which, &separate, options.messages).await?;
                eprintln!(
                    "round {}: {:<45} {:>8.0} msg/s",
                    round + 1,
                    format!("{which:?}"),
                    drained.rate()
                );
                results.insert(which, drained);
            }
            rounds.push(results);
        }
        Ok(rounds)
    }

    /// Jobs that outlive their lease several times: what renewals cost.
    pub async fn long_jobs(&self, options: &Options) -> Result<Drained> {
        let queues = self.site.filled("long", options.long_jobs).await?;
        let work = Work::Long {
            duration: options.long_job,
            visibility: options.long_visibility,
        };
        let drained = drain_worker(&self.site, queues, options.long_jobs, work).await?;
        eprintln!(
            "long jobs: {} of {:?} under a {:?} lease: {:.2} updates per job",
            options.long_jobs,
            options.long_job,
            options.long_visibility,
            drained.requests.update / options.long_jobs as f64
        );
        Ok(drained)
    }

    async fn drain(&self, which: Loop, separate: &Site, count: usize) -> Result<Drained> {
        let site = match which {
            Loop::SpotWorkerSeparate | Loop::SpotWorkerCheckpointsSeparate => separate,
            _ => &self.site,
        };
        let queues = site.filled("tput", count).await?;
        match which {
            Loop::SpotWorker | Loop::SpotWorkerSeparate => {
                drain_worker(site, queues, count, Work::Trivial).await
            }
            Loop::SpotWorkerCheckpoints | Loop::SpotWorkerCheckpointsSeparate => {
                drain_worker(site, queues, count, Work::Checkpoint).await
            }
            Loop::RawRust => self.drain_raw(queues, count).await,
            Loop::PythonSequential => self.drain_python(queues, count, "sequential").await,
            Loop::PythonThreads => self.drain_python(queues, count, "threads").await,
        }
    }

    /// What a user writes without a framework: receive 32, handle, delete
    /// all 32 concurrently, repeat; the same SDK client as the worker.
    async fn drain_raw(&self, queues: Queues, count: usize) -> Result<Drained> {
        let queue = queues.queue;
        let before = self.site.cpu()?;
        let started = Instant::now();
        let mut deleted = 0;
        let mut receives = 0;
        bounded("the raw loop", async {
            while deleted < count {
                let batch = queue.receive(BATCH, VISIBILITY).await?;
                receives += 1;
                let deletes = batch
                    .iter()
                    .map(|message| queue.delete(&message.id, &message.pop_receipt));
                for result in futures_util::future::join_all(deletes).await {
                    result?;
                }
                deleted += batch.len();
            }
            Ok(())
        })
        .await?;
        let elapsed = started.elapsed();
        let after = self.site.cpu()?;
        Ok(Drained {
            elapsed,
            messages: deleted as u64,
            receives,
            requests: Requests {
                receive: receives as f64,
                delete: deleted as f64,
                ..Requests::default()
            },
            azurite_cpu: after.azurite.since(&before.azurite),
            client_cpu: after.this - before.this,
            cpu_window: elapsed,
        })
    }

    async fn drain_python(&self, queues: Queues, count: usize, mode: &str) -> Result<Drained> {
        let interpreter = self.python.as_ref().context("no Python")?;
        let mut command = Command::new(interpreter);
        command
            .arg(python_dir().join("bench_loop.py"))
            .arg(&queues.name)
            .arg(count.to_string())
            .arg(mode)
            .arg(PATIENCE.as_secs().to_string())
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                self.site.azurite.connection_string(),
            )
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .kill_on_drop(true);
        let before = self.site.cpu()?;
        let started = Instant::now();
        let output = tokio::time::timeout(PATIENCE + Duration::from_secs(10), command.output())
            .await
            .context("bench_loop.py did not finish")??;
        let window = started.elapsed();
        let after = self.site.cpu()?;
        ensure!(
            output.status.success(),
            "bench_loop.py {mode} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .context("bench_loop.py prints one JSON object")?;
        let number = |key: &str| {
            report[key]
                .as_f64()
                .with_context(|| format!("`{key}` in {report}"))
        };
        let elapsed = Duration::from_secs_f64(number("seconds")?);
        // One delete per message; the SDK adds nothing else.
        let requests = Requests {
            receive: number("receives")?,
            delete: number("deleted")?,
            ..Requests::default()
        };
        Ok(Drained {
            elapsed,
            messages: number("deleted")? as u64,
            receives: number("receives")? as u64,
            requests,
            azurite_cpu: after.azurite.since(&before.azurite),
            client_cpu: Duration::from_secs_f64(number("cpu_seconds")?),
            // Azurite's CPU is read around the whole process (interpreter
            // start-up included, when Azurite idles).
            cpu_window: window,
        })
    }
}

/// The worker drains `count` messages from `queues` on `site`, its handler
/// doing `work`.
async fn drain_worker(site: &Site, queues: Queues, count: usize, work: Work) -> Result<Drained> {
    let queue = FaultyQueue::new(queues.queue);
    let calls = Arc::clone(queue.faults());
    let mut config = worker_config(&queues.name);
    if let Work::Long { visibility, .. } = work {
        config.visibility_timeout = visibility;
    }
    let mut worker = Worker::new(config, Arc::new(queue), Arc::new(queues.poison));
    let mut store_calls = None;
    if work == Work::Checkpoint {
        let store = site
            .storage
            .checkpoint_store(&format!("ckpt-{}", queues.name))?;
        store.prepare().await?;
        let store = CountingStore::new(store);
        store_calls = Some(Arc::clone(store.calls()));
        worker = worker.with_checkpoints(Arc::new(store));
    }
    let stop = worker.shutdown_token();
    let before = site.cpu()?;
    let started = Instant::now();
    let running = match work {
        Work::Checkpoint => tokio::spawn(worker.run(handler_fn(|job: Job| async move {
            let mut checkpoint = job.checkpoint().await?;
            checkpoint.save_progress(json!({ "done": 1 })).await?;
            Ok::<(), HandlerError>(())
        }))),
        Work::Trivial => {
            tokio::spawn(worker.run(handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) })))
        }
        // The job's own duration: simulated work, not a wait for anything.
        Work::Long { duration, .. } => {
            tokio::spawn(worker.run(handler_fn(move |_job: Job| async move {
                tokio::time::sleep(duration).await;
                Ok::<(), HandlerError>(())
            })))
        }
    };
    all_deleted(&calls, count).await?;
    let after = site.cpu()?;
    let cpu_window = started.elapsed();
    stop.cancel();
    let report = tokio::time::timeout(PATIENCE, running)
        .await
        .context("the worker did not stop")???;
    ensure!(
        report.stats.succeeded == count as u64,
        "the worker handled {} of {count} messages",
        report.stats.succeeded
    );
    Ok(Drained {
        elapsed: drain_time(&calls, count)?,
        messages: count as u64,
        receives: calls.calls().0 as u64,
        requests: Requests::of(&calls, store_calls.as_deref()),
        azurite_cpu: after.azurite.since(&before.azurite),
        client_cpu: after.this - before.this,
        cpu_window,
    })
}
