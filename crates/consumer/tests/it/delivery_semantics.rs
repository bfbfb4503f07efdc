//! What counts as an attempt, and what a poison record keeps (issue 9,
//! items 1, 5, 6 and 7): evictions never count, failures are counted across
//! workers through the durable attempt record, a completed job is deleted
//! before any poison decision, permanent failures are poisoned at once, and
//! a poisoned original is kept byte for byte, in a blob when it is big.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use spot_worker_consumer::{DrainSignals, HandlerError, Job, PoisonRecord, handler_fn, permanent};
use spot_worker_storage::{
    InMemoryCheckpointStore, InMemoryQueue, InMemoryResultStore, MessageEncoding, MessageQueue,
    ResultStore,
};

/// Runs `consumer` until its one message is in the handler, then drains as
/// an eviction does (wind down, then release) and waits for it to stop.
async fn evict_once(consumer: &spot_worker_consumer::Consumer, released_before: u64) {
    let handler = handler_fn(|job: Job| async move {
        job.cancellation().cancelled().await;
        Err::<(), HandlerError>("interrupted by the eviction".into())
    });
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    let received = consumer.stats().received;
    wait_until("the message is in the handler", || {
        consumer.stats().received > received
    })
    .await;
    signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
    wait_until("released", || consumer.stats().released > released_before).await;
    signals.release();
    stopped(task).await;
}

#[tokio::test(start_paused = true)]
async fn a_job_evicted_seven_times_never_counts_a_failure_and_still_completes() {
    let (queue, poison) = queues_holding("long job").await;
    let store = InMemoryCheckpointStore::new();
    // max_failures 3: with dequeue counts, this message would be poisoned
    // on its fourth delivery.
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    for eviction in 0..7 {
        evict_once(&consumer, eviction).await;
        assert!(
            poison.is_empty(),
            "poisoned after {} evictions",
            eviction + 1
        );
    }
    assert_eq!(consumer.stats().released, 7);
    // After seven evictions, one transient failure is a first failure.
    let calls = Arc::new(AtomicU32::new(0));
    let handler = handler_with(calls.clone(), move |calls, job: Job| async move {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err::<(), HandlerError>("a transient failure".into());
        }
        assert_eq!(job.dequeue_count(), 9, "7 evictions, 1 failure, this one");
        Ok(())
    });
    let running = Running::start(consumer, handler);
    running.wait_for("done", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.retried, stats.poisoned), (1, 0), "{stats:?}");
    assert!(queue.is_empty() && poison.is_empty());
    // The attempt record went with the message; what stays is the job's
    // completion record (nine deliveries: worth one).
    assert_eq!(store.len(), 1);
    let id = spot_worker_storage::MessageId::new(
        store
            .keys()
            .first()
            .and_then(|key| key.strip_prefix(".spot-worker/goodput/"))
            .expect("the completion record"),
    );
    assert!(store.get(&format!(".spot-worker/attempts/{id}")).is_none());
}

#[tokio::test(start_paused = true)]
async fn failures_are_counted_across_workers_through_the_attempt_record() {
    let (queue, poison) = queues();
    let id = queue.send("doomed", Duration::ZERO).await.unwrap();
    // One store, two workers: as two VMs share a storage account.
    let store = InMemoryCheckpointStore::new();
    let failing = |vm: &'static str| {
        handler_fn(move |_job: Job| async move {
            Err::<(), HandlerError>(format!("failed on {vm}").into())
        })
    };
    let first = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(first, failing("vm-a"));
    running.wait_for("two failures", |s| s.retried == 2).await;
    running.stop().await;
    assert!(poison.is_empty());

    let second = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(second, failing("vm-b"));
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(
        stats.retried, 0,
        "the third failure overall poisons: {stats:?}"
    );
    let record = PoisonRecord::from_message_text(&poison.messages()[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.failures, 3);
    assert!(
        record.last_error.ends_with("failed on vm-b"),
        "{}",
        record.last_error
    );
    assert!(store.is_empty(), "the attempt record went with the message");
}

