//! Reserved words cannot be sent by accident, and what a worker drops for
//! them is never silent: producers refuse a body a worker reads as its own
//! message (a probe, an envelope); a worker poisons, unrun and with the
//! reason, a job whose key lies under `.spot-worker/`, before anything
//! touches the records there; a probe it deletes unrun is counted.

use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::PoisonRecord;
use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::{Enqueued, PROBE_BODY, enqueue};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, MessageEncoding, StorageError, WritePrecondition,
};

use super::common::*;

const RECHECK: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn producers_refuse_bodies_a_worker_reads_as_its_own() {
    let fleet = Fleet::new(Duration::from_secs(60));
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    let bodies: [&[u8]; 4] = [
        PROBE_BODY,
        b"spot-worker-probe/2",
        b"spot-worker-job/1 {}\n{}",
        b"spot-worker-job/garbage",
    ];
    for body in bodies {
        for deadline in [None, Some(deadline(0, 100_000, 3_600))] {
            let refused = enqueue(&lanes, MessageEncoding::Text, body, deadline)
                .await
                .unwrap_err();
            assert!(
                matches!(&refused, StorageError::InvalidArgument(why) if why.contains("reserved")),
                "{refused:?}"
            );
            let d = Duration::from_secs(60);
            assert!(Enqueued::new(body, deadline, MessageEncoding::Base64, d, RECHECK).is_err());
        }
    }
    assert_eq!(fleet.messages(), 0, "nothing was sent");
    enqueue(&lanes, MessageEncoding::Text, b"{\"job\":\"j1\"}", None)
        .await
        .unwrap();
    assert_eq!(fleet.spot.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_job_keyed_under_the_workers_records_is_poisoned_unrun() {
    let fleet = Fleet::new(Duration::from_secs(60));
    // Another job's lane record, or anything else the workers keep there.
    let record = ".spot-worker/lanes/j1";
    let kept = Checkpoint::InProgress {
        progress: json!({"theirs": true}),
    };
    fleet
        .store
        .write(record, &kept, WritePrecondition::Create, None)
        .await
        .unwrap();
    let before = fleet.store.read(record).await.unwrap().unwrap();
    // A plain job and one with a deadline, both keyed there.
    send_plain(&fleet.spot, &json!({"job": record}).to_string()).await;
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    let body = json!({"job": ".spot-worker/fleet/spot-capacity"}).to_string();
    enqueue_text(&lanes, body.as_bytes(), deadline(0, 100_000, 3_600)).await;
    let recorder = Recorder::default();
    let running = Running::start(fleet.consumer(Lane::Spot, RECHECK), recorder.clone());
    running.wait_for("both poisoned", |s| s.poisoned == 2).await;
    let stats = running.stop().await;
    assert!(recorder.runs().is_empty(), "{:?}", recorder.runs());
    assert_eq!((stats.retried, stats.succeeded), (0, 0), "{stats:?}");
    let after = fleet.store.read(record).await.unwrap().unwrap();
    assert_eq!(after.etag, before.etag, "the record there is untouched");
    assert_eq!(after.checkpoint, kept);
    assert!(fleet.spot.is_empty() && fleet.regular.is_empty());
    for message in fleet.poison.messages() {
        let poisoned = PoisonRecord::from_message_text(&message.body).unwrap();
        assert!(
            poisoned
                .last_error
                .contains("is reserved for the workers' own records")
                && poisoned.last_error.contains("\".spot-worker/"),
            "{}",
            poisoned.last_error
        );
        assert_eq!(poisoned.failures, 0, "not the handler's failure");
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_deleted_unrun_is_counted() {
    let fleet = Fleet::new(Duration::from_secs(60));
    send_plain(&fleet.spot, std::str::from_utf8(PROBE_BODY).unwrap()).await;
    let recorder = Recorder::default();
    let running = Running::start(fleet.consumer(Lane::Spot, RECHECK), recorder.clone());
    running
        .wait_for("the probe taken", |s| s.probes_taken == 1)
        .await;
    let stats = running.stop().await;
    assert!(recorder.runs().is_empty());
    assert_eq!(fleet.messages(), 0);
    assert_eq!((stats.received, stats.poisoned), (1, 0), "{stats:?}");
}
