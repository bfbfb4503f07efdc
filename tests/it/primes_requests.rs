//! The storage requests the deployed worker's job (`spot-worker-primes`)
//! makes per job, counted rather than timed: the queue through the
//! testkit's recording `FaultyQueue`, the checkpoint store through
//! `CountingStore`, the result store through `CountingResults`. The
//! protocol minimum for a one-chunk job is its share of a receive (one per
//! `slots` jobs), its delete and one create-only result write; issue 16
//! item 8 asks for at most 1.1 times that.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use spot_worker::runtime::{Worker, WorkerConfig};
use spot_worker::storage::{
    ConsumerStats, InMemoryCheckpointStore, InMemoryQueue, InMemoryResultStore, MessageQueue,
    ResultStore,
};
use spot_worker_primes::{PrimesConfig, PrimesJob, expected_result, handler};
use spot_worker_storage::{FleetLedger, LifetimeLog};
use spot_worker_testkit::counting::{CountingResults, CountingStore};
use spot_worker_testkit::faulty::FaultyQueue;

/// Upper bound of every run: generous for a slow debug build, yet bounded.
const LIMIT: Duration = Duration::from_secs(60);

/// The deployed example's shape in the count: one worker, 2 slots.
const SLOTS: u8 = 2;

struct Counted {
    queue: FaultyQueue<InMemoryQueue>,
    checkpoints: CountingStore<InMemoryCheckpointStore>,
    results: CountingResults<InMemoryResultStore>,
}

impl Counted {
    fn new() -> Self {
        Counted {
            queue: FaultyQueue::new(InMemoryQueue::new("jobs")),
            checkpoints: CountingStore::new(InMemoryCheckpointStore::new()),
            results: CountingResults::new(InMemoryResultStore::new("results")),
        }
    }

    async fn send(&self, job: &PrimesJob) {
        self.queue
            .send(&job.to_message(), Duration::ZERO)
            .await
            .unwrap();
    }