#[tokio::test(start_paused = true)]
async fn a_completed_job_is_deleted_before_any_poison_decision() {
    let (queue, poison) = queues();
    // A finished job whose delete was cut short, again and again: far past
    // the crash-loop guard (max_deliveries 10).
    queue.send(r#"{"job":"j7"}"#, Duration::ZERO).await.unwrap();
    for _ in 0..20 {
        queue.receive(1, Duration::ZERO).await.unwrap();
    }
    // A duplicate message for the same job, never delivered yet.
    queue.send(r#"{"job":"j7"}"#, Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    write_completed(&store, "j7", json!({"done": true})).await;
    let runs = Arc::new(AtomicU32::new(0));
    let running = Running::with_store(&queue, &poison, &store, KeyedJobs { runs: runs.clone() });
    running
        .wait_for("both deleted", |s| s.skipped_completed == 2)
        .await;
    let stats = running.stop().await;
    assert_eq!(stats.poisoned, 0, "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the job is not run again");
    assert!(queue.is_empty() && poison.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_poisoned_at_once_with_its_reason() {
    let (queue, poison) = queues_holding("not a job").await;
    let handler = handler_fn(|job: Job| async move {
        let text = job.text()?.to_owned();
        Err::<(), HandlerError>(permanent(format!("{text:?} is not a job")))
    });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.retried, stats.received), (0, 1), "{stats:?}");
    let record = PoisonRecord::from_message_text(&poison.messages()[0].body).unwrap();
    assert_eq!(
        record.last_error,
        r#"permanent failure: "not a job" is not a job"#
    );
    assert_eq!((record.dequeue_count, record.failures), (1, 0));
}

/// Sends `text`, lets a handler fail it once with `max_failures` 1, and
/// returns the poison record and the consumer's statistics.
async fn poison_one(
    text: &str,
    encoding: MessageEncoding,
    bodies: Option<&InMemoryResultStore>,
) -> (
    InMemoryQueue,
    InMemoryQueue,
    spot_worker_consumer::ConsumerStats,
) {
    let (queue, poison) = queues_holding(text).await;
    let config = spot_worker_consumer::ConsumerConfig {
        max_failures: 1,
        encoding,
        ..config()
    };
    let mut consumer = consumer(&queue, &poison, config);
    if let Some(bodies) = bodies {
        consumer = consumer.with_poison_bodies(Arc::new(bodies.clone()));
    }
    let handler = handler_fn(|_job: Job| async { Err::<(), HandlerError>("no".into()) });
    let running = Running::start(consumer, handler);
    running
        .wait_for("settled", |s| s.poisoned == 1 || s.settle_failures > 0)
        .await;
    let stats = running.stop().await;
    (queue, poison, stats)
}

#[tokio::test(start_paused = true)]
async fn a_big_original_goes_to_a_blob_byte_for_byte_and_the_record_points_at_it() {
    // 50 KiB of characters XML and JSON escape: several times 64 KiB once
    // escaped, so it cannot travel inside the record.
    let original = "\"<&>'\\é".repeat(50 * 1024 / 8);
    let bodies = InMemoryResultStore::new("poison");
    let (queue, poison, stats) = poison_one(&original, MessageEncoding::Text, Some(&bodies)).await;
    assert_eq!(stats.settle_failures, 0, "{stats:?}");
    assert!(queue.is_empty());
    let record = PoisonRecord::from_message_text(&poison.messages()[0].body).unwrap();
    assert_eq!(record.body, None);
    let blob = record.body_blob.expect("a claim check");
    assert_eq!(blob.container, "poison");
    let stored = bodies.get(&blob.name).await.unwrap().expect("the blob");
    assert_eq!(stored, original.as_bytes(), "byte for byte");
    assert!(blob.matches(&stored));
}

#[tokio::test(start_paused = true)]
async fn a_base64_original_near_the_limit_is_kept_inline_and_encoded_once() {
    // 45 KiB of bytes is 60 KiB of base64: it fits once, not twice.
    let bytes: Vec<u8> = (0..45 * 1024).map(|i| (i % 251) as u8).collect();
    let text = MessageEncoding::Base64.encode(&bytes).unwrap();
    let bodies = InMemoryResultStore::new("poison");
    let (_, poison, _) = poison_one(&text, MessageEncoding::Base64, Some(&bodies)).await;
    let stored = &poison.messages()[0].body;
    assert!(stored.len() < 64 * 1024, "{}", stored.len());
    let record = PoisonRecord::from_message_text(stored).unwrap();
    assert_eq!(record.body.as_deref(), Some(text.as_str()));
    assert_eq!(record.encoding, MessageEncoding::Base64);
    assert!(bodies.is_empty(), "no blob needed");
}

#[tokio::test(start_paused = true)]
async fn without_a_store_for_big_originals_the_message_is_kept_not_cut() {
    let original = "\"".repeat(40 * 1024);
    let (queue, poison, stats) = poison_one(&original, MessageEncoding::Text, None).await;
    assert!(poison.is_empty());
    assert!(
        stats.settle_failures >= 1 && stats.poisoned == 0,
        "{stats:?}"
    );
    let kept = queue.messages();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].body, original, "the original is untouched");
}
