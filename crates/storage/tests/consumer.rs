//! The consumer's behaviour against the in-memory queue and checkpoint store,
//! on tokio's paused clock so multi-second leases take no real time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, Consumer, ConsumerConfig, ConsumerStats, HandlerError,
    InMemoryCheckpointStore, InMemoryQueue, Job, MessageEncoding, MessageId, MessageQueue,
    PoisonRecord, PopReceipt, QueueMessage, ShutdownSignals, StorageError, WritePrecondition,
    async_trait, handler_fn,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

fn config() -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 4,
        max_in_flight: 4,
        visibility_timeout: Duration::from_secs(2),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        retry_backoff_base: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(4),
        max_dequeue_count: 3,
        ..ConsumerConfig::default()
    }
}

struct Running {
    consumer: Consumer,
    shutdown: CancellationToken,
    task: JoinHandle<ConsumerStats>,
}

impl Running {
    fn start(consumer: Consumer, handler: impl spot_worker_storage::MessageHandler) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let consumer = consumer.clone();
            let shutdown = shutdown.clone();
            async move { consumer.run(handler, shutdown).await }
        });
        Running {
            consumer,
            shutdown,
            task,
        }
    }

    async fn wait_for(&self, what: &str, done: impl Fn(ConsumerStats) -> bool) {
        wait_until(what, || done(self.consumer.stats())).await;
    }

    async fn stop(self) -> ConsumerStats {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("consumer stops in time")
            .expect("consumer task")
    }
}

/// Polls `done` on the (paused) tokio clock for at most two simulated minutes.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn queues() -> (InMemoryQueue, InMemoryQueue) {
    (
        InMemoryQueue::new("jobs"),
        InMemoryQueue::new("jobs-poison"),
    )
}

fn consumer(queue: &InMemoryQueue, poison: &InMemoryQueue, config: ConsumerConfig) -> Consumer {
    Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config).expect("valid config")
}

#[tokio::test(start_paused = true)]
async fn handles_a_batch_within_the_concurrency_limit_and_deletes_each() {
    let (queue, poison) = queues();
    for i in 0..10 {
        queue.send(&format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handler = handler_fn({
        let (in_flight, peak) = (in_flight.clone(), peak.clone());
        move |_job: Job| {
            let (in_flight, peak) = (in_flight.clone(), peak.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        }
    });
    let config = ConsumerConfig {
        max_in_flight: 3,
        ..config()
    };
    let running = Running::start(consumer(&queue, &poison, config), handler);
    running.wait_for("all handled", |s| s.succeeded == 10).await;
    let stats = running.stop().await;
    assert_eq!(stats.received, 10);
    assert!(queue.is_empty());
    assert!(poison.is_empty());
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "the limit is reached but never exceeded"
    );
}

#[tokio::test(start_paused = true)]
async fn renews_the_lease_across_several_visibility_periods() {
    let (queue, poison) = queues();
    queue.send("long job", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|_job: Job| async {
        // Five visibility periods of 2 s.
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<(), HandlerError>(())
    });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    wait_until("received", || running.consumer.stats().received == 1).await;
    // Another consumer polling all along never sees the message.
    let thief = queue.clone();
    for _ in 0..18 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            thief
                .receive(32, Duration::from_secs(2))
                .await
                .unwrap()
                .is_empty()
        );
    }
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    assert!(queue.is_empty());
}

/// A queue whose visibility updates can be made to fail, to simulate a
/// renewal outage long enough for the lease to run out.
#[derive(Clone)]
struct FlakyRenewals {
    inner: InMemoryQueue,
    failing: Arc<AtomicBool>,
}