    /// Runs the primes handler as the deployed worker does (a `Worker`, its
    /// handler wrapped for metrics, 2 slots) until the queue has deleted
    /// `deletes` messages in all (this run and earlier ones).
    async fn run(&self, config: PrimesConfig, deletes: usize) -> ConsumerStats {
        let mut worker_config = WorkerConfig {
            queue: "jobs".to_owned(),
            concurrency: usize::from(SLOTS),
            health_addr: "127.0.0.1:0".parse().unwrap(),
            ..WorkerConfig::default()
        };
        worker_config.imds.enabled = false; // not an Azure VM
        worker_config.drain.handle_signals = false;
        worker_config.drain.watchdog = false;
        let worker = Worker::new(
            worker_config,
            Arc::new(self.queue.clone()),
            Arc::new(InMemoryQueue::new("jobs-poison")),
        )
        .with_checkpoints(Arc::new(self.checkpoints.clone()));
        let stop = worker.shutdown_token();
        let results: Arc<dyn ResultStore> = Arc::new(self.results.clone());
        let task = tokio::spawn(worker.run(handler(results, config)));
        // The queue's record of deletes says when the jobs are settled.
        let faults = Arc::clone(self.queue.faults());
        tokio::time::timeout(LIMIT, faults.deleted(deletes))
            .await
            .expect("the jobs are handled in time");
        stop.cancel();
        let report = tokio::time::timeout(LIMIT, task)
            .await
            .expect("the worker stops in time")
            .unwrap()
            .unwrap();
        report.stats
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_chunk_primes_job_costs_at_most_1_1_times_the_protocol_minimum() {
    const JOBS: u64 = 200;
    let counted = Counted::new();
    let jobs: Vec<PrimesJob> = (0..JOBS)
        .map(|i| PrimesJob::new(format!("j{i}"), 0, 1_000 + i).unwrap())
        .collect();
    for job in &jobs {
        counted.send(job).await;
    }
    let stats = counted.run(PrimesConfig::default(), JOBS as usize).await;
    assert_eq!(stats.succeeded, JOBS, "{stats:?}");

    let (receives, updates, deletes, _) = counted.queue.faults().calls();
    let checkpoints = counted.checkpoints.calls();
    let results = counted.results.calls();
    let total = receives as u64
        + u64::from(updates)
        + u64::from(deletes)
        + checkpoints.reads()
        + checkpoints.writes()
        + checkpoints.deletes()
        + results.puts()
        + results.gets();
    let per_job = total as f64 / JOBS as f64;
    let minimum = 1.0 / f64::from(SLOTS) + 1.0 + 1.0;
    let counts = format!(
        "receives {receives}, updates {updates}, deletes {deletes}, checkpoint reads {}, \
         writes {}, deletes {}, result puts {}, gets {}: {per_job:.3} per job",
        checkpoints.reads(),
        checkpoints.writes(),
        checkpoints.deletes(),
        results.puts(),
        results.gets()
    );
    eprintln!("{counts}");
    assert!(per_job <= 1.1 * minimum, "{counts}");
    // Apart from the jobs' requests, the fleet's interruption counts: read
    // as the gate opens, added to (a read and a write) as the worker stops;
    // and one listing of the workers' lifetime records, the retention pass
    // each worker makes once, after its own record is first written
    // (nothing there is old enough to read or delete). That pass runs
    // beside the jobs and is given up if the worker stops first, so a
    // machine slow enough to finish every job before it may not list.
    assert!(
        (3..=4).contains(&checkpoints.fleet()),
        "fleet requests {}: {counts}",
        checkpoints.fleet()
    );
    // What is left per job: one create-only result, the delete; no
    // checkpoint request at all (nothing read before a first delivery, no
    // completed checkpoint written, so none to remove). The only other
    // writes are the worker's own lifetime record for the fleet's bill,
    // written as it becomes ready and as it exits: per worker, not per job.
    assert_eq!(
        (
            u64::from(deletes),
            results.puts(),
            checkpoints.reads() + checkpoints.writes()
        ),
        (JOBS, JOBS, 2),
        "{counts}"
    );
    only_the_fleets_records_are_left(&counted, 1);
    for job in &jobs {
        let stored = counted.results.inner().get(&job.result_name()).await;
        let stored: serde_json::Value = serde_json::from_slice(&stored.unwrap().unwrap()).unwrap();
        assert_eq!(stored, expected_result(job));
    }
}

/// Skipping the read before a first delivery keeps the invariants: a
/// duplicate of a finished job is not counted again and overwrites nothing,
/// and the finished job leaves no checkpoint behind.
/// Nothing is left in the checkpoint store but the fleet's interruption
/// counts (written per worker-hour, not per job) and the lifetime record
/// of each of the `workers` that ran (one per worker, for the bill).
fn only_the_fleets_records_are_left(counted: &Counted, workers: usize) {
    let left = counted.checkpoints.inner();
    let keys = left.keys();
    let lifetimes = keys
        .iter()
        .filter(|key| key.starts_with(LifetimeLog::PREFIX))
        .count();
    assert_eq!((keys.len(), lifetimes), (1 + workers, workers), "{keys:?}");
    assert!(left.get(&FleetLedger::key_of("jobs")).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_finished_long_job_reads_its_result_and_recounts_nothing() {
    let counted = Counted::new();
    let job = PrimesJob::new("long", 0, 50_000).unwrap();
    let chunks = Arc::new(AtomicUsize::new(0));
    let config = || {
        let chunks = Arc::clone(&chunks);
        PrimesConfig::default()
            .with_chunk_size(NonZeroU64::new(10_000).unwrap())
            .with_checkpoint_every(Duration::ZERO)
            .with_progress(move |_| {
                chunks.fetch_add(1, Ordering::SeqCst);
            })
    };
    counted.send(&job).await;
    counted.run(config(), 1).await;
    assert_eq!(chunks.load(Ordering::SeqCst), 5);
    // Progress was saved after every chunk but the last, then removed.
    only_the_fleets_records_are_left(&counted, 1);
    assert_eq!(counted.checkpoints.calls().deletes(), 1);
    let before = counted.results.inner().get("long.json").await.unwrap();

    counted.send(&job).await;
    let stats = counted.run(config(), 2).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    assert_eq!(chunks.load(Ordering::SeqCst), 5, "nothing counted again");
    assert_eq!(counted.results.calls().puts(), 1, "nothing written again");
    assert_eq!(
        counted.results.inner().get("long.json").await.unwrap(),
        before
    );
    only_the_fleets_records_are_left(&counted, 2);
}
