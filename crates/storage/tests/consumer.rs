//! The consumer's behaviour against the in-memory queue and checkpoint store,
//! on tokio's paused clock so multi-second leases take no real time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, Consumer, ConsumerConfig, DrainSignals, HandlerError,
    InMemoryCheckpointStore, Job, MessageEncoding, MessageQueue, PoisonRecord, StorageError,
    WritePrecondition, handler_fn,
};
use tokio_util::sync::CancellationToken;

mod common;

use common::*;
use spot_worker_testkit::faulty::FaultyQueue;

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
        // Five visibility periods.
        tokio::time::sleep(VISIBILITY * 5).await;
        Ok::<(), HandlerError>(())
    });
    let running = Running::start(consumer(&queue, &poison, config()), handler);
    wait_until("received", || running.consumer.stats().received == 1).await;
    // Another consumer polling all along never sees the message.
    let thief = queue.clone();
    for _ in 0..58 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(thief.receive(32, VISIBILITY).await.unwrap().is_empty());
    }
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    assert!(queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_cancels_the_handler_and_writes_nothing() {
    let (queue, poison) = queues();
    let id = queue.send("contested", Duration::ZERO).await.unwrap();
    let flaky = FaultyQueue::new(queue.clone());
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
    // This worker is cut off from the queue; another one is not.
    flaky.faults().cut_off.store(true, Ordering::SeqCst);
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
    flaky.faults().cut_off.store(false, Ordering::SeqCst);
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
    let (queue, poison) = queues();
    queue.send("crashy", Duration::ZERO).await.unwrap();
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
    assert!(
        record
            .last_error
            .starts_with("crash-loop guard: delivered 11 times"),
        "{}",
        record.last_error
    );
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
            None,
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
    let (queue, poison) = queues();
    queue.send("short", Duration::ZERO).await.unwrap();
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
    let handler = handler_fn({
        let (store, runs) = (store.clone(), runs.clone());
        move |job: Job| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
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
            }
        }
    });
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
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
    assert_eq!(
        store.get(id.as_str()),
        Some(Checkpoint::Completed { result: json!(100) })
    );
    // The wait was recorded (not as a failure), then forgotten with the message.
    assert_eq!(store.len(), 1, "only the job's checkpoint is left");
}

#[tokio::test(start_paused = true)]
async fn idle_polling_backs_off_to_the_maximum_and_resets_when_a_message_arrives() {
    let (queue, poison) = queues();
    let log = FaultyQueue::new(queue.clone());
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

// Finding 1: a panic is a failed attempt, and no renewal outlives it.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_retried_then_poisoned_and_never_kept_hidden() {
    let (queue, poison) = queues();
    queue.send("fine", Duration::ZERO).await.unwrap();
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
    assert!(
        record
            .last_error
            .ends_with("last error: handler panicked: exploded on attempt 3"),
        "{}",
        record.last_error
    );
}

