//! On Azurite: a job evicted more often than `max_deliveries` still
//! finishes, each release on shutdown recorded in its attempt record (a
//! blob beside the checkpoints), so the crash-loop guard never takes the
//! evictions for crashes. The in-memory twin, with the crash and hanging
//! store cases, is crates/consumer/tests/it/evictions.rs.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use spot_worker_consumer::{Consumer, ConsumerConfig, DrainSignals};
use spot_worker_storage::{Checkpoint, CheckpointStore, MessageQueue};
use spot_worker_testkit::handlers::evictable;
use tokio_util::sync::CancellationToken;

// Before the fix the 4th delivery (max_deliveries 3) was poisoned by the
// crash-loop guard without running: every eviction counted as a delivery
// without an outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_evicted_more_often_than_max_deliveries_still_finishes() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    poison.create_if_missing().await.unwrap();
    let store = Arc::new(storage.checkpoint_store(&unique("ckpt")).unwrap());
    store.prepare().await.unwrap();
    let id = queue.send("job", Duration::ZERO).await.unwrap();
    let config = ConsumerConfig {
        max_deliveries: 3,
        visibility_timeout: Duration::from_secs(6),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let runs = Arc::new(AtomicU32::new(0));
    let finish = Arc::new(AtomicBool::new(false));
    let handler = || evictable(runs.clone(), finish.clone());
    // Each eviction on a new "VM": a new consumer sharing only the storage.
    let new_consumer = || {
        Consumer::new(
            Arc::new(queue.clone()),
            Arc::new(poison.clone()),
            config.clone(),
        )
        .unwrap()
        .with_checkpoints(store.clone())
    };
    for eviction in 1..=5u32 {
        let signals = DrainSignals::new();
        let task = tokio::spawn({
            let (consumer, signals, handler) = (new_consumer(), signals.clone(), handler());
            async move { consumer.run_until(handler, signals).await }
        });
        poll_until("the handler runs", WAIT_LIMIT, || {
            let ran = runs.load(Ordering::SeqCst) == eviction;
            async move { ran.then_some(()) }
        })
        .await;
        if eviction % 2 == 1 {
            // Notice with time: the handler returns during the wind-down.
            signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
        }
        signals.release();
        let stats = stopped(task).await;
        assert_eq!(
            (stats.released, stats.poisoned, stats.retried),
            (1, 0, 0),
            "eviction {eviction}: {stats:?}"
        );
    }
    // Each release is in the record on Azurite.
    let record = store
        .read(&format!(".spot-worker/attempts/{id}"))
        .await
        .unwrap()
        .expect("an attempt record");
    let Checkpoint::InProgress { progress } = record.checkpoint else {
        panic!("an attempt record is in progress: {:?}", record.checkpoint);
    };
    assert_eq!(progress["releases"], 5, "{progress}");
    assert_eq!(progress["failures"], 0, "{progress}");

    finish.store(true, Ordering::SeqCst);
    let consumer = new_consumer();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (consumer, shutdown, handler) = (consumer.clone(), shutdown.clone(), handler());
        async move { consumer.run(handler, shutdown).await }
    });
    poll_until("settled", WAIT_LIMIT, || {
        let stats = consumer.stats();
        async move { (stats.succeeded + stats.poisoned > 0).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let stats = stopped(task).await;
    assert_eq!((stats.succeeded, stats.poisoned), (1, 0), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 6, "run on every delivery");
    let left = queue.receive(32, Duration::from_secs(60)).await.unwrap();
    assert!(left.is_empty(), "still queued: {left:?}");
    let poisoned = poison.receive(32, Duration::from_secs(60)).await.unwrap();
    assert!(poisoned.is_empty(), "poisoned: {poisoned:?}");
    // The record went with its message.
    let record = store
        .read(&format!(".spot-worker/attempts/{id}"))
        .await
        .unwrap();
    assert!(record.is_none(), "left behind: {record:?}");
}
