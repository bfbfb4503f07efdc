//! Leases: renewed while a handler works, given up when lost or run out,
//! timed from the receive, never holding up a release; messages beyond the
//! free slots handed back at once. In-memory queue, tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{ConsumerConfig, HandlerError, Job, handler_fn};
use spot_worker_storage::{Checkpoint, InMemoryCheckpointStore, MessageQueue, StorageError};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use spot_worker_testkit::faulty::FaultyQueue;

#[tokio::test(start_paused = true)]
async fn renews_the_lease_across_several_visibility_periods() {
    let (queue, poison) = queues_holding("long job").await;
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
    let handler = handler_with(cancelled.clone(), move |cancelled, job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        checkpoint.save_progress(json!({"step": 1})).await?;
        job.cancellation().cancelled().await;
        cancelled.store(true, Ordering::SeqCst);
        // A handler that ignores cancellation still cannot write.
        let refused = checkpoint.save_progress(json!({"step": 2})).await;
        assert!(matches!(refused, Err(StorageError::JobCancelled { .. })));
        Ok::<(), HandlerError>(())
    });
    // One message in flight at a time, so the consumer itself cannot
    // re-receive the message when its lease runs out: only the thief can.
    let one_at_a_time = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        ..config()
    };
    let running = Running::start(
        consumer_of(flaky.clone(), poison.clone(), one_at_a_time)
            .with_checkpoints(Arc::new(store.clone())),
        handler,
    );
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

// Finding 4: a lease that cannot be renewed ends when it runs out.
#[tokio::test(start_paused = true)]
async fn a_renewal_outage_longer_than_the_lease_gives_the_lease_up_when_it_runs_out() {
    let (queue, poison) = queues();
    let id = queue.send("long job", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    let store = InMemoryCheckpointStore::new();
    let leaked = Arc::new(std::sync::Mutex::new(None));
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = handler_with(
        (leaked.clone(), dropped.clone()),
        move |(leaked, dropped), job: Job| async move {
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
        },
    );
    let running = Running::start(
        consumer_of(faulty.clone(), poison.clone(), config())
            .with_checkpoints(Arc::new(store.clone())),
        handler,
    );
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
    // The refused write above never landed; the job succeeded on its
    // redelivery, and its checkpoint (keyed by the message id, so nobody
    // can use it again) was removed with the message.
    assert_eq!(store.get(id.as_str()), None);
}

// Finding 5: a renewal answered after a whole renewal period is still ours.
#[tokio::test(start_paused = true)]
async fn a_slow_renewal_answer_does_not_cost_the_lease() {
    let (queue, poison) = queues_holding("long job").await;
    let faulty = FaultyQueue::new(queue.clone());
    // Renewed every 10 s; the first renewal is applied but answered 17 s
    // later, more than a period (and half the lease) but within the lease.
    *faulty.faults().slow_renewal_answer.lock().unwrap() = Some(Duration::from_secs(17));
    let handler = sleeps_then_succeeds(Duration::from_secs(60));
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(30),
        ..config()
    };
    let running = Running::start(consumer_of(faulty.clone(), poison.clone(), config), handler);
    running.wait_for("handled", |s| s.succeeded == 1).await;
    let stats = running.stop().await;
    assert_eq!(stats.leases_lost, 0);
    assert!(queue.is_empty());
}

// Finding 7: a renewal in flight does not hold up the release.
#[tokio::test(start_paused = true)]
async fn release_does_not_wait_for_a_hanging_renewal() {
    let (queue, poison) = queues_holding("slow").await;
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
    let running = Running::start(consumer_of(faulty.clone(), poison.clone(), config), handler);
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

// Finding 13: the first renewal is due a half lease after the receive was
// sent, however late the answer came.
#[tokio::test(start_paused = true)]
async fn the_first_renewal_is_timed_from_the_receive_not_from_the_answer() {
    let (queue, poison) = queues_holding("job").await;
    let faulty = FaultyQueue::new(queue.clone());
    // Answered 4 s after the 6 s lease began: timed from the answer, the
    // first renewal would come at 7 s, after the lease ran out.
    faulty
        .faults()
        .receive_delay_ms
        .store(4_000, Ordering::SeqCst);
    let handler = sleeps_then_succeeds(Duration::from_secs(20));
    let running = Running::start(consumer_of(faulty, poison.clone(), config()), handler);
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
    let handler = handler_with(gate.clone(), move |gate, _job: Job| async move {
        gate.cancelled().await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        ..config()
    };
    let running = Running::start(consumer_of(faulty, poison.clone(), config), handler);
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
