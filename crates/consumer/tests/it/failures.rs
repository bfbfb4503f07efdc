//! What counts as a failure and what does not: handler errors and panics
//! count towards the poison queue (with their history, an error of any
//! size, bodies that do not decode, a crash loop); a checkpoint store
//! outage never does. In-memory queue, tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{ConsumerConfig, HandlerError, Job, PoisonRecord, handler_fn};
use spot_worker_storage::{InMemoryCheckpointStore, MessageEncoding, MessageQueue};

use crate::common::*;
use spot_worker_testkit::faulty::FaultyQueue;

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
    assert_eq!((record.dequeue_count, record.failures), (3, 3));
    assert_eq!(
        record.last_error,
        "the handler failed 3 times (max_failures 3); last error: boom on attempt 3"
    );
    assert_eq!(record.body.as_deref(), Some("doomed"));
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
    let handler = handler_with(seen.clone(), move |seen, job: Job| async move {
        seen.lock().unwrap().push(job.body().to_vec());
        Ok::<(), HandlerError>(())
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
    // The record is plain JSON and keeps the original text as it was:
    // nothing is encoded twice.
    let stored = poison.messages();
    let record = PoisonRecord::from_message_text(&stored[0].body).unwrap();
    assert_eq!(record.encoding, MessageEncoding::Base64);
    assert_eq!(record.original_id, bad.as_str());
    assert!(
        record.last_error.contains("not valid Base64"),
        "{}",
        record.last_error
    );
    assert_eq!(record.body.as_deref(), Some("%%% not base64"));
}

#[tokio::test(start_paused = true)]
async fn a_message_already_received_too_often_is_poisoned_without_running_the_handler() {
    let (queue, poison) = queues_holding("crashy").await;
    // Ten earlier workers died while handling it.
    for _ in 0..10 {
        queue.receive(1, Duration::ZERO).await.unwrap();
    }
    let handler = handler_fn(|_job: Job| async { panic!("must not run") });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    running.stop().await;
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!(record.dequeue_count, 11);
    assert_starts_with(&record.last_error, "crash-loop guard: delivered 11 times");
}

// Issue 37 item 5: the poison record is sent, the delete of the original
// fails, and the message comes back. Its attempt record says it was being
// poisoned: the poisoning is finished (no second record, the original
// deleted), the job does not run again and no failure is counted twice.
#[tokio::test(start_paused = true)]
async fn a_poisoned_message_whose_delete_failed_is_not_run_again_when_it_returns() {
    let (queue, poison) = queues();
    let faulty = FaultyQueue::new(queue.clone());
    faulty
        .faults()
        .deletes_failing
        .store(true, Ordering::SeqCst);
    let id = queue.send("doomed", Duration::ZERO).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = handler_with(runs.clone(), move |runs, _job: Job| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<(), HandlerError>(spot_worker_consumer::permanent("cannot succeed"))
    });
    let store = InMemoryCheckpointStore::new();
    let running = Running::start(
        consumer_of(faulty.clone(), poison.clone(), config())
            .with_checkpoints(Arc::new(store.clone())),
        handler,
    );
    // The record is sent, and the delete after it fails.
    wait_until("a delete tried", || faulty.faults().calls().2 >= 1).await;
    assert_eq!(poison.len(), 1);
    assert_eq!(queue.len(), 1, "the original stays");
    faulty
        .faults()
        .deletes_failing
        .store(false, Ordering::SeqCst);
    wait_until("the original deleted", || queue.is_empty()).await;
    let stats = running.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the poisoned job ran again");
    assert_eq!(poison.len(), 1, "one poison record");
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.body.as_deref(), Some("doomed"));
    assert!(
        record.last_error.contains("cannot succeed"),
        "{}",
        record.last_error
    );
    // One poisoning, counted once, and no retry counted on the way.
    assert_eq!((stats.poisoned, stats.retried), (1, 0));
    // The attempt record (the mark) goes with the message.
    assert!(store.is_empty(), "{:?}", store.keys());
}

// Finding 1: a panic is a failed attempt, and no renewal outlives it.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_retried_then_poisoned_and_never_kept_hidden() {
    let (queue, poison) = queues_holding("fine").await;
    let id = queue.send("explode", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|job: Job| async move {
        if job.text()? == "explode" {
            panic!("exploded on attempt {}", job.dequeue_count());
        }
        Ok::<(), HandlerError>(())
    });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    running
        .wait_for("poisoned", |s| s.poisoned == 1 && s.succeeded == 1)
        .await;
    let stats = running.stop().await;
    // Redelivered after each backoff: nothing kept renewing its lease.
    assert_eq!((stats.retried, stats.leases_lost), (2, 0));
    assert!(queue.is_empty());
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.dequeue_count, 3);
    assert_ends_with(
        &record.last_error,
        "last error: handler panicked in handle: exploded on attempt 3",
    );
}

// Finding 3: an error text of any size still fits into a poison message.
#[tokio::test(start_paused = true)]
async fn a_100_kib_error_text_is_capped_so_the_poison_record_fits() {
    let (queue, poison) = queues_holding("verbose").await;
    let handler =
        handler_fn(|_job: Job| async { Err::<(), HandlerError>("é".repeat(50 * 1024).into()) });
    let config = ConsumerConfig {
        max_failures: 1,
        ..config()
    };
    // The poison queue refuses messages over 64 KiB, like Azure.
    let running = Running::start(
        consumer_of(queue.clone(), FaultyQueue::new(poison.clone()), config),
        handler,
    );
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.settle_failures, 0);
    let stored = poison.messages();
    assert!(stored[0].body.len() <= 64 * 1024);
    let record: PoisonRecord = serde_json::from_str(&stored[0].body).unwrap();
    assert!(record.last_error_truncated);
    assert!(record.last_error.len() <= 4 * 1024);
    assert!(record.last_error.contains("éé"));
    assert_eq!(record.body.as_deref(), Some("verbose"));
}

