//! A worker without lanes runs a job with a deadline where it was sent, and
//! still marks the job's lane record finished when it finishes (its
//! `LaneFinish`, as the runtime wires it): a copy of the job that a worker
//! with lanes left behind is then discarded unrun, not run a second time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spot_worker_consumer::DrainSignals;
use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::{FinishRecords, LaneRecords, enqueue};
use spot_worker_storage::MessageEncoding;
use tokio::time::Instant;

use super::common::*;

const RECHECK: Duration = Duration::from_secs(1);
const BODY: &str = "{\"job\":\"j1\"}";

/// A Spot worker with lanes takes the job (its record claimed), is evicted
/// and lets it go in place (well ahead of its line, it stays on Spot);
/// then a worker without lanes, given `finish` or not, finishes it. The
/// job's lane record as it is left, and the handler's runs.
async fn finished_without_lanes(finish: bool) -> (spot_worker_lanes::LaneRecord, usize) {
    let fleet = Fleet::new(Duration::from_secs(1));
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    enqueue(
        &lanes,
        MessageEncoding::Text,
        BODY.as_bytes(),
        Some(deadline(0, 100_000, 100)),
    )
    .await
    .unwrap();
    let recorder = Recorder::default();
    recorder.hold.store(true, Ordering::SeqCst);
    *recorder.progress.lock().unwrap() = Some(0.5);

    let with_lanes = fleet.consumer(Lane::Spot, RECHECK);
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals, handler) = (with_lanes.clone(), signals.clone(), recorder.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the handler saved", || fleet.store.get("j1").is_some()).await;
    signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    wait_until("the job was let go", || with_lanes.stats().released == 1).await;
    signals.release();
    let evicted = task.await.unwrap();
    assert_eq!((evicted.released, evicted.moved), (1, 0), "{evicted:?}");
    let claimed = LaneRecords::new(fleet.store.clone())
        .read("j1")
        .await
        .unwrap()
        .expect("the worker with lanes claimed the job");
    assert!(!claimed.finished);

    recorder.hold.store(false, Ordering::SeqCst);
    let plain =
        consumer(&fleet.spot, &fleet.poison, config()).with_checkpoints(fleet.store.clone());
    let plain = if finish {
        plain.with_lane_finish(FinishRecords)
    } else {
        plain
    };
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals, handler) = (plain.clone(), signals.clone(), recorder.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the job finished", || plain.stats().succeeded == 1).await;
    signals.wind_down(Some(Instant::now()));
    signals.release();
    task.await.unwrap();
    let record = LaneRecords::new(fleet.store.clone())
        .read("j1")
        .await
        .unwrap()
        .expect("the record stays");
    (record, recorder.runs().len())
}

#[tokio::test(start_paused = true)]
async fn a_worker_without_lanes_marks_a_finished_jobs_lane_record_finished() {
    let (record, runs) = finished_without_lanes(true).await;
    assert!(record.finished, "{record:?}");
    assert_eq!(runs, 2, "once evicted, once finished");
}

#[tokio::test(start_paused = true)]
async fn a_consumer_given_no_lane_step_leaves_the_lane_record_alone() {
    // The consumer knows nothing of the lanes: without a plugin it cannot
    // mark the record, and the runtime always gives a worker without lanes
    // its `FinishRecords`.
    let (record, _) = finished_without_lanes(false).await;
    assert!(!record.finished, "{record:?}");
}
