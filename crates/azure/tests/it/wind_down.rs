//! On Azurite: a job that finishes while the worker winds down, with a
//! lease renewal in flight (held by the fault-injecting queue double), is
//! deleted with the pop receipt that renewal brings, not redelivered.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use spot_worker_consumer::{Consumer, ConsumerConfig, DrainSignals, HandlerError, Job, handler_fn};
use spot_worker_storage::MessageQueue;
use spot_worker_testkit::faulty::FaultyQueue;

// Issue 16, item 5 (the in-memory twin is crates/consumer/tests/it/wind_down.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_finishing_during_wind_down_with_a_renewal_in_flight_is_deleted() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    queue.send("job", Duration::ZERO).await.unwrap();
    let faulty = FaultyQueue::new(queue.clone());
    // Leases of 6 s are renewed every 2 s; the first renewal reaches
    // Azurite at once (a new pop receipt) but is answered 3 s later.
    *faulty.faults().slow_renewal_answer.lock().unwrap() = Some(Duration::from_secs(3));
    let handler = handler_fn(|job: Job| async move {
        job.cancellation().cancelled().await;
        Ok::<(), HandlerError>(())
    });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(6),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        settle_timeout: Duration::from_secs(10),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(faulty.clone()), Arc::new(poison), config).unwrap();
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    poll_until("a renewal in flight", WAIT_LIMIT, || {
        let renewals = faulty.faults().renewals.load(Ordering::SeqCst);
        async move { (renewals == 1).then_some(()) }
    })
    .await;
    signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
    let wound_down_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), faulty.faults().deleted(1))
        .await
        .expect("the finished job's message is deleted");
    let deleted_after = wound_down_at.elapsed();
    signals.release();
    let stats = stopped(task).await;
    assert_eq!(
        (stats.succeeded, stats.leases_lost, stats.released),
        (1, 0, 0),
        "{stats:?}"
    );
    assert!(
        deleted_after < Duration::from_secs(10),
        "deleted {deleted_after:?} after the wind-down began"
    );
    // Gone from the queue (the delete above succeeded on Azurite).
    let left = queue.receive(32, Duration::from_secs(60)).await.unwrap();
    assert!(left.is_empty(), "still queued: {left:?}");
}