// Finding 3: an error text of any size still fits into a poison message.
#[tokio::test(start_paused = true)]
async fn a_100_kib_error_text_is_capped_so_the_poison_record_fits() {
    let (queue, poison) = queues();
    queue.send("verbose", Duration::ZERO).await.unwrap();
    let handler =
        handler_fn(|_job: Job| async { Err::<(), HandlerError>("é".repeat(50 * 1024).into()) });
    let config = ConsumerConfig {
        max_failures: 1,
        ..config()
    };
    // The poison queue refuses messages over 64 KiB, like Azure.
    let consumer = Consumer::new(
        Arc::new(queue.clone()),
        Arc::new(FaultyQueue::new(poison.clone())),
        config,
    )
    .unwrap();
    let running = Running::start(consumer, handler);
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

// Finding 4: a lease that cannot be renewed ends when it runs out.
#[tokio::test(start_paused = true)]
async fn a_renewal_outage_longer_than_the_lease_gives_the_lease_up_when_it_runs_out() {
    let (queue, poison) = queues();
    let id = queue.send("long job", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    let store = InMemoryCheckpointStore::new();
    let leaked = Arc::new(std::sync::Mutex::new(None));
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = handler_fn({
        let (leaked, dropped) = (leaked.clone(), dropped.clone());
        move |job: Job| {
            let (leaked, dropped) = (leaked.clone(), dropped.clone());
            async move {
                if job.dequeue_count() > 1 {
                    return Ok(());
                }
                let _dropped = DropFlag(dropped);
                let mut checkpoint = job.checkpoint().await?;
                checkpoint.save_progress(json!({"step": 1})).await?;
                // Hands its checkpoint to work that outlives the handler.
                *leaked.lock().unwrap() = Some(checkpoint);
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    let consumer = Consumer::new(Arc::new(faulty.clone()), Arc::new(poison.clone()), config())
        .unwrap()
        .with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
    wait_until("the handler is working", || {
        leaked.lock().unwrap().is_some()
    })
    .await;
    let outage_began = tokio::time::Instant::now();
    faulty
        .faults()
        .renewals_failing
        .store(true, Ordering::SeqCst);
    running.wait_for("lease lost", |s| s.leases_lost == 1).await;
    // It was last renewed before the outage: given up no later than one
    // visibility timeout into it, without waiting for renewals to succeed.
    assert!(
        outage_began.elapsed() <= VISIBILITY + Duration::from_millis(100),
        "{:?}",
        outage_began.elapsed()
    );
    assert!(faulty.faults().renewals.load(Ordering::SeqCst) >= 2);
    assert!(dropped.load(Ordering::SeqCst), "the handler was dropped");
    let mut checkpoint = leaked.lock().unwrap().take().unwrap();
    let refused = checkpoint.save_progress(json!({"step": 2})).await;
    assert!(
        matches!(refused, Err(StorageError::JobCancelled { .. })),
        "{refused:?}"
    );
    faulty
        .faults()
        .renewals_failing
        .store(false, Ordering::SeqCst);
    // Nothing was settled for that delivery: the message comes back.
    running.wait_for("redelivered", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(
        (
            stats.leases_lost,
            stats.retried,
            stats.released,
            stats.poisoned
        ),
        (1, 0, 0, 0)
    );
    assert!(queue.is_empty());
    assert_eq!(
        store.get(id.as_str()),
        Some(Checkpoint::InProgress {
            progress: json!({"step": 1})
        })
    );
}

// Finding 5: a renewal answered after a whole renewal period is still ours.
#[tokio::test(start_paused = true)]
async fn a_slow_renewal_answer_does_not_cost_the_lease() {
    let (queue, poison) = queues();
    queue.send("long job", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    // Renewed every 10 s; the first renewal is applied but answered 17 s
    // later, more than a period (and half the lease) but within the lease.
    *faulty.faults().slow_renewal_answer.lock().unwrap() = Some(Duration::from_secs(17));
    let handler = handler_fn(|_job: Job| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(30),
        ..config()
    };
    let consumer =
        Consumer::new(Arc::new(faulty.clone()), Arc::new(poison.clone()), config).unwrap();
    let running = Running::start(consumer, handler);
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    assert!(queue.is_empty());
}

// Finding 7: a renewal in flight does not hold up the release.
#[tokio::test(start_paused = true)]
async fn release_does_not_wait_for_a_hanging_renewal() {
    let (queue, poison) = queues();
    queue.send("slow", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    faulty.faults().renewals_hang.store(true, Ordering::SeqCst);
    let handler = handler_fn(|_job: Job| async {
        std::future::pending::<()>().await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(60),
        ..config()
    };
    let consumer =
        Consumer::new(Arc::new(faulty.clone()), Arc::new(poison.clone()), config).unwrap();
    let running = Running::start(consumer, handler);
    wait_until("a renewal is in flight", || {
        faulty.faults().renewals.load(Ordering::SeqCst) == 1
    })
    .await;
    let asked = tokio::time::Instant::now();
    let stats = running.stop().await;
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "released after {:?}",
        asked.elapsed()
    );
    assert_eq!(stats.released, 1);
    assert!(queue.messages()[0].visible);
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
    store
        .write(
            "done before",
            &Checkpoint::Completed { result: json!(1) },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    store.set_available(false);
    let runs = Arc::new(AtomicU32::new(0));
    let handler = KeyedJobs { runs: runs.clone() };
    let consumer = consumer(&queue, &poison, config()).with_checkpoints(Arc::new(store.clone()));
    let running = Running::start(consumer, handler);
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
    let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(slow_poison), config).unwrap();
    let running = Running::start(consumer, handler);
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

// Finding 13: the first renewal is due a half lease after the receive was
// sent, however late the answer came.
#[tokio::test(start_paused = true)]
async fn the_first_renewal_is_timed_from_the_receive_not_from_the_answer() {
    let (queue, poison) = queues();
    queue.send("job", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    // Answered 4 s after the 6 s lease began: timed from the answer, the
    // first renewal would come at 7 s, after the lease ran out.
    faulty
        .faults()
        .receive_delay_ms
        .store(4_000, Ordering::SeqCst);
    let handler = handler_fn(|_job: Job| async {
        tokio::time::sleep(Duration::from_secs(20)).await;
        Ok::<(), HandlerError>(())
    });
    let consumer = Consumer::new(Arc::new(faulty), Arc::new(poison.clone()), config()).unwrap();
    let running = Running::start(consumer, handler);
    while queue.messages()[0].dequeue_count == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..40 {
        assert!(
            queue.receive(32, VISIBILITY).await.unwrap().is_empty(),
            "the lease ran out before its first renewal"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
}

// Finding 18: messages beyond the free slots are handed back at once.
#[tokio::test(start_paused = true)]
async fn extra_messages_from_the_queue_are_released_at_once() {
    let (queue, poison) = queues();
    for i in 0..3 {
        queue.send(&format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    let faulty = FaultyQueue::new(queue.clone());
    faulty
        .faults()
        .receive_ignores_max
        .store(true, Ordering::SeqCst);
    let gate = CancellationToken::new();
    let handler = handler_fn({
        let gate = gate.clone();
        move |_job: Job| {
            let gate = gate.clone();
            async move {
                gate.cancelled().await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    let config = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        ..config()
    };
    let consumer = Consumer::new(Arc::new(faulty), Arc::new(poison.clone()), config).unwrap();
    let running = Running::start(consumer, handler);
    running.wait_for("one started", |s| s.received == 1).await;
    wait_within(
        "the extras are visible again",
        Duration::from_secs(1),
        || queue.messages().iter().filter(|m| m.visible).count() == 2,
    )
    .await;
    assert_eq!(running.consumer.stats().released, 2);
    gate.cancel();
    running.wait_for("all handled", |s| s.succeeded == 3).await;
    running.stop().await;
    assert!(queue.is_empty());
}

// A storage outage is not the handler's fault: a job whose checkpoint write
// cannot reach the store is tried again later, never counted, even with
// max_failures 1 and the store error wrapped on its way out of the handler.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_store_outage_mid_job_is_waited_out_not_counted() {
    let (queue, poison) = queues();
    queue.send("job", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = handler_fn({
        let (store, runs) = (store.clone(), runs.clone());
        move |job: Job| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let mut checkpoint = job.checkpoint().await?;
                // The first two runs meet an outage just as they save.
                store.set_available(run > 2);
                let saved = checkpoint.complete(json!({ "run": run })).await;
                store.set_available(true);
                saved.map_err(|error| format!("could not save the result: {error}"))?;
                Ok::<(), HandlerError>(())
            }
        }
    });
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
