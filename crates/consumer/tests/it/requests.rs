//! What the consumer asks of storage per job: at most one checkpoint read
//! per delivery (none where it cannot exist), receives that fetch whole batches while there is a backlog but
//! never more messages than free slots. On tokio's paused clock against the
//! in-memory queue and checkpoint store, both wrapped to count requests
//! (the testkit's `FaultyQueue` and `CountingStore`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{ConsumerConfig, HandlerError, Job, handler_fn};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryCheckpointStore, MessageQueue, StorageError,
    WritePrecondition,
};

use crate::common::*;
use spot_worker_testkit::counting::CountingStore;
use spot_worker_testkit::faulty::{FaultyQueue, Receive};

/// The checkpoints `store` was asked for, not the consumer's attempt
/// records.
fn checkpoint_reads(store: &CountingStore<InMemoryCheckpointStore>) -> Vec<String> {
    let keys = store.calls().keys_read();
    keys.into_iter()
        .filter(|key| !key.starts_with(".spot-worker/"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_first_delivery_keyed_by_its_message_id_reads_no_checkpoint_before_it_runs() {
    let (queue, poison) = queues();
    for i in 0..8 {
        queue
            .send(&format!("job {i}"), Duration::ZERO)
            .await
            .unwrap();
    }
    let store = CountingStore::new(InMemoryCheckpointStore::new());
    let handler = handler_fn(|job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        assert_eq!(checkpoint.progress(), None);
        checkpoint.save_progress(json!({"done": 1})).await?;
        // A second handle on the same key reads afresh: it sees the write.
        let again = job.checkpoint().await?;
        assert_eq!(again.progress(), Some(&json!({"done": 1})));
        Ok::<(), HandlerError>(())
    });
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("all handled", |s| s.succeeded == 8).await;
    running.stop().await;
    // Per job: no completed check (a first delivery keyed by its message
    // id cannot have a checkpoint, and the first handle is told so), the
    // second handle's read, one write.
    assert_eq!(store.calls().reads(), 8);
    assert_eq!(store.calls().writes(), 8);
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_job_reads_its_checkpoint_once_and_resumes_from_it() {
    let (queue, poison) = queues_holding("job").await;
    let store = CountingStore::new(InMemoryCheckpointStore::new());
    let handler = handler_fn(|job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        if job.dequeue_count() == 1 {
            assert_eq!(checkpoint.progress(), None);
            checkpoint.save_progress(json!({"done": 1})).await?;
            return Err::<(), HandlerError>("fails once, after saving".into());
        }
        assert_eq!(checkpoint.progress(), Some(&json!({"done": 1})));
        Ok(())
    });
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.retried, 1, "{stats:?}");
    // First delivery: none (known absent, and the handler is told so).
    // Second: the completed check, handed on to the handler.
    let reads = checkpoint_reads(&store);
    assert_eq!(reads.len(), 1, "{reads:?}");
}

/// A job keyed by its body may share its key with a duplicate message, so
/// even a first delivery checks for completion, and a duplicate of a
/// completed job is deleted without running.
#[tokio::test(start_paused = true)]
async fn a_job_keyed_by_its_body_is_checked_on_its_first_delivery() {
    let (queue, poison) = queues();
    queue
        .send(r#"{"job": "same job"}"#, Duration::ZERO)
        .await
        .unwrap();
    let store = CountingStore::new(InMemoryCheckpointStore::new());
    write_completed(store.inner(), "same job", json!(1)).await;
    let runs = Arc::new(AtomicU32::new(0));
    let running = Running::with_store(&queue, &poison, &store, KeyedJobs { runs: runs.clone() });
    running
        .wait_for("skipped", |s| s.skipped_completed == 1)
        .await;
    running.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(checkpoint_reads(&store), ["same job"]);
    assert!(queue.is_empty() && poison.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_handed_over_read_fences_out_a_write_made_after_the_delivery_began() {
    let (queue, poison) = queues_holding("contested").await;
    let store = CountingStore::new(InMemoryCheckpointStore::new());
    let conflicts = Arc::new(AtomicU32::new(0));
    let handler = handler_with(
        (store.inner().clone(), conflicts.clone()),
        move |(store, conflicts), job: Job| async move {
            if conflicts.load(Ordering::SeqCst) == 0 {
                // Another holder of the job writes after this delivery's
                // completed check, before its handler looks.
                store
                    .write(
                        job.key(),
                        &Checkpoint::InProgress {
                            progress: json!(50),
                        },
                        WritePrecondition::Create,
                        None,
                    )
                    .await?;
            }
            let mut checkpoint = job.checkpoint().await?;
            match checkpoint.save_progress(json!(51)).await {
                Err(StorageError::Conflict { .. }) => {
                    conflicts.fetch_add(1, Ordering::SeqCst);
                    Err::<(), HandlerError>("fenced out".into())
                }
                saved => {
                    assert_eq!(checkpoint.progress(), Some(&json!(51)));
                    Ok(saved?)
                }
            }
        },
    );
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(
        conflicts.load(Ordering::SeqCst),
        1,
        "the stale read is fenced"
    );
    assert_eq!(stats.waited_for_peer, 1, "{stats:?}");
    assert_eq!((stats.retried, stats.poisoned), (0, 0), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_backlog_is_received_in_full_batches_never_beyond_the_free_slots() {
    const SLOTS: usize = 32;
    const JOBS: usize = 320;
    let (queue, poison) = queues();
    for i in 0..JOBS {
        queue
            .send(&format!("job {i}"), Duration::ZERO)
            .await
            .unwrap();
    }
    let log = FaultyQueue::new(queue.clone());
    // Short jobs of different lengths, so slots free one by one.
    let handler = handler_fn(|job: Job| async move {
        let spread = job.text()?.len() as u64 * 7 % 40;
        tokio::time::sleep(Duration::from_millis(10 + spread)).await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        batch_size: SLOTS as u8,
        max_in_flight: SLOTS,
        ..config()
    };
    let running = Running::start(consumer_of(log.clone(), poison.clone(), config), handler);
    running
        .wait_for("all handled", |s| s.succeeded == JOBS as u64)
        .await;
    running.stop().await;
    let receives = log.faults().receives();
    for &Receive {
        asked, outstanding, ..
    } in &receives
    {
        assert!(
            asked + outstanding <= SLOTS,
            "asked for {asked} with {outstanding} in flight: {receives:?}"
        );
    }
    let fetching: Vec<usize> = receives
        .iter()
        .map(|receive| receive.got)
        .filter(|&got| got > 0)
        .collect();
    let per_receive = JOBS as f64 / fetching.len() as f64;
    assert!(
        per_receive >= 30.0,
        "{per_receive:.1} messages per receive: {fetching:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_consumer_receives_at_once_with_one_slot_free() {
    let (queue, poison) = queues();
    let log = FaultyQueue::new(queue.clone());
    let config = ConsumerConfig {
        batch_size: 4,
        max_in_flight: 4,
        ..config()
    };
    let consumer = consumer_of(log.clone(), poison.clone(), config.clone());
    let handler = handler_fn(|job: Job| async move {
        // One long job keeps a slot; the rest arrive one at a time.
        if job.text()? == "long" {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok::<(), HandlerError>(())
    });
    let running = Running::start(consumer, handler);
    queue.send("long", Duration::ZERO).await.unwrap();
    wait_until("the long job started", || {
        running.consumer.stats().received == 1
    })
    .await;
    for n in 2..5u64 {
        queue.send("short", Duration::ZERO).await.unwrap();
        wait_within(
            "a message on an idle queue is picked up",
            config.idle_backoff_max + Duration::from_millis(100),
            || running.consumer.stats().received == n,
        )
        .await;
    }
    running.stop().await;
}

#[test]
fn a_fill_wait_longer_than_a_second_is_refused() {
    let (queue, poison) = queues();
    let with_wait = |wait: Duration| ConsumerConfig {
        receive_fill_wait: wait,
        ..config()
    };
    let new = |config| {
        spot_worker_consumer::Consumer::new(
            Arc::new(queue.clone()),
            Arc::new(poison.clone()),
            config,
        )
    };
    for good in [
        Duration::ZERO,
        Duration::from_millis(250),
        Duration::from_secs(1),
    ] {
        assert!(new(with_wait(good)).is_ok(), "{good:?}");
    }
    let error = new(with_wait(Duration::from_millis(1001))).unwrap_err();
    assert!(error.to_string().contains("receive_fill_wait"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn after_a_full_batch_of_long_jobs_a_freed_slot_is_filled_without_waiting_for_the_rest() {
    let (queue, poison) = queues();
    for seconds in [10, 20, 30, 40, 0, 0] {
        queue
            .send(&seconds.to_string(), Duration::ZERO)
            .await
            .unwrap();
    }
    let started = Arc::new(Mutex::new(Vec::new()));
    let handler = handler_with(Arc::clone(&started), move |started, job: Job| async move {
        let seconds: u64 = job.text()?.parse()?;
        if seconds == 0 {
            started.lock().unwrap().push(tokio::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        batch_size: 4,
        max_in_flight: 4,
        receive_fill_wait: Duration::from_secs(1),
        ..config()
    };
    let consumer = consumer_of(queue.clone(), poison.clone(), config);
    let began = tokio::time::Instant::now();
    let running = Running::start(consumer, handler);
    running.wait_for("all handled", |s| s.succeeded == 6).await;
    running.stop().await;
    let started = started.lock().unwrap().clone();
    let first_short = started[0] - began;
    // The 10 s job frees the first slot; the next receive comes after the
    // 100 ms pause in slots freeing, not after the whole 1 s fill wait.
    assert!(
        first_short >= Duration::from_secs(10)
            && first_short <= Duration::from_secs(10) + Duration::from_millis(200),
        "the next job started {first_short:?} after the first receive"
    );
}

/// A job of 110 s under a 60 s lease: renewed at 20, 40, 60, 80 and 100 s
/// (every third of the lease), not every 10 s (10 renewals).
#[tokio::test(start_paused = true)]
async fn a_long_job_costs_about_three_renewals_per_lease_length() {
    let (queue, poison) = queues_holding("long").await;
    let counted = FaultyQueue::new(queue.clone());
    let handler = sleeps_then_succeeds(Duration::from_secs(110));
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(60),
        ..config()
    };
    let running = Running::start(
        consumer_of(counted.clone(), poison.clone(), config),
        handler,
    );
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    let (_, updates, deletes, _) = counted.faults().calls();
    assert_eq!(counted.faults().renewals.load(Ordering::SeqCst), 5);
    assert_eq!((updates, deletes), (5, 1), "renewals only, then the delete");
    assert!(queue.is_empty());
}

/// A handler whose create-only result marks its jobs completed.
struct MarkedJobs {
    results: spot_worker_storage::InMemoryResultStore,
    runs: Arc<AtomicU32>,
}

impl spot_worker_consumer::MessageHandler for MarkedJobs {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        use spot_worker_storage::ResultStore as _;
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.results.put_new(job.key(), b"{\"done\":true}").await?;
        // The result is written, then the delivery fails (a lost answer):
        // the redelivery must find the job completed by its marker.
        Err("failed after writing the result".into())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        Some(String::from_utf8_lossy(body).into_owned())
    }

    fn completion_marker(&self, body: &[u8]) -> Option<spot_worker_consumer::ResultMarker> {
        let name = String::from_utf8_lossy(body).into_owned();
        Some(spot_worker_consumer::ResultMarker::new(
            Arc::new(self.results.clone()),
            name,
        ))
    }
}

/// With a completion marker, a first delivery reads nothing, even keyed by
/// its body; a redelivery reads the checkpoint, then the marker, and a
/// finished job is deleted without running again.
#[tokio::test(start_paused = true)]
async fn a_completion_marker_spares_the_first_read_and_completes_a_redelivery() {
    let (queue, poison) = queues_holding("marked job").await;
    let store = CountingStore::new(InMemoryCheckpointStore::new());
    let results = spot_worker_storage::InMemoryResultStore::new("results");
    let runs = Arc::new(AtomicU32::new(0));
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(
        consumer,
        MarkedJobs {
            results,
            runs: runs.clone(),
        },
    );
    running
        .wait_for("deleted as completed", |s| s.skipped_completed == 1)
        .await;
    let stats = running.stop().await;
    assert_eq!((stats.retried, stats.poisoned), (1, 0), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    // Only the redelivery read the checkpoint.
    assert_eq!(checkpoint_reads(&store), ["marked job"]);
    assert!(queue.is_empty() && poison.is_empty());
}
