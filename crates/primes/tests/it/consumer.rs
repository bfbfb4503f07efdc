//! The primes job under the storage crate's real `Consumer`, on the
//! in-memory queue, checkpoint and result stores: correct counts whatever
//! the chunking, resume after an interruption without redoing work, no
//! recomputation of a completed job, create-only results, and clear errors.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{
    Consumer, ConsumerConfig, ConsumerStats, DrainSignals, Job, MessageHandler, PoisonRecord,
    handler_fn,
};
use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource};
use spot_worker_primes::{
    PrimesConfig, PrimesJob, Progress, count_primes, expected_result, handler,
};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryCheckpointStore, InMemoryQueue, InMemoryResultStore,
    MessageQueue, ResultStore, WritePrecondition,
};

/// Upper bound of every run: generous for a slow debug build, yet bounded.
const LIMIT: Duration = Duration::from_secs(60);

struct Stores {
    queue: InMemoryQueue,
    poison: InMemoryQueue,
    checkpoints: InMemoryCheckpointStore,
    results: InMemoryResultStore,
    /// The worker's checkpoint interval, which the handler follows unless
    /// its config fixes one.
    cadence: Arc<CheckpointCadence>,
}

impl Stores {
    fn new() -> Self {
        Stores {
            queue: InMemoryQueue::new("jobs"),
            poison: InMemoryQueue::new("jobs-poison"),
            checkpoints: InMemoryCheckpointStore::new(),
            results: InMemoryResultStore::new("results"),
            cadence: Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
                seed_evictions_per_hour: 0.05,
            })),
        }
    }

    async fn send(&self, job: &PrimesJob) {
        self.queue
            .send(&job.to_message(), Duration::ZERO)
            .await
            .unwrap();
    }

    async fn result(&self, job: &PrimesJob) -> Option<String> {
        let bytes = self.results.get(&job.result_name()).await.unwrap()?;
        Some(String::from_utf8(bytes).unwrap())
    }

    /// Runs a fresh consumer with the primes handler until `stop_after`
    /// handler calls have returned (or `signals` fire), and returns its
    /// statistics and the handler errors it saw.
    async fn run(
        &self,
        config: PrimesConfig,
        signals: DrainSignals,
        stop_after: usize,
        max_failures: u32,
    ) -> (ConsumerStats, Vec<String>) {
        let consumer_config = ConsumerConfig {
            idle_backoff_floor: Duration::from_millis(5),
            idle_backoff_max: Duration::from_millis(20),
            retry_backoff_base: Duration::from_millis(10),
            retry_backoff_max: Duration::from_millis(10),
            max_failures,
            ..ConsumerConfig::default()
        };
        let consumer = Consumer::new(
            Arc::new(self.queue.clone()),
            Arc::new(self.poison.clone()),
            consumer_config,
        )
        .unwrap()
        .with_checkpoints(Arc::new(self.checkpoints.clone()))
        .with_cadence(Arc::clone(&self.cadence));
        let inner = Arc::new(handler(Arc::new(self.results.clone()), config));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let returned = Arc::new(AtomicUsize::new(0));
        let stop = signals.clone();
        let recorded = Arc::clone(&errors);
        let wrapper = handler_fn(move |job: Job| {
            let (inner, errors, returned, stop) = (
                Arc::clone(&inner),
                Arc::clone(&recorded),
                Arc::clone(&returned),
                stop.clone(),
            );
            async move {
                let result = inner.handle(job).await;
                if let Err(error) = &result {
                    errors.lock().unwrap().push(error.to_string());
                }
                if returned.fetch_add(1, Ordering::SeqCst) + 1 >= stop_after {
                    stop.stop_receiving();
                }
                result
            }
        });
        let stats = tokio::time::timeout(LIMIT, consumer.run_until(wrapper, signals))
            .await
            .expect("the consumer stops in time");
        let errors = errors.lock().unwrap().clone();
        (stats, errors)
    }
}

