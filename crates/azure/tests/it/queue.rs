//! AzureQueue and the consumer against a real Azurite: batches, pop
//! receipts, lease renewal, lost leases, release on shutdown, retry and
//! poison, and message encodings.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use spot_worker_azure::{AzureQueue, MessageTtl};
use spot_worker_consumer::{
    Consumer, ConsumerConfig, ConsumerStats, HandlerError, Job, MessageHandler, PoisonRecord,
    handler_fn,
};
use spot_worker_storage::{
    Checkpoint, JobCheckpoint, MessageEncoding, MessageQueue, PopReceipt, QueueMessage,
    ResultStore, StorageError,
};
use spot_worker_testkit::faulty::FaultyQueue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The shortest visibility timeout the consumer accepts is 5 s; 6 s keeps
/// the renewal interval (min(V/2, 10 s) = 3 s) well inside each period.
const VISIBILITY: Duration = Duration::from_secs(6);

fn config() -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 8,
        max_in_flight: 8,
        visibility_timeout: VISIBILITY,
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        retry_backoff_base: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(2),
        max_failures: 3,
        settle_timeout: Duration::from_secs(10),
        ..ConsumerConfig::default()
    }
}

struct Running {
    consumer: Consumer,
    shutdown: CancellationToken,
    task: JoinHandle<ConsumerStats>,
}

impl Running {
    fn start(consumer: Consumer, handler: impl MessageHandler) -> Self {
        let (shutdown, task) = run_in_background(&consumer, handler);
        Running {
            consumer,
            shutdown,
            task,
        }
    }

    async fn wait_for(&self, what: &str, done: impl Fn(ConsumerStats) -> bool) {
        let consumer = self.consumer.clone();
        poll_until(what, WAIT_LIMIT, || {
            let stats = consumer.stats();
            let ok = done(stats);
            async move { ok.then_some(()) }
        })
        .await;
    }

    async fn stop(self) -> ConsumerStats {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT_LIMIT, self.task)
            .await
            .expect("consumer stops")
            .expect("consumer task")
    }
}

