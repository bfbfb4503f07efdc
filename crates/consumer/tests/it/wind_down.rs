//! Settling while the worker winds down: a job that finishes during a drain
//! is deleted, even while a lease renewal is in flight (its new pop receipt
//! is waited for, up to the release stage). In-memory queue behind the
//! fault-injecting double, tokio's paused clock.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spot_worker_consumer::{DrainSignals, HandlerError, Job, handler_fn};
use spot_worker_storage::MessageQueue;
use spot_worker_testkit::faulty::FaultyQueue;

use crate::common::*;

// Issue 16, item 5: before the fix, settling during wind-down hurried on
// the job's token, which wind-down had already cancelled: the renewal in
// flight was abandoned, the delete went out with the receipt it replaced
// and failed as a lost lease, and the finished job came back after its
// visibility timeout to be done again.
#[tokio::test(start_paused = true)]
async fn a_job_finishing_during_wind_down_with_a_renewal_in_flight_is_deleted() {
    let (queue, poison) = queues_holding("job").await;
    let faulty = FaultyQueue::new(queue.clone());
    // Leases of 6 s are renewed every 2 s; the first renewal is applied at
    // once (a new pop receipt) but answered 3 s later.
    *faulty.faults().slow_renewal_answer.lock().unwrap() = Some(Duration::from_secs(3));
    let handler = handler_fn(|job: Job| async move {
        // Finishes as soon as the drain begins.
        job.cancellation().cancelled().await;
        Ok::<(), HandlerError>(())
    });
    let consumer = consumer_of(faulty.clone(), poison.clone(), config());
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("a renewal is in flight", || {
        faulty.faults().renewals.load(Ordering::SeqCst) == 1
    })
    .await;
    let wound_down_at = tokio::time::Instant::now();
    signals.wind_down(Some(wound_down_at + Duration::from_secs(20)));
    tokio::time::timeout(Duration::from_secs(30), faulty.faults().deleted(1))
        .await
        .expect("the finished job's message is deleted");
    // The delete waited for the renewal's answer, not for the release.
    assert!(
        wound_down_at.elapsed() < Duration::from_secs(4),
        "deleted {:?} after the wind-down began",
        wound_down_at.elapsed()
    );
    signals.release();
    let stats = stopped(task).await;
    assert_eq!(
        (
            stats.succeeded,
            stats.leases_lost,
            stats.released,
            stats.settle_failures
        ),
        (1, 0, 0, 0),
        "{stats:?}"
    );
    assert!(queue.is_empty(), "deleted, not redelivered");
    assert!(poison.is_empty());
}

// A second signal released a job while a receive sent before the stop was
// still on its way: the receive took the message straight back (its
// dequeue count raised), and it was released a second time, the two
// releases' notes racing for its attempt record (tests/worker_second_signal.rs,
// one run in eight). A release now waits for its consumer's receive loop
// to end.
#[tokio::test(start_paused = true)]
async fn a_release_waits_for_the_consumers_own_receive_in_flight() {
    let (queue, poison) = queues_holding("stubborn").await;
    let faulty = FaultyQueue::new(queue.clone());
    let handler = handler_fn(|_job: Job| std::future::pending::<Result<(), HandlerError>>());
    let consumer = consumer_of(faulty.clone(), poison.clone(), config());
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the job is running", || consumer.stats().received == 1).await;
    let in_transit = Duration::from_secs(1);
    faulty
        .faults()
        .receive_in_transit_ms
        .store(in_transit.as_millis() as u64, Ordering::SeqCst);
    let sent = faulty.faults().receives_at().len();
    wait_until("a receive is on its way", || {
        faulty.faults().receives_at().len() > sent
    })
    .await;
    signals.release();
    let stats = stopped(task).await;
    assert_eq!(
        (stats.received, stats.released),
        (1, 1),
        "released once, never taken back: {stats:?}"
    );
    let back = queue.receive(32, VISIBILITY).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].dequeue_count, 2, "taken once by the consumer");
    assert!(poison.is_empty());
}
