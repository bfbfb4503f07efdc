//! An eviction is not a failure, and not a crash either: a job evicted
//! more often than `max_deliveries` still finishes, because each release
//! on shutdown is recorded in the attempt record; a process that dies
//! mid-job records nothing and is still stopped by the crash-loop guard; a
//! record that cannot be written never holds the release up. In-memory
//! queue and store, tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use spot_worker_consumer::{ConsumerConfig, DrainSignals, HandlerError, Job, PoisonRecord};
use spot_worker_storage::{InMemoryCheckpointStore, InMemoryQueue};
use spot_worker_testkit::faulty::FaultyQueue;
use spot_worker_testkit::handlers::evictable;
use spot_worker_testkit::store_layer::{Action, Call, Layered, Policy, StoreCall};
use tokio::time::Instant;

use crate::common::*;

fn small_guard() -> ConsumerConfig {
    ConsumerConfig {
        max_deliveries: 3,
        ..config()
    }
}

// Issue 16 (helper B's finding): before the fix, a release on shutdown
// recorded nothing, so the guard counted every eviction as a delivery
// without an outcome and the 4th delivery (max_deliveries 3) was poisoned
// without running: an evicted job never finished.
#[tokio::test(start_paused = true)]
async fn a_job_evicted_more_often_than_max_deliveries_still_finishes() {
    let (queue, poison) = queues_holding("job").await;
    // One store for the fleet: every "VM" below is a new consumer.
    let store = Arc::new(InMemoryCheckpointStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    let finish = Arc::new(AtomicBool::new(false));
    for eviction in 1..=5u32 {
        let consumer = consumer(&queue, &poison, small_guard()).with_checkpoints(store.clone());
        let signals = DrainSignals::new();
        let task = tokio::spawn({
            let (signals, handler) = (signals.clone(), evictable(runs.clone(), finish.clone()));
            async move { consumer.run_until(handler, signals).await }
        });
        wait_until("the handler runs, or the message is poisoned", || {
            runs.load(Ordering::SeqCst) == eviction || !poison.is_empty()
        })
        .await;
        assert!(
            poison.is_empty(),
            "poisoned after {} evictions",
            eviction - 1
        );
        if eviction % 2 == 1 {
            // A notice with time: the handler returns during the wind-down.
            signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
            wait_until("released", || queue.visible_len() == 1).await;
            signals.release();
        } else {
            // No time at all (a second signal): released at once, the
            // handler dropped.
            signals.release();
        }
        let stats = stopped(task).await;
        assert_eq!(
            (stats.released, stats.poisoned, stats.retried),
            (1, 0, 0),
            "eviction {eviction}: {stats:?}"
        );
    }
    finish.store(true, Ordering::SeqCst);
    let running = Running::start(
        consumer(&queue, &poison, small_guard()).with_checkpoints(store.clone()),
        evictable(runs.clone(), finish.clone()),
    );
    running
        .wait_for("settled", |s| s.succeeded + s.poisoned > 0)
        .await;
    let stats = running.stop().await;
    assert_eq!((stats.succeeded, stats.poisoned), (1, 0), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 6, "run on every delivery");
    assert!(queue.is_empty() && poison.is_empty());
    // The record went with its message.
    let left = left_behind(&store);
    assert!(left.is_empty(), "checkpoints left behind: {left:?}");
}

// The guard keeps its purpose: a process that dies mid-job (a segfault, the
// OOM killer) records nothing, and after max_deliveries such deliveries
// the message is poisoned without running again.
#[tokio::test(start_paused = true)]
async fn a_process_that_keeps_dying_mid_job_is_still_stopped_by_the_guard() {
    let (queue, poison) = queues_holding("job").await;
    let store = Arc::new(InMemoryCheckpointStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    for crash in 1..=3u32 {
        let consumer = consumer(&queue, &poison, small_guard()).with_checkpoints(store.clone());
        let task = tokio::spawn({
            let handler = evictable(runs.clone(), Arc::new(AtomicBool::new(false)));
            async move { consumer.run_until(handler, DrainSignals::new()).await }
        });
        wait_until("the handler runs", || runs.load(Ordering::SeqCst) == crash).await;
        // The process dies: nothing settles, nothing is recorded; the
        // message comes back when its lease runs out.
        task.abort();
        let _ = task.await;
    }
    let running = Running::start(
        consumer(&queue, &poison, small_guard()).with_checkpoints(store.clone()),
        evictable(runs.clone(), Arc::new(AtomicBool::new(true))),
    );
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    running.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "not run a 4th time");
    let record = PoisonRecord::from_message_text(&poison.messages()[0].body).unwrap();
    assert_eq!(record.dequeue_count, 4);
    assert_starts_with(
        &record.last_error,
        "crash-loop guard: delivered 4 times without an outcome",
    );
}

/// A checkpoint store whose attempt-record writes never answer.
fn record_writes_hang() -> Layered<impl Policy> {
    Layered::wrap(
        Arc::new(InMemoryCheckpointStore::new()),
        |call: &Call<'_>| {
            if call.kind == StoreCall::CheckpointWrite
                && call.key.starts_with(".spot-worker/attempts/")
            {
                Action::Hang
            } else {
                Action::Pass
            }
        },
    )
}