/// Receives everything visible (with a long lease) until the queue is empty
/// (at most 100 batches).
async fn drain(queue: &AzureQueue) -> Vec<QueueMessage> {
    let mut all = Vec::new();
    for _ in 0..100 {
        let batch = queue.receive(32, Duration::from_secs(60)).await.unwrap();
        if batch.is_empty() {
            return all;
        }
        all.extend(batch);
    }
    panic!("the queue did not drain in 100 batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_receive_pop_receipts_and_delete() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, _) = queues(&storage).await;
    for i in 0..5 {
        queue.send(&format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    let batch = queue.receive(3, Duration::from_secs(30)).await.unwrap();
    assert_eq!(batch.len(), 3, "batch size is honoured");
    let rest = queue.receive(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(rest.len(), 2);
    assert!(
        queue
            .receive(32, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );
    let first = &batch[0];
    assert_eq!(first.dequeue_count, 1);
    assert!(first.inserted_at.is_some());
    assert_eq!(first.body, "m0");

    // The new pop receipt comes from the x-ms-popreceipt header.
    let renewed = queue
        .update_visibility(&first.id, &first.pop_receipt, Duration::from_secs(30))
        .await
        .unwrap();
    assert_ne!(renewed, first.pop_receipt);
    let stale = queue
        .delete(&first.id, &first.pop_receipt)
        .await
        .unwrap_err();
    assert!(matches!(stale, StorageError::LeaseLost { .. }), "{stale:?}");
    let bogus = queue
        .update_visibility(
            &first.id,
            &PopReceipt::new("AgAAAAMAAAAAAAAAbogus"),
            Duration::ZERO,
        )
        .await
        .unwrap_err();
    assert!(matches!(bogus, StorageError::LeaseLost { .. }), "{bogus:?}");
    queue.delete(&first.id, &renewed).await.unwrap();
    let gone = queue.delete(&first.id, &renewed).await.unwrap_err();
    assert!(matches!(gone, StorageError::LeaseLost { .. }), "{gone:?}");

    // Visibility 0 makes a message visible again at once.
    queue
        .update_visibility(&batch[1].id, &batch[1].pop_receipt, Duration::ZERO)
        .await
        .unwrap();
    let again = queue.receive(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].dequeue_count, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_handles_a_batch_and_renews_leases_across_several_visibility_periods() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    for i in 0..4 {
        queue
            .send(&format!("long-{i}"), Duration::ZERO)
            .await
            .unwrap();
    }
    // The handlers run until the test opens `release`, so how long they hold
    // their leases is decided here, not by a sleep that races the thief.
    let release = CancellationToken::new();
    let handler = handler_fn({
        let release = release.clone();
        move |_job: Job| {
            let release = release.clone();
            async move {
                release.cancelled().await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    let running = Running::start(
        Consumer::new(Arc::new(queue.clone()), Arc::new(poison), config()).unwrap(),
        handler,
    );
    running.wait_for("all received", |s| s.received == 4).await;
    let received_at = Instant::now();
    // Another consumer polling meanwhile never gets any of them: it polls
    // until the leases have been held for three and a half visibility
    // periods (so renewals, not the first lease, kept them hidden), and for
    // at least two periods itself.
    let thief = storage.queue(queue.name()).unwrap();
    let hold = VISIBILITY * 7 / 2;
    let thief_started = Instant::now();
    while received_at.elapsed() < hold || thief_started.elapsed() < VISIBILITY * 2 {
        let stolen = thief.receive(32, Duration::from_secs(1)).await.unwrap();
        assert!(stolen.is_empty(), "lease was not renewed: {stolen:?}");
        // A polling interval, not synchronisation: the loop's bound is the
        // clock above.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(running.consumer.stats().succeeded, 0, "still held");
    release.cancel();
    running.wait_for("all handled", |s| s.succeeded == 4).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    assert!(drain(&queue).await.is_empty(), "all deleted");
}

/// Sets its flag when dropped: tells a test that a handler future ended,
/// whether it returned or the consumer dropped it.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Cuts a consumer off from the queue (a [`FaultyQueue`] failing receives
/// and visibility updates): its lease runs out and only another client (the
/// test's thief) can take the message. Failing receives too matters: the
/// consumer gives the lease up the moment it expires, which frees its slot
/// exactly when the message becomes visible again, and it would otherwise
/// race the thief for it.
fn cut_off(queue: &FaultyQueue<AzureQueue>, cut: bool) {
    queue.faults().receives_failing.store(cut, Ordering::SeqCst);
    queue.faults().updates_failing.store(cut, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_handler_and_nothing_more_is_written() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    let checkpoints = checkpoint_store(&storage, "ckpt").await;
    let id = queue.send("contested", Duration::ZERO).await.unwrap();
    let flaky = FaultyQueue::new(queue.clone());
    // The consumer stops the handler when the lease is lost (it drops it);
    // `stopped` is set when that happens. The handler hands its checkpoint
    // handle to the test first, so the test can act as a handler that
    // carries on regardless and try to write.
    let stopped = Arc::new(AtomicBool::new(false));
    let handle = Arc::new(std::sync::Mutex::new(None::<JobCheckpoint>));
    let handler = handler_fn({
        let (stopped, handle) = (stopped.clone(), handle.clone());
        move |job: Job| {
            let (stopped, handle) = (stopped.clone(), handle.clone());
            async move {
                let _stopped = SetOnDrop(stopped);
                let mut checkpoint = job.checkpoint().await?;
                checkpoint.save_progress(json!({"step": 1})).await?;
                *handle.lock().unwrap() = Some(checkpoint);
                job.cancellation().cancelled().await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    // One message in flight at a time; while renewals fail, receives fail
    // too, so only the thief can take the message when the lease runs out.
    let one_at_a_time = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        ..config()
    };
    let consumer = Consumer::new(Arc::new(flaky.clone()), Arc::new(poison), one_at_a_time)
        .unwrap()
        .with_checkpoints(Arc::new(checkpoints.clone()));
    let running = Running::start(consumer, handler);
    poll_until("first checkpoint", WAIT_LIMIT, || async {
        use spot_worker_storage::CheckpointStore as _;
        checkpoints.read(id.as_str()).await.unwrap().map(|_| ())
    })
    .await;
    cut_off(&flaky, true);
    // The lease runs out; another consumer takes the message.
    let thief = storage.queue(queue.name()).unwrap();
    let stolen = poll_until("the lease to run out", WAIT_LIMIT, || async {
        thief
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .pop()
    })
    .await;
    cut_off(&flaky, false);
    running.wait_for("lease lost", |s| s.leases_lost == 1).await;
    assert!(stopped.load(Ordering::SeqCst), "the handler was stopped");
    // Even a handler that carried on could not write any more.
    let mut checkpoint = handle
        .lock()
        .unwrap()
        .take()
        .expect("the handler's checkpoint");
    let refused = checkpoint.save_progress(json!({"step": 2})).await;
    assert!(
        matches!(refused, Err(StorageError::JobCancelled { .. })),
        "{refused:?}"
    );
    let stats = running.stop().await;
    assert_eq!(
        (
            stats.succeeded,
            stats.retried,
            stats.released,
            stats.poisoned
        ),
        (0, 0, 0, 0)
    );
    // The thief's lease is untouched, and the checkpoint still says step 1.
    thief.delete(&stolen.id, &stolen.pop_receipt).await.unwrap();
    use spot_worker_storage::CheckpointStore as _;
    let saved = checkpoints
        .read(id.as_str())
        .await
        .unwrap()
        .unwrap()
        .checkpoint;
    assert_eq!(
        saved,
        Checkpoint::InProgress {
            progress: json!({"step": 1})
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_makes_in_flight_messages_visible_again_within_a_second() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    for _ in 0..3 {
        queue.send("slow", Duration::ZERO).await.unwrap();
    }
    let handler = handler_fn(|job: Job| async move {
        job.cancellation().cancelled().await;
        Err::<(), HandlerError>("interrupted by shutdown".into())
    });
    // A long lease: without the release these would stay hidden for minutes.
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(300),
        ..config()
    };
    let running = Running::start(
        Consumer::new(Arc::new(queue.clone()), Arc::new(poison), config).unwrap(),
        handler,
    );
    running.wait_for("all received", |s| s.received == 3).await;
    // The second starts when shutdown is requested, and another client
    // watches the queue while the consumer is still stopping.
    running.shutdown.cancel();
    let shutdown_at = Instant::now();
    let watcher = storage.queue(queue.name()).unwrap();
    let mut seen = BTreeSet::new();
    while seen.len() < 3 && shutdown_at.elapsed() < Duration::from_secs(1) {
        for message in watcher.receive(32, Duration::from_secs(60)).await.unwrap() {
            seen.insert(message.id);
        }
    }
    let visible_after = shutdown_at.elapsed();
    let stats = running.stop().await;
    assert_eq!(stats.released, 3);
    assert_eq!(
        seen.len(),
        3,
        "all visible again within a second of the shutdown request ({visible_after:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_then_poison_with_the_original_metadata() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    let id = queue
        .send("doomed <&> payload", Duration::ZERO)
        .await
        .unwrap();
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = handler_fn({
        let attempts = attempts.clone();
        move |job: Job| {
            let attempts = attempts.clone();
            async move {
                attempts.lock().unwrap().push(Instant::now());
                Err::<(), HandlerError>(format!("boom on attempt {}", job.dequeue_count()).into())
            }
        }
    });
    let running = Running::start(
        Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config()).unwrap(),
        handler,
    );
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.retried, 2);
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 3);
    // Retry delays of 1 s then 2 s, jittered into their upper half, rounded
    // up to whole seconds by the service.
    assert!(
        attempts[1] - attempts[0] >= Duration::from_millis(500),
        "{:?}",
        attempts[1] - attempts[0]
    );
    assert!(
        attempts[2] - attempts[1] >= Duration::from_millis(1000),
        "{:?}",
        attempts[2] - attempts[1]
    );
    assert!(drain(&queue).await.is_empty(), "the original was deleted");
    let poisoned = drain(&poison).await;
    assert_eq!(poisoned.len(), 1);
    let record = PoisonRecord::from_message_text(&poisoned[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.queue, queue.name());
    assert_eq!((record.dequeue_count, record.failures), (3, 3));
    assert_eq!(
        record.last_error,
        "the handler failed 3 times (max_failures 3); last error: boom on attempt 3"
    );
    assert_eq!(record.body.as_deref(), Some("doomed <&> payload"));
    assert!(record.inserted_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base64_and_text_encodings() {
    let (_azurite, storage) = azurite_and_storage();

    // Text: the body is the message text, XML-special characters included.
    let (text_queue, text_poison) = queues(&storage).await;
    text_queue
        .send("plain <text> & more", Duration::ZERO)
        .await
        .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = |seen: Arc<std::sync::Mutex<Vec<Vec<u8>>>>| {
        handler_fn(move |job: Job| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.body().to_vec());
                Ok::<(), HandlerError>(())
            }
        })
    };
    let running = Running::start(
        Consumer::new(Arc::new(text_queue), Arc::new(text_poison), config()).unwrap(),
        record(seen.clone()),
    );
    running.wait_for("text handled", |s| s.succeeded == 1).await;
    running.stop().await;
    assert_eq!(seen.lock().unwrap().pop().unwrap(), b"plain <text> & more");

    // Base64: decoded before the handler; an undecodable body is poisoned.
    let (queue, poison) = queues(&storage).await;
    let encoding = MessageEncoding::Base64;
    queue
        .send(
            &encoding.encode(&[0, 1, 2, 254, 255]).unwrap(),
            Duration::ZERO,
        )
        .await
        .unwrap();
    let bad = queue
        .send("this is not base64!", Duration::ZERO)
        .await
        .unwrap();
    let config = ConsumerConfig {
        encoding,
        ..config()
    };
    let running = Running::start(
        Consumer::new(Arc::new(queue), Arc::new(poison.clone()), config).unwrap(),
        record(seen.clone()),
    );
    running
        .wait_for("both settled", |s| s.succeeded == 1 && s.poisoned == 1)
        .await;
    running.stop().await;
    assert_eq!(seen.lock().unwrap().pop().unwrap(), vec![0, 1, 2, 254, 255]);
    let poisoned = drain(&poison).await;
    // Plain JSON keeping the original text as it was: encoded once, not twice.
    let record = PoisonRecord::from_message_text(&poisoned[0].body).unwrap();
    assert_eq!(record.encoding, MessageEncoding::Base64);
    assert_eq!(record.original_id, bad.as_str());
    assert!(
        record.last_error.contains("not valid Base64"),
        "{}",
        record.last_error
    );
    assert_eq!(record.body.as_deref(), Some("this is not base64!"));
}

// Issue 9, item 7: an original that cannot travel inside the record goes
// to a blob in the `poison` container, byte for byte, and the record
// points at it; one that fits stays inline, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisoned_originals_are_kept_whole_inline_or_as_a_blob() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    let bodies = storage.result_store("poison").unwrap();
    bodies.prepare().await.unwrap();
    // 60 KiB of XML-special characters: accepted by the queue, but several
    // times 64 KiB once escaped inside a record.
    let big = "<&>\"".repeat(15 * 1024);
    let big_id = queue.send(&big, Duration::ZERO).await.unwrap();
    let small = "x".repeat(40 * 1024);
    queue.send(&small, Duration::ZERO).await.unwrap();
    let handler =
        handler_fn(|_job: Job| async { Err::<(), HandlerError>("too big to handle".into()) });
    let config = ConsumerConfig {
        max_failures: 1,
        ..config()
    };
    let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config)
        .unwrap()
        .with_poison_bodies(Arc::new(bodies.clone()));
    let running = Running::start(consumer, handler);
    running.wait_for("poisoned", |s| s.poisoned == 2).await;
    let stats = running.stop().await;
    assert_eq!(stats.settle_failures, 0);
    assert!(drain(&queue).await.is_empty());
    let mut records: Vec<PoisonRecord> = drain(&poison)
        .await
        .iter()
        .map(|m| PoisonRecord::from_message_text(&m.body).unwrap())
        .collect();
    records.sort_by_key(|r| r.body.is_some());
    let (claimed, inline) = (&records[0], &records[1]);
    assert_eq!(inline.body.as_deref(), Some(small.as_str()));
    assert_eq!(claimed.original_id, big_id.as_str());
    assert_eq!(claimed.body, None);
    let blob = claimed.body_blob.as_ref().expect("a claim check");
    assert_eq!(blob.container, "poison");
    let stored = bodies.get(&blob.name).await.unwrap().expect("the blob");
    assert_eq!(stored, big.as_bytes(), "byte for byte");
    assert!(blob.matches(&stored));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_never_expire_while_work_keeps_the_service_default() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    queue.send("doomed", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|_job: Job| async { Err::<(), HandlerError>("no".into()) });
    let config = ConsumerConfig {
        max_failures: 1,
        ..config()
    };
    let running = Running::start(
        Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config).unwrap(),
        handler,
    );
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    running.stop().await;

    let now = time::OffsetDateTime::now_utc();
    let record = poison
        .peek(1)
        .await
        .unwrap()
        .pop()
        .expect("a poison record");
    let expires = record.expires_at.expect("an expiration time");
    assert!(
        expires > now + time::Duration::days(365 * 100),
        "the poison record expires at {expires}"
    );
    let record = PoisonRecord::from_message_text(&record.body).unwrap();
    assert_eq!(record.body.as_deref(), Some("doomed"));

    // The explicit constructor builds the same queue.
    let by_name = storage.poison_queue(queue.name()).unwrap();
    assert_eq!(by_name.name(), poison.name());
    assert_eq!(by_name.message_ttl(), MessageTtl::Never);

    // Work messages keep the service's 7 days.
    queue.send("work", Duration::ZERO).await.unwrap();
    let work = queue.peek(1).await.unwrap().pop().expect("a work message");
    let expires = work.expires_at.expect("an expiration time");
    assert!(
        expires <= now + time::Duration::days(8),
        "a work message expires at {expires}"
    );
}