#[async_trait]
impl MessageQueue for FlakyRenewals {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn receive(
        &self,
        max: u8,
        visibility: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        self.inner.receive(max, visibility).await
    }
    async fn update_visibility(
        &self,
        id: &MessageId,
        receipt: &PopReceipt,
        visibility: Duration,
    ) -> Result<PopReceipt, StorageError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StorageError::Unavailable {
                message: "simulated outage".into(),
            });
        }
        self.inner.update_visibility(id, receipt, visibility).await
    }
    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), StorageError> {
        self.inner.delete(id, receipt).await
    }
    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.inner.send(body, delay).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_cancels_the_handler_and_writes_nothing() {
    let (queue, poison) = queues();
    let id = queue.send("contested", Duration::ZERO).await.unwrap();
    let flaky = FlakyRenewals {
        inner: queue.clone(),
        failing: Arc::new(AtomicBool::new(false)),
    };
    let store = InMemoryCheckpointStore::new();
    let cancelled = Arc::new(AtomicBool::new(false));
    let handler = handler_fn({
        let cancelled = cancelled.clone();
        move |job: Job| {
            let cancelled = cancelled.clone();
            async move {
                let mut checkpoint = job.checkpoint().await?;
                checkpoint.save_progress(json!({"step": 1})).await?;
                job.cancellation().cancelled().await;
                cancelled.store(true, Ordering::SeqCst);
                // A handler that ignores cancellation still cannot write.
                let refused = checkpoint.save_progress(json!({"step": 2})).await;
                assert!(matches!(refused, Err(StorageError::JobCancelled { .. })));
                Ok::<(), HandlerError>(())
            }
        }
    });
    // One message in flight at a time, so the consumer itself cannot
    // re-receive the message when its lease runs out: only the thief can.
    let one_at_a_time = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        ..config()
    };
    let consumer = Consumer::new(
        Arc::new(flaky.clone()),
        Arc::new(poison.clone()),
        one_at_a_time,
    )
    .unwrap()
    .with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
    wait_until("first checkpoint", || store.get(id.as_str()).is_some()).await;
    flaky.failing.store(true, Ordering::SeqCst);
    // Let the lease expire, then another consumer takes the message.
    let mut stolen = Vec::new();
    for _ in 0..100 {
        stolen = queue.receive(1, Duration::from_secs(60)).await.unwrap();
        if !stolen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(stolen.len(), 1, "the lease ran out");
    flaky.failing.store(false, Ordering::SeqCst);
    running.wait_for("lease lost", |s| s.leases_lost == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.succeeded, stats.retried, stats.released), (0, 0, 0));
    // The thief's lease is intact: nothing deleted or re-leased it.
    queue
        .delete(&stolen[0].id, &stolen[0].pop_receipt)
        .await
        .unwrap();
    assert_eq!(
        store.get(id.as_str()),
        Some(Checkpoint::InProgress {
            progress: json!({"step": 1})
        })
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_in_flight_messages_at_once() {
    let (queue, poison) = queues();
    for _ in 0..3 {
        queue.send("slow", Duration::ZERO).await.unwrap();
    }
    let handler = handler_fn(|job: Job| async move {
        job.cancellation().cancelled().await;
        Err::<(), HandlerError>("should have been dropped".into())
    });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(300),
        ..config()
    };
    let running = Running::start(consumer(&queue, &poison, config), handler);
    running.wait_for("all received", |s| s.received == 3).await;
    let stats = running.stop().await;
    assert_eq!(stats.released, 3);
    let messages = queue.messages();
    assert_eq!(messages.len(), 3);
    assert!(
        messages.iter().all(|m| m.visible),
        "visible again without waiting for the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn failures_retry_after_a_backoff_then_succeed() {
    let (queue, poison) = queues();
    queue.send("flaky", Duration::ZERO).await.unwrap();
    let attempts = Arc::new(AtomicU32::new(0));
    let handler = handler_fn({
        let attempts = attempts.clone();
        move |job: Job| {
            let attempts = attempts.clone();
            async move {
                attempts.fetch_add(1, Ordering::SeqCst);
                if job.dequeue_count() < 3 {
                    return Err::<(), HandlerError>(
                        format!("attempt {} failed", job.dequeue_count()).into(),
                    );
                }
                Ok(())
            }
        }
    });
    let started = tokio::time::Instant::now();
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running.wait_for("success", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.retried, 2);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    // Backoffs of 1 s and 2 s, each jittered into their upper half.
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(queue.is_empty() && poison.is_empty());
}

#[tokio::test(start_paused = true)]
async fn moves_a_message_that_keeps_failing_to_the_poison_queue_with_its_history() {
    let (queue, poison) = queues();
    let id = queue.send("doomed", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|job: Job| async move {
        Err::<(), HandlerError>(format!("boom on attempt {}", job.dequeue_count()).into())
    });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.retried, 2);
    assert!(queue.is_empty());
    let stored = poison.messages();
    assert_eq!(stored.len(), 1);
    let record: PoisonRecord = serde_json::from_str(&stored[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.queue, "jobs");
    assert_eq!(record.dequeue_count, 3);
    assert_eq!(record.last_error, "boom on attempt 3");
    assert_eq!(record.body, "doomed");
    assert!(record.inserted_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn base64_bodies_are_decoded_and_undecodable_ones_poisoned_with_a_reason() {
    let (queue, poison) = queues();
    let encoding = MessageEncoding::Base64;
    queue
        .send(&encoding.encode(&[1, 2, 255]).unwrap(), Duration::ZERO)
        .await
        .unwrap();
    let bad = queue.send("%%% not base64", Duration::ZERO).await.unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = handler_fn({
        let seen = seen.clone();
        move |job: Job| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.body().to_vec());
                Ok::<(), HandlerError>(())
            }
        }
    });
    let config = ConsumerConfig {
        encoding,
        ..config()
    };
    let running = Running::start(consumer(&queue, &poison, config), handler);
    running
        .wait_for("both settled", |s| s.succeeded == 1 && s.poisoned == 1)
        .await;
    running.stop().await;
    assert_eq!(*seen.lock().unwrap(), vec![vec![1u8, 2, 255]]);
    // The poison record is itself base64, like everything on these queues.
    let stored = poison.messages();
    let json = encoding.decode(&stored[0].body).unwrap();
    let record: PoisonRecord = serde_json::from_slice(&json).unwrap();
    assert_eq!(record.original_id, bad.as_str());
    assert!(
        record.last_error.contains("not valid Base64"),
        "{}",
        record.last_error
    );
    assert_eq!(record.body, "%%% not base64");
}

