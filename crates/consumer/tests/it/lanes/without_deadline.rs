//! A job without a deadline, on a worker with lanes, does exactly what it
//! did on one without: the same body, the same storage requests, the same
//! records, the same settlement when evicted, nothing in the regular lane.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use spot_worker_consumer::{ConsumerStats, DrainSignals};
use spot_worker_decisions::lanes::Lane;
use spot_worker_storage::{CheckpointStore, InMemoryCheckpointStore};
use spot_worker_testkit::counting::CountingStore;
use tokio::time::Instant;

use super::common::*;

/// What one run of the scenario left: requests by kind, the kinds of keys
/// stored, both consumers' statistics, the bodies handlers read, and the
/// stamps of the job's checkpoint saves.
#[derive(Debug, PartialEq)]
struct Trace {
    requests: (u64, u64, u64, u64),
    kinds_of_keys: Vec<String>,
    evicted: ConsumerStats,
    finished: ConsumerStats,
    bodies: Vec<Vec<u8>>,
    stamp_fields: Vec<String>,
    regular_lane: usize,
}

/// A plain job, evicted once on Spot, then finished: with or without lanes.
async fn scenario(with_lanes: bool) -> Trace {
    let fleet = Fleet::new(Duration::from_secs(1));
    let store = Arc::new(CountingStore::new(InMemoryCheckpointStore::new()));
    send_plain(&fleet.spot, "a plain job\nwith two lines").await;
    let recorder = Recorder::default();
    recorder.hold.store(true, Ordering::SeqCst);
    *recorder.progress.lock().unwrap() = Some(0.5);
    let make = || {
        let consumer =
            consumer(&fleet.spot, &fleet.poison, config()).with_checkpoints(store.clone());
        if with_lanes {
            consumer.with_lanes(fleet.lanes(Lane::Spot, Duration::from_secs(1)))
        } else {
            consumer
        }
    };

    let evicting = make();
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals, handler) = (evicting.clone(), signals.clone(), recorder.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the handler saved", || {
        store.inner().keys().iter().any(|key| !key.starts_with('.'))
    })
    .await;
    let key = store
        .inner()
        .keys()
        .into_iter()
        .find(|key| !key.starts_with('.'))
        .unwrap();
    let first_stamp = store
        .inner()
        .read(&key)
        .await
        .unwrap()
        .unwrap()
        .stamp
        .unwrap();
    signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    wait_until("released", || evicting.stats().released == 1).await;
    signals.release();
    let evicted = task.await.unwrap();

    recorder.hold.store(false, Ordering::SeqCst);
    let running = Running::start(make(), recorder.clone());
    running.wait_for("finished", |s| s.succeeded == 1).await;
    let finished = running.stop().await;

    let calls = store.calls();
    let mut kinds_of_keys: Vec<String> = store
        .inner()
        .keys()
        .into_iter()
        .map(|key| match key.rsplit_once('/') {
            Some((prefix, _)) => prefix.to_owned(),
            None => "<job>".to_owned(),
        })
        .collect();
    kinds_of_keys.sort();
    Trace {
        requests: (
            calls.reads(),
            calls.creates(),
            calls.updates(),
            calls.deletes(),
        ),
        kinds_of_keys,
        evicted,
        finished,
        bodies: recorder.runs().into_iter().map(|run| run.body).collect(),
        stamp_fields: first_stamp
            .split(['|', ','])
            .skip(1)
            .map(|field| field.split('=').next().unwrap_or_default().to_owned())
            .collect(),
        regular_lane: fleet.regular.len(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_without_a_deadline_behaves_exactly_as_without_lanes() {
    let without = scenario(false).await;
    let with = scenario(true).await;
    assert_eq!(with, without);
    // And what it does is what it always did.
    assert_eq!(
        with.bodies,
        [
            b"a plain job\nwith two lines".to_vec(),
            b"a plain job\nwith two lines".to_vec()
        ]
    );
    assert_eq!((with.evicted.released, with.evicted.moved), (1, 0));
    assert_eq!(
        with.stamp_fields,
        ["u", "r", "c", "w", "d", "s"],
        "no lane fields in its stamps"
    );
    assert!(
        with.kinds_of_keys
            .iter()
            .all(|kind| !kind.contains("lanes")),
        "{:?}",
        with.kinds_of_keys
    );
    assert_eq!(with.regular_lane, 0);
}