/// A config whose progress hook records every chunk.
fn recording(chunk_size: u64) -> (PrimesConfig, Arc<Mutex<Vec<Progress>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let config = PrimesConfig::default()
        .with_chunk_size(NonZeroU64::new(chunk_size).unwrap())
        .with_progress(move |progress| sink.lock().unwrap().push(progress.clone()));
    (config, seen)
}

fn result_text(job: &PrimesJob, primes: u64) -> String {
    format!(
        r#"{{"job_id":"{}","start":{},"end":{},"primes":{primes}}}"#,
        job.job_id, job.start, job.end
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_right_whatever_the_chunking() {
    // (job, chunk size, known count)
    let cases = [
        (
            PrimesJob::new("pi-1e6", 0, 1_000_000).unwrap(),
            100_000,
            78_498,
        ),
        (
            PrimesJob::new("pi-1e7", 0, 10_000_000).unwrap(),
            1_000_000,
            664_579,
        ),
        (PrimesJob::new("below-2", 0, 2).unwrap(), 1_000, 0),
        (PrimesJob::new("just-2", 2, 3).unwrap(), 1_000, 1),
        (PrimesJob::new("empty", 5, 5).unwrap(), 1_000, 0),
        // Chunk boundaries on primes: 7, 14, 21, … and 7 + 13k.
        (PrimesJob::new("step-7", 0, 5_000).unwrap(), 7, 669),
        (PrimesJob::new("from-7", 7, 5_000).unwrap(), 13, 669 - 3),
        // One number per chunk.
        (PrimesJob::new("unit", 90, 110).unwrap(), 1, 5),
    ];
    for (job, chunk, known) in cases {
        let stores = Stores::new();
        stores.send(&job).await;
        let (config, seen) = recording(chunk);
        let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
        assert!(errors.is_empty(), "{}: {errors:?}", job.job_id);
        assert_eq!(stats.succeeded, 1, "{}", job.job_id);
        assert_eq!(count_primes(job.start, job.end), known, "{}", job.job_id);
        assert_eq!(
            stores.result(&job).await.as_deref(),
            Some(result_text(&job, known).as_str()),
            "{}",
            job.job_id
        );
        assert_eq!(
            expected_result(&job),
            json!({"job_id": job.job_id, "start": job.start, "end": job.end, "primes": known})
        );
        // The result marks the job completed; its progress is removed.
        assert_eq!(stores.checkpoints.get(&job.job_id), None, "{}", job.job_id);
        let seen = seen.lock().unwrap();
        let chunks = (job.end - job.start).div_ceil(chunk);
        assert_eq!(seen.len() as u64, chunks, "{}", job.job_id);
        if let Some(last) = seen.last() {
            assert_eq!((last.cursor, last.primes), (job.end, known));
            assert_eq!(last.fraction(), 1.0);
        }
        assert!(stores.queue.is_empty() && stores.poison.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_job_resumes_from_its_checkpoint_without_redoing_work() {
    let stores = Stores::new();
    let job = PrimesJob::new("j1", 0, 200_000).unwrap();
    let chunk = 10_000;
    let total_chunks = 20;
    stores.send(&job).await;

    // First worker: winds down (as on an eviction notice) right after the
    // fifth chunk's checkpoint.
    let signals = DrainSignals::default();
    let wind_down = signals.clone();
    let first_chunks = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&first_chunks);
    let config = PrimesConfig::default()
        .with_chunk_size(NonZeroU64::new(chunk).unwrap())
        .with_progress(move |progress: &Progress| {
            let mut chunks = sink.lock().unwrap();
            chunks.push(progress.chunk_start);
            if chunks.len() == 5 {
                wind_down.wind_down(None);
            }
        });
    let (stats, errors) = stores.run(config, signals, usize::MAX, 5).await;
    assert_eq!(stats.released, 1, "{stats:?}");
    assert_eq!((stats.succeeded, stats.retried, stats.poisoned), (0, 0, 0));
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].contains("job j1 interrupted")
            && errors[0].contains("checkpointed at 50000 of [0, 200000)"),
        "{}",
        errors[0]
    );
    assert_eq!(
        *first_chunks.lock().unwrap(),
        [0, 10_000, 20_000, 30_000, 40_000]
    );
    assert_eq!(
        stores.checkpoints.get("j1"),
        Some(Checkpoint::InProgress {
            progress: json!({"cursor": 50_000, "primes": count_primes(0, 50_000)})
        })
    );
    assert!(
        stores.results.is_empty(),
        "no result from an interrupted run"
    );
    let released = stores.queue.messages();
    assert!(released.len() == 1 && released[0].visible, "{released:?}");

    // Second worker: picks the message up again and resumes at 50 000.
    let (config, second_chunks) = recording(chunk);
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(stats.succeeded, 1);
    let second: Vec<u64> = second_chunks
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.chunk_start)
        .collect();
    assert_eq!(second.first(), Some(&50_000));
    // Nothing redone: together the two runs computed each chunk once,
    // where a restart from scratch would have computed 5 + 20.
    assert_eq!(
        first_chunks.lock().unwrap().len() + second.len(),
        total_chunks
    );

    // The same result as an uninterrupted run.
    let uninterrupted = Stores::new();
    uninterrupted.send(&job).await;
    let (config, _) = recording(chunk);
    uninterrupted
        .run(config, DrainSignals::default(), 1, 5)
        .await;
    let resumed = stores.result(&job).await.unwrap();
    assert_eq!(Some(resumed.clone()), uninterrupted.result(&job).await);
    assert_eq!(resumed, result_text(&job, count_primes(0, 200_000)));
    assert!(stores.queue.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_mid_chunk_saves_how_far_it_got() {
    let stores = Stores::new();
    // Both jobs are one chunk each. The short one finishes first and its
    // progress report starts the wind-down while the long one is still
    // counting its chunk.
    let short = PrimesJob::new("short", 0, 1_000_000).unwrap();
    let long = PrimesJob::new("long", 0, 30_000_000).unwrap();
    stores.send(&short).await;
    stores.send(&long).await;
    let chunk = NonZeroU64::new(100_000_000).unwrap();
    let signals = DrainSignals::default();
    let first = Arc::new(Mutex::new(Vec::new()));
    let (sink, wind_down) = (Arc::clone(&first), signals.clone());
    let config = PrimesConfig::default()
        .with_chunk_size(chunk)
        .with_progress(move |progress: &Progress| {
            sink.lock().unwrap().push(progress.clone());
            if progress.job_id == "short" {
                wind_down.wind_down(None);
            }
        });
    let (stats, errors) = stores.run(config, signals, usize::MAX, 5).await;
    assert_eq!((stats.succeeded, stats.released), (1, 1), "{stats:?}");
    assert_eq!(
        stores.result(&short).await.unwrap(),
        result_text(&short, 78_498)
    );

    // The long job saved a partial chunk: [0, cursor) with 0 < cursor < end.
    let partial = first
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.job_id == "long")
        .cloned()
        .expect("the long job reported the part it counted");
    assert_eq!(partial.chunk_start, 0);
    let cursor = partial.cursor;
    assert!(0 < cursor && cursor < long.end, "{partial:?}");
    assert_eq!(partial.primes, count_primes(0, cursor));
    assert_eq!(
        stores.checkpoints.get("long"),
        Some(Checkpoint::InProgress {
            progress: json!({"cursor": cursor, "primes": partial.primes})
        })
    );
    assert!(
        errors[0].contains(&format!("job long interrupted by shutdown or a lost lease: progress is checkpointed at {cursor} of [0, 30000000)")),
        "{errors:?}"
    );

    // The next worker counts only the rest.
    let (config, second) = recording(chunk.get());
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(stats.succeeded, 1);
    let second = second.lock().unwrap().clone();
    assert_eq!(second.len(), 1);
    assert_eq!(
        (second[0].chunk_start, second[0].cursor),
        (cursor, long.end)
    );
    assert_eq!(
        stores.result(&long).await.unwrap(),
        result_text(&long, count_primes(0, long.end))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_completed_job_is_not_recomputed() {
    let stores = Stores::new();
    let job = PrimesJob::new("again", 0, 30_000).unwrap();
    stores.send(&job).await;
    let (config, first) = recording(10_000);
    stores.run(config, DrainSignals::default(), 1, 5).await;
    assert_eq!(first.lock().unwrap().len(), 3);

    // The same job arrives again (a duplicate send, or a redelivery after
    // the delete was lost).
    stores.send(&job).await;
    let (config, second) = recording(10_000);
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(stats.succeeded, 1);
    assert!(second.lock().unwrap().is_empty(), "no chunk recomputed");
    assert_eq!(stores.results.names(), ["again.json"]);
    assert_eq!(
        stores.result(&job).await.unwrap(),
        result_text(&job, count_primes(0, 30_000))
    );
    assert!(stores.queue.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_existing_result_is_never_overwritten_and_poisons_at_once() {
    let stores = Stores::new();
    let job = PrimesJob::new("taken", 0, 1_000).unwrap();
    let stored = r#"{"job_id":"taken","start":0,"end":1000,"primes":1}"#;
    stores
        .results
        .put_new("taken.json", stored.as_bytes())
        .await
        .unwrap();
    stores.send(&job).await;
    // One chunk: the job counts and its create-only write meets the stored
    // result (a longer job finds it first and trusts it as its completion
    // marker, never overwriting it either).
    let (config, _) = recording(1_000);
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    // Retrying cannot make the stored result go away: poisoned at once,
    // with the stored result in the reason.
    assert_eq!((stats.poisoned, stats.retried), (1, 0), "{stats:?}");
    let expected =
        format!("job taken: a different result is stored already and was kept: {stored}");
    assert_eq!(errors, std::slice::from_ref(&expected));
    let record = poison_records(&stores).await;
    assert_eq!(
        record[0].last_error,
        format!("permanent failure: {expected}")
    );
    assert_eq!(stores.result(&job).await.unwrap(), stored);
    assert!(
        !stores
            .checkpoints
            .get("taken")
            .is_some_and(|checkpoint| checkpoint.is_completed()),
        "not marked completed with a result it could not write"
    );
}

/// Every poison record, in the order they were written.
async fn poison_records(stores: &Stores) -> Vec<PoisonRecord> {
    let mut records = Vec::new();
    while let Some(message) = stores
        .poison
        .receive(1, Duration::from_secs(30))
        .await
        .unwrap()
        .pop()
    {
        records.push(PoisonRecord::from_message_text(&message.body).unwrap());
    }
    records
}

/// Runs a consumer with the primes handler itself (its job key and its
/// check of completed jobs) until `done` holds.
async fn run_primes_directly(
    stores: &Stores,
    done: impl Fn(ConsumerStats) -> bool,
) -> ConsumerStats {
    let config = ConsumerConfig {
        idle_backoff_floor: Duration::from_millis(5),
        idle_backoff_max: Duration::from_millis(20),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(
        Arc::new(stores.queue.clone()),
        Arc::new(stores.poison.clone()),
        config,
    )
    .unwrap()
    .with_checkpoints(Arc::new(stores.checkpoints.clone()));
    let shutdown = spot_worker_storage::CancellationToken::new();
    let primes = handler(Arc::new(stores.results.clone()), PrimesConfig::default());
    let task = tokio::spawn({
        let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
        async move { consumer.run(primes, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !done(consumer.stats()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            consumer.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    task.await.unwrap()
}

// Issue 9, item 6: a job id re-used for another range is a clear permanent
// error, never a silent skip with the old count. A true duplicate of a
// one-chunk job on its first delivery (nothing is read before it, see
// `completion_marker`) recounts its one chunk and finds the identical
// result: nothing is overwritten; a redelivered one is deleted without
// running (`a_redelivered_completed_job_is_not_recomputed` covers longer
// jobs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_reused_for_another_range_is_poisoned_and_a_duplicate_is_skipped() {
    let stores = Stores::new();
    let first = PrimesJob::new("r1", 0, 1_000).unwrap();
    stores.send(&first).await;
    run_primes_directly(&stores, |s| s.succeeded == 1).await;
    assert_eq!(
        stores.result(&first).await.unwrap(),
        result_text(&first, 168)
    );

    stores.send(&first).await;
    let wider = PrimesJob::new("r1", 0, 2_000).unwrap();
    stores.send(&wider).await;
    let stats = run_primes_directly(&stores, |s| s.succeeded == 1 && s.poisoned == 1).await;
    assert_eq!(
        (stats.skipped_completed, stats.retried),
        (0, 0),
        "{stats:?}"
    );
    let record = poison_records(&stores).await;
    assert_eq!(
        record[0].last_error,
        "permanent failure: job r1 was already completed for [0, 1000) (168 primes); \
         this message asks for [0, 2000): send it under a new job_id"
    );
    assert_eq!(record[0].body.as_deref(), Some(wider.to_message().as_str()));
    assert_eq!(
        stores.result(&first).await.unwrap(),
        result_text(&first, 168)
    );
    assert!(stores.queue.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_and_foreign_checkpoints_fail_with_clear_messages() {
    let stores = Stores::new();
    // Progress that cannot belong to a [0, 100) job.
    stores
        .checkpoints
        .write(
            "small",
            &Checkpoint::InProgress {
                progress: json!({"cursor": 5_000, "primes": 3}),
            },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    for body in [
        "not json".to_owned(),
        r#"{"job_id":"j1","start":9,"end":3}"#.to_owned(),
        PrimesJob::new("small", 0, 100).unwrap().to_message(),
    ] {
        stores.queue.send(&body, Duration::ZERO).await.unwrap();
    }
    let (config, _) = recording(10);
    // Five attempts allowed, yet each is poisoned on its first: retrying
    // cannot fix any of them.
    let (stats, errors) = stores.run(config, DrainSignals::default(), 3, 5).await;
    assert_eq!(
        (stats.poisoned, stats.retried),
        (3, 0),
        "{stats:?} {errors:?}"
    );
    let mut last_errors: Vec<String> = poison_records(&stores)
        .await
        .into_iter()
        .map(|record| record.last_error)
        .collect();
    last_errors.sort();
    let expected = [
        "permanent failure: invalid primes job: job j1: start 9 is greater than end 3",
        "permanent failure: job small: its checkpoint does not fit the job: progress {\"cursor\":5000,\"primes\":3} does not fit the range [0, 100)",
        "permanent failure: message body is not a primes job (expected JSON like {\"job_id\":\"j1\",\"start\":0,\"end\":50000000}): expected ident at line 1 column 2",
    ];
    assert_eq!(last_errors, expected);
    assert!(stores.results.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_store_outage_fails_the_job_and_the_retry_does_not_recompute() {
    let stores = Stores::new();
    let job = PrimesJob::new("later", 0, 1_000).unwrap();
    stores.send(&job).await;
    stores.results.set_available(false);
    let (config, first) = recording(100);
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert_eq!(stats.retried, 1, "{stats:?}");
    assert!(
        errors[0].starts_with(
            "job later: writing the result failed: storage unavailable: result store results"
        ),
        "{errors:?}"
    );
    assert_eq!(first.lock().unwrap().len(), 10);

    // Storage is back: the retry (visible again after a short backoff)
    // resumes at the end of the range and only writes the result.
    stores.results.set_available(true);
    let (config, second) = recording(100);
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(stats.succeeded, 1);
    assert!(second.lock().unwrap().is_empty(), "no chunk recomputed");
    assert_eq!(stores.result(&job).await.unwrap(), result_text(&job, 168));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_config_counts_in_million_number_chunks() {
    let stores = Stores::new();
    let job = PrimesJob::new("plain", 0, 2_000_000).unwrap();
    stores.send(&job).await;
    let (stats, errors) = stores
        .run(PrimesConfig::default(), DrainSignals::default(), 1, 5)
        .await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(stats.succeeded, 1);
    assert_eq!(
        stores.result(&job).await.unwrap(),
        result_text(&job, 148_933)
    );
    assert_eq!(stores.checkpoints.get("plain"), None);
}

/// Where the job's checkpoint interval comes from in a test.
#[derive(Clone, Copy)]
enum Interval {
    /// `PrimesConfig::with_checkpoint_every`.
    Fixed(Duration),
    /// The default config: the worker's interval
    /// (`JobCheckpoint::is_due_before_end`, which keeps an explicit one as
    /// it is), here fixed on the worker's cadence.
    Workers(Duration),
}

/// What the checkpoint held after each chunk of an uninterrupted
/// 10-chunk job, with progress saved at most every `interval`.
async fn checkpoints_after_each_chunk(interval: Interval) -> Vec<Option<Checkpoint>> {
    let mut stores = Stores::new();
    let job = PrimesJob::new("j", 0, 100_000).unwrap();
    stores.send(&job).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (sink, checkpoints) = (Arc::clone(&seen), stores.checkpoints.clone());
    let mut config = PrimesConfig::default()
        .with_chunk_size(NonZeroU64::new(10_000).unwrap())
        .with_progress(move |_: &Progress| sink.lock().unwrap().push(checkpoints.get("j")));
    match interval {
        Interval::Fixed(every) => config = config.with_checkpoint_every(every),
        Interval::Workers(every) => {
            stores.cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(every)));
        }
    }
    let (stats, errors) = stores.run(config, DrainSignals::default(), 1, 5).await;
    assert!(errors.is_empty() && stats.succeeded == 1, "{errors:?}");
    assert_eq!(
        stores.result(&job).await.unwrap(),
        result_text(&job, count_primes(0, 100_000))
    );
    seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_saved_at_most_every_checkpoint_interval_and_never_for_the_last_chunk() {
    // Every chunk but the last: nine progress writes, then the result.
    let every_chunk = checkpoints_after_each_chunk(Interval::Fixed(Duration::ZERO)).await;
    let expected: Vec<Option<Checkpoint>> = (1..=10_u64)
        .map(|chunk| {
            let cursor = chunk.min(9) * 10_000;
            Some(Checkpoint::InProgress {
                progress: json!({"cursor": cursor, "primes": count_primes(0, cursor)}),
            })
        })
        .collect();
    assert_eq!(every_chunk, expected);
    // An interval longer than the job: no progress write at all (an
    // eviction notice would still save it; see the interrupted-job tests).
    let rarely = checkpoints_after_each_chunk(Interval::Fixed(Duration::from_secs(3600))).await;
    assert_eq!(rarely, vec![None; 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_progress_is_saved_when_the_workers_interval_says_it_is_due() {
    // The same two cases, decided by the worker's interval rather than
    // the job's config: the handler asks `JobCheckpoint::is_due_before_end`.
    let every_chunk = checkpoints_after_each_chunk(Interval::Workers(Duration::ZERO)).await;
    assert_eq!(
        every_chunk,
        checkpoints_after_each_chunk(Interval::Fixed(Duration::ZERO)).await
    );
    assert!(every_chunk.iter().all(Option::is_some));
    let rarely = checkpoints_after_each_chunk(Interval::Workers(Duration::from_secs(3600))).await;
    assert_eq!(rarely, vec![None; 10]);
}