#[tokio::test(start_paused = true)]
async fn a_message_already_received_too_often_is_poisoned_without_running_the_handler() {
    let (queue, poison) = queues();
    queue.send("crashy", Duration::ZERO).await.unwrap();
    // Three earlier workers died while handling it.
    for _ in 0..3 {
        queue.receive(1, Duration::ZERO).await.unwrap();
    }
    let handler = handler_fn(|_job: Job| async { panic!("must not run") });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    running.stop().await;
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!(record.dequeue_count, 4);
    assert!(record.last_error.contains("max_dequeue_count"));
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_message_with_a_completed_checkpoint_is_deleted_without_rerunning() {
    let (queue, poison) = queues();
    let id = queue.send("done before", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    store
        .write(
            id.as_str(),
            &Checkpoint::Completed { result: json!(42) },
            WritePrecondition::Create,
        )
        .await
        .unwrap();
    let handler = handler_fn(|_job: Job| async { panic!("must not run") });
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store));
    let running = Running::start(consumer, handler);
    running
        .wait_for("skipped", |s| s.skipped_completed == 1)
        .await;
    running.stop().await;
    assert!(queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn handlers_resume_from_saved_progress() {
    let (queue, poison) = queues();
    queue.send("resumable", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let handler = handler_fn(|job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        let done = checkpoint
            .progress()
            .and_then(|p| p["done"].as_u64())
            .unwrap_or(0);
        if job.dequeue_count() == 1 {
            checkpoint.save_progress(json!({"done": done + 5})).await?;
            return Err::<(), HandlerError>("evicted half-way".into());
        }
        assert_eq!(done, 5, "resumed from the first attempt's progress");
        checkpoint.complete(json!({"total": done + 5})).await?;
        Ok(())
    });
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
    running.wait_for("success", |s| s.succeeded == 1).await;
    running.stop().await;
    assert!(queue.is_empty());
}

#[test]
fn invalid_configs_are_rejected() {
    let (queue, poison) = queues();
    for bad in [
        ConsumerConfig {
            batch_size: 0,
            ..config()
        },
        ConsumerConfig {
            batch_size: 33,
            ..config()
        },
        ConsumerConfig {
            max_in_flight: 0,
            ..config()
        },
        ConsumerConfig {
            visibility_timeout: Duration::from_millis(500),
            ..config()
        },
        ConsumerConfig {
            max_dequeue_count: 0,
            ..config()
        },
    ] {
        assert!(Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), bad).is_err());
    }
}