/// Runs one delivery of `queue`'s only message with attempt-record writes
/// hanging, drains it as `drain` does, and returns how long after the
/// drain began the release was answered, and the stats.
async fn release_with_a_hanging_record(
    drain: impl FnOnce(&DrainSignals),
) -> (Duration, spot_worker_consumer::ConsumerStats) {
    let (queue, poison) = queues_holding("job").await;
    let faulty = FaultyQueue::new(queue.clone());
    let store = record_writes_hang();
    let consumer = consumer_of(faulty.clone(), poison.clone(), small_guard())
        .with_checkpoints(Arc::new(store));
    let runs = Arc::new(AtomicU32::new(0));
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (signals, handler) = (
            signals.clone(),
            evictable(runs.clone(), Arc::new(AtomicBool::new(false))),
        );
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the handler runs", || runs.load(Ordering::SeqCst) == 1).await;
    let began = Instant::now();
    drain(&signals);
    wait_within("the release", Duration::from_secs(30), || {
        !faulty.faults().released_at().is_empty()
    })
    .await;
    let released_after = faulty.faults().released_at()[0] - began;
    signals.release();
    let stats = stopped(task).await;
    assert_eq!(queue.visible_len(), 1, "visible again");
    (released_after, stats)
}

// At the release stage the record is written beside the release, never in
// front of it: a write that hangs does not delay the release at all.
#[tokio::test(start_paused = true)]
async fn a_hanging_record_write_never_delays_a_release_at_the_release_stage() {
    let (released_after, stats) = release_with_a_hanging_record(DrainSignals::release).await;
    assert_eq!(released_after, Duration::ZERO);
    assert_eq!((stats.released, stats.poisoned), (1, 0), "{stats:?}");
}

// During the wind-down the release waits for the record, but only for its
// short deadline (1 s), and never past the release stage.
#[tokio::test(start_paused = true)]
async fn a_hanging_record_write_holds_a_wound_down_release_for_its_deadline_at_most() {
    let (released_after, stats) = release_with_a_hanging_record(|signals| {
        signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    })
    .await;
    assert!(
        released_after <= Duration::from_secs(1),
        "released {released_after:?} after the wind-down began"
    );
    assert_eq!((stats.released, stats.poisoned), (1, 0), "{stats:?}");
}

/// Messages a receive would return now.
trait VisibleLen {
    fn visible_len(&self) -> usize;
}

impl VisibleLen for InMemoryQueue {
    fn visible_len(&self) -> usize {
        self.messages().iter().filter(|m| m.visible).count()
    }
}

// A job that finishes during the wind-down is deleted, and the release note
// written as the wind-down began goes with it, even on a first delivery
// (which otherwise has no record to delete).
#[tokio::test(start_paused = true)]
async fn a_job_finishing_during_the_wind_down_leaves_no_record_behind() {
    let (queue, poison) = queues_holding("job").await;
    let store = Arc::new(InMemoryCheckpointStore::new());
    let consumer = consumer(&queue, &poison, small_guard()).with_checkpoints(store.clone());
    let started = Arc::new(AtomicBool::new(false));
    let handler = handler_with(started.clone(), move |started, job: Job| async move {
        started.store(true, Ordering::SeqCst);
        job.cancellation().cancelled().await;
        // Saving progress takes a moment; the note is written meanwhile.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok::<(), HandlerError>(())
    });
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let signals = signals.clone();
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the handler runs", || started.load(Ordering::SeqCst)).await;
    signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    wait_until("deleted", || queue.is_empty()).await;
    signals.release();
    let stats = stopped(task).await;
    assert_eq!((stats.succeeded, stats.released), (1, 0), "{stats:?}");
    let left = left_behind(&store);
    assert!(left.is_empty(), "checkpoints left behind: {left:?}");
}

/// What is left in `store` besides completion records, which stay on
/// purpose (see `goodput`).
fn left_behind(store: &InMemoryCheckpointStore) -> Vec<String> {
    store
        .keys()
        .into_iter()
        .filter(|key| !key.starts_with(spot_worker_storage::COMPLETION_RECORD_PREFIX))
        .collect()
}