// Finding 10: moving a message to the poison queue happens under a lease.
#[tokio::test(start_paused = true)]
async fn early_poisoning_renews_the_lease_while_the_poison_queue_is_slow() {
    let (queue, poison) = queues();
    let encoding = MessageEncoding::Base64;
    queue
        .send(&encoding.encode(b"crashy").unwrap(), Duration::ZERO)
        .await
        .unwrap();
    // Past the crash-loop guard (max_deliveries 10).
    for _ in 0..10 {
        queue.receive(1, Duration::ZERO).await.unwrap();
    }
    queue.send("%%% not base64", Duration::ZERO).await.unwrap();
    let slow_poison = FaultyQueue::new(poison.clone());
    // Longer than the 6 s visibility timeout.
    slow_poison
        .faults()
        .send_delay_ms
        .store(8_000, Ordering::SeqCst);
    let handler = handler_fn(|_job: Job| async { panic!("must not run") });
    let config = ConsumerConfig {
        encoding,
        ..config()
    };
    let running = Running::start(consumer_of(queue.clone(), slow_poison, config), handler);
    running.wait_for("both received", |s| s.received == 2).await;
    for _ in 0..24 {
        assert!(
            queue.receive(32, VISIBILITY).await.unwrap().is_empty(),
            "another consumer took a message being poisoned"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    running.wait_for("poisoned", |s| s.poisoned == 2).await;
    let stats = running.stop().await;
    assert_eq!((stats.received, stats.leases_lost), (2, 0));
    assert!(queue.is_empty());
    assert_eq!(poison.len(), 2, "no duplicates");
}

// A poison queue out of reach leaves the message for a later delivery on
// the retry schedule, not out of every consumer's reach for the longest
// backoff (the chaos run's storage outage of seed 20260606).
#[tokio::test(start_paused = true)]
async fn a_poisoning_cut_short_is_finished_by_the_next_delivery_on_the_retry_schedule() {
    let (queue, poison) = queues_holding("doomed").await;
    let handler = handler_fn(|_job: Job| async { Err::<(), HandlerError>("broken".into()) });
    let config = ConsumerConfig {
        max_failures: 1,
        retry_backoff_max: Duration::from_secs(300),
        ..config()
    };
    let out_of_reach = FaultyQueue::new(poison.clone());
    out_of_reach.faults().cut_off.store(true, Ordering::SeqCst);
    let running = Running::start(
        consumer_of(queue.clone(), out_of_reach.clone(), config),
        handler,
    );
    running
        .wait_for("the first delivery", |s| s.received == 1)
        .await;
    let cut_short = tokio::time::Instant::now();
    out_of_reach.faults().cut_off.store(false, Ordering::SeqCst);
    running
        .wait_for("delivered again", |s| s.received == 2)
        .await;
    let parked = cut_short.elapsed();
    assert!(
        parked < Duration::from_secs(60),
        "parked for {parked:?}, the longest backoff"
    );
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.poisoned, 1);
    assert!(queue.is_empty());
    assert_eq!(poison.len(), 1, "poisoned once");
}

// Finding 9: a checkpoint-store outage does not poison anything.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_store_outage_holds_messages_without_poisoning_them() {
    let (queue, poison) = queues();
    queue
        .send(r#"{"job": "done before"}"#, Duration::ZERO)
        .await
        .unwrap();
    queue
        .send(r#"{"job": "new"}"#, Duration::ZERO)
        .await
        .unwrap();
    let store = InMemoryCheckpointStore::new();
    write_completed(&store, "done before", json!(1)).await;
    store.set_available(false);
    let runs = Arc::new(AtomicU32::new(0));
    let handler = KeyedJobs { runs: runs.clone() };
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("both received", |s| s.received == 2).await;
    // Many retry backoffs and leases long, with max_failures 3.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let stats = running.consumer.stats();
    assert_eq!(
        (stats.poisoned, stats.retried, stats.leases_lost),
        (0, 0, 0)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(
        queue
            .messages()
            .iter()
            .all(|m| m.dequeue_count == 1 && !m.visible),
        "held under their leases, not redelivered: {:?}",
        queue.messages()
    );
    store.set_available(true);
    running
        .wait_for("settled", |s| s.succeeded == 1 && s.skipped_completed == 1)
        .await;
    running.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(queue.is_empty() && poison.is_empty());
}

// A storage outage is not the handler's fault: a job whose checkpoint write
// cannot reach the store is tried again later, never counted, even with
// max_failures 1 and the store error wrapped on its way out of the handler.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_store_outage_mid_job_is_waited_out_not_counted() {
    let (queue, poison) = queues_holding("job").await;
    let store = InMemoryCheckpointStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = handler_with(
        (store.clone(), runs.clone()),
        move |(store, runs), job: Job| async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let mut checkpoint = job.checkpoint().await?;
            // The first two runs meet an outage just as they save.
            store.set_available(run > 2);
            let saved = checkpoint.complete(json!({ "run": run })).await;
            store.set_available(true);
            saved.map_err(|error| format!("could not save the result: {error}"))?;
            Ok::<(), HandlerError>(())
        },
    );
    let config = ConsumerConfig {
        max_failures: 1,
        ..config()
    };
    let consumer = consumer(&queue, &poison, config).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.waited_for_store, 2, "{stats:?}");
    assert_eq!((stats.retried, stats.poisoned), (0, 0), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(queue.is_empty() && poison.is_empty());
}