#[tokio::test(start_paused = true)]
async fn stop_receiving_lets_in_flight_handlers_finish_then_release_hands_back_the_rest() {
    let (queue, poison) = queues();
    queue.send("short", Duration::ZERO).await.unwrap();
    queue.send("long", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|job: Job| async move {
        let secs = if job.text()? == "short" { 5 } else { 3600 };
        tokio::time::sleep(Duration::from_secs(secs)).await;
        Ok::<(), HandlerError>(())
    });
    let consumer = consumer(&queue, &poison, config());
    let signals = ShutdownSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("both received", || consumer.stats().received == 2).await;
    signals.stop_receiving();
    let late = queue.send("late", Duration::ZERO).await.unwrap();
    // The short job finishes (its lease renewed past several periods).
    wait_until("short job done", || consumer.stats().succeeded == 1).await;
    assert!(!task.is_finished(), "the long job is still running");
    signals.release();
    let stats = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stats.received, stats.succeeded, stats.released), (2, 1, 1));
    let left = queue.messages();
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|m| m.visible));
    assert!(
        left.iter().any(|m| m.id == late && m.dequeue_count == 0),
        "nothing new was received"
    );
}

#[tokio::test(start_paused = true)]
async fn winding_down_lets_handlers_checkpoint_then_releases_their_messages() {
    let (queue, poison) = queues();
    let cooperative = queue.send("cooperative", Duration::ZERO).await.unwrap();
    let stubborn = queue.send("stubborn", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let handler = handler_fn(|job: Job| async move {
        if job.text()? == "stubborn" {
            // Ignores cancellation entirely: only a release stops it.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return Ok(());
        }
        job.cancellation().cancelled().await;
        assert!(
            job.deadline().is_some(),
            "the deadline is known when winding down"
        );
        let mut checkpoint = job.checkpoint().await?;
        checkpoint.save_progress(json!({"cursor": 7})).await?;
        Err::<(), HandlerError>("interrupted by shutdown".into())
    });
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let signals = ShutdownSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("both received", || consumer.stats().received == 2).await;

    signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
    wait_until("the cooperative job released", || {
        consumer.stats().released == 1
    })
    .await;
    assert!(!task.is_finished(), "the stubborn job is still running");
    let saved = store
        .get(cooperative.as_str())
        .expect("progress saved while winding down");
    assert_eq!(
        saved,
        Checkpoint::InProgress {
            progress: json!({"cursor": 7})
        }
    );

    signals.release();
    let stats = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stats.released, stats.retried, stats.succeeded), (2, 0, 0));
    let left = queue.messages();
    assert!(left.iter().all(|m| m.visible), "both visible again at once");
    assert!(left.iter().any(|m| m.id == stubborn));
    assert!(poison.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_conflict_abandons_the_delivery_without_retry_or_poison() {
    let (queue, poison) = queues();
    let id = queue.send("contested job", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let handler = handler_fn({
        let store = store.clone();
        move |job: Job| {
            let store = store.clone();
            async move {
                let mut checkpoint = job.checkpoint().await?;
                checkpoint.save_progress(json!(1)).await?;
                // Meanwhile another worker (say, with a duplicate message)
                // moves the job on.
                let (_, etag) = store.read(job.id().as_str()).await?.unwrap();
                store
                    .write(
                        job.id().as_str(),
                        &Checkpoint::InProgress {
                            progress: json!(50),
                        },
                        WritePrecondition::IfMatch(etag),
                    )
                    .await?;
                checkpoint.save_progress(json!(2)).await?;
                unreachable!("the write above is fenced off");
            }
        }
    });
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
    running.wait_for("abandoned", |s| s.abandoned == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.succeeded, stats.retried, stats.poisoned), (0, 0, 0));
    assert_eq!(
        store.get(id.as_str()),
        Some(Checkpoint::InProgress {
            progress: json!(50)
        })
    );
    assert_eq!(
        queue.len(),
        1,
        "the message is left for its lease to expire"
    );
    assert!(poison.is_empty());
}

/// Records when each receive call happened.
#[derive(Clone)]
struct ReceiveLog {
    inner: InMemoryQueue,
    at: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

#[async_trait]
impl MessageQueue for ReceiveLog {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn receive(
        &self,
        max: u8,
        visibility: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        self.at.lock().unwrap().push(tokio::time::Instant::now());
        self.inner.receive(max, visibility).await
    }
    async fn update_visibility(
        &self,
        id: &MessageId,
        receipt: &PopReceipt,
        visibility: Duration,
    ) -> Result<PopReceipt, StorageError> {
        self.inner.update_visibility(id, receipt, visibility).await
    }
    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), StorageError> {
        self.inner.delete(id, receipt).await
    }
    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.inner.send(body, delay).await
    }
}

