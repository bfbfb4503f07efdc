//! The consumer's flow against the in-memory queue and checkpoint store, on
//! tokio's paused clock so multi-second leases take no real time: batches
//! within the concurrency limit, retries, resuming, stopping and winding
//! down, idle polling, completed and fenced-out jobs. Leases and failures
//! have test files of their own (`leases.rs`, `failures.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{Consumer, ConsumerConfig, DrainSignals, HandlerError, Job, handler_fn};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryCheckpointStore, MessageQueue, WritePrecondition,
};

use crate::common::*;
use spot_worker_testkit::faulty::FaultyQueue;

#[tokio::test(start_paused = true)]
async fn handles_a_batch_within_the_concurrency_limit_and_deletes_each() {
    let (queue, poison) = queues();
    for i in 0..10 {
        queue.send(&format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handler = handler_with(
        (in_flight.clone(), peak.clone()),
        move |(in_flight, peak), _job: Job| async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        },
    );
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
    let (queue, poison) = queues_holding("flaky").await;
    let attempts = Arc::new(AtomicU32::new(0));
    let handler = handler_with(attempts.clone(), move |attempts, job: Job| async move {
        attempts.fetch_add(1, Ordering::SeqCst);
        if job.dequeue_count() < 3 {
            return Err::<(), HandlerError>(
                format!("attempt {} failed", job.dequeue_count()).into(),
            );
        }
        Ok(())
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
async fn a_redelivered_message_with_a_completed_checkpoint_is_deleted_without_rerunning() {
    let (queue, poison) = queues();
    let id = queue.send("done before", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    write_completed(&store, id.as_str(), json!(42)).await;
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
    let (queue, poison) = queues_holding("resumable").await;
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
    let running = Running::with_store(&queue, &poison, &store, handler);
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
            visibility_timeout: Duration::from_secs(1),
            ..config()
        },
        ConsumerConfig {
            visibility_timeout: Duration::from_millis(4999),
            ..config()
        },
        ConsumerConfig {
            visibility_timeout: Duration::from_secs(7 * 24 * 3600 + 1),
            ..config()
        },
        ConsumerConfig {
            max_failures: 0,
            ..config()
        },
        ConsumerConfig {
            max_deliveries: 0,
            ..config()
        },
    ] {
        assert!(Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), bad).is_err());
    }
    for good in [Duration::from_secs(5), Duration::from_secs(7 * 24 * 3600)] {
        let config = ConsumerConfig {
            visibility_timeout: good,
            ..config()
        };
        assert!(Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config).is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn stop_receiving_lets_in_flight_handlers_finish_then_release_hands_back_the_rest() {
    let (queue, poison) = queues_holding("short").await;
    queue.send("long", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|job: Job| async move {
        let secs = if job.text()? == "short" { 20 } else { 3600 };
        tokio::time::sleep(Duration::from_secs(secs)).await;
        Ok::<(), HandlerError>(())
    });
    let consumer = consumer(&queue, &poison, config());
    let signals = DrainSignals::new();
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
    let signals = DrainSignals::new();
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

// Issue 9, item 5a: a duplicate message for one job, whose other copy is
// being worked on elsewhere, waits for it instead of failing, and is deleted
// once the job completes. The handler wraps the conflict in a plain string:
// the consumer learns of it from the checkpoint handle, not the error chain.
#[tokio::test(start_paused = true)]
async fn a_delivery_fenced_out_by_another_holder_waits_uncounted_and_is_deleted_once_the_job_completes()
 {
    let (queue, poison) = queues();
    let id = queue.send("contested job", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = handler_with(
        (store.clone(), runs.clone()),
        move |(store, runs), job: Job| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut checkpoint = job.checkpoint().await?;
            checkpoint.save_progress(json!(1)).await?;
            // Meanwhile another worker (with a duplicate message) moves
            // the job on...
            let etag = store.read(job.key()).await?.unwrap().etag;
            let etag = store
                .write(
                    job.key(),
                    &Checkpoint::InProgress {
                        progress: json!(50),
                    },
                    WritePrecondition::IfMatch(etag),
                    None,
                )
                .await?;
            let fenced = checkpoint.save_progress(json!(2)).await.unwrap_err();
            // ...and finishes it while this delivery waits.
            store
                .write(
                    job.key(),
                    &Checkpoint::Completed { result: json!(100) },
                    WritePrecondition::IfMatch(etag),
                    None,
                )
                .await?;
            Err::<(), HandlerError>(format!("could not save: {fenced}").into())
        },
    );
    let running = Running::with_store(&queue, &poison, &store, handler);
    running
        .wait_for("deleted as completed", |s| s.skipped_completed == 1)
        .await;
    let stats = running.stop().await;
    assert_eq!(stats.waited_for_peer, 1, "{stats:?}");
    assert_eq!((stats.retried, stats.poisoned), (0, 0), "{stats:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "not run again once completed"
    );
    assert!(queue.is_empty() && poison.is_empty());
    // Keyed by the message id, the completed checkpoint answers nobody once
    // its message is deleted: it is removed with it.
    assert_eq!(store.get(id.as_str()), None);
    // The wait was recorded (not as a failure), then forgotten with the message.
    assert_eq!(store.len(), 0, "nothing is left");
}

#[tokio::test(start_paused = true)]
async fn idle_polling_backs_off_to_the_maximum_and_resets_when_a_message_arrives() {
    let (queue, poison) = queues();
    let log = FaultyQueue::new(queue.clone());
    let handled_at = Arc::new(std::sync::Mutex::new(None));
    let handler = handler_with(
        handled_at.clone(),
        move |handled_at, _job: Job| async move {
            *handled_at.lock().unwrap() = Some(tokio::time::Instant::now());
            Ok::<(), HandlerError>(())
        },
    );
    let config = ConsumerConfig {
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_secs(2),
        ..config()
    };
    let running = Running::start(consumer_of(log.clone(), poison, config), handler);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle_polls = log.faults().receives_at().len();
    // At the 50 ms floor that would be 600 polls; capped at 2 s (jittered
    // down to 1 s at worst) it is at most ~35.
    assert!(
        (10..=40).contains(&idle_polls),
        "{idle_polls} polls in 30 s idle"
    );
    let gaps: Vec<Duration> = log
        .faults()
        .receives_at()
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
        .faults()
        .receives_at()
        .iter()
        .filter(|at| **at >= handled_at && **at <= handled_at + Duration::from_millis(400))
        .count();
    // Back at the floor: polls at about 0, 50, 150 and 350 ms, not 2 s apart.
    assert!(soon_after >= 3, "backoff was reset: {soon_after} polls");
}