#[tokio::test(start_paused = true)]
async fn idle_polling_backs_off_to_the_maximum_and_resets_when_a_message_arrives() {
    let (queue, poison) = queues();
    let log = ReceiveLog {
        inner: queue.clone(),
        at: Arc::default(),
    };
    let handled_at = Arc::new(std::sync::Mutex::new(None));
    let handler = handler_fn({
        let handled_at = handled_at.clone();
        move |_job: Job| {
            let handled_at = handled_at.clone();
            async move {
                *handled_at.lock().unwrap() = Some(tokio::time::Instant::now());
                Ok::<(), HandlerError>(())
            }
        }
    });
    let config = ConsumerConfig {
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_secs(2),
        ..config()
    };
    let consumer = Consumer::new(Arc::new(log.clone()), Arc::new(poison), config).unwrap();
    let running = Running::start(consumer, handler);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle_polls = log.at.lock().unwrap().len();
    // At the 50 ms floor that would be 600 polls; capped at 2 s (jittered
    // down to 1 s at worst) it is at most ~35.
    assert!(
        (10..=40).contains(&idle_polls),
        "{idle_polls} polls in 30 s idle"
    );
    let gaps: Vec<Duration> = log
        .at
        .lock()
        .unwrap()
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    assert!(
        gaps.iter().all(|gap| *gap <= Duration::from_secs(2)),
        "never beyond the max: {gaps:?}"
    );

    queue.send("wake up", Duration::ZERO).await.unwrap();
    running.wait_for("handled", |s| s.succeeded == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.stop().await;
    let handled_at = handled_at.lock().unwrap().expect("handled");
    let soon_after = log
        .at
        .lock()
        .unwrap()
        .iter()
        .filter(|at| **at >= handled_at && **at <= handled_at + Duration::from_millis(400))
        .count();
    // Back at the floor: polls at about 0, 50, 150 and 350 ms, not 2 s apart.
    assert!(soon_after >= 3, "backoff was reset: {soon_after} polls");
}
