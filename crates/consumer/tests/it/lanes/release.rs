//! Where a job with a deadline is let go, it goes to the lane the rule
//! picks; on regular capacity, it goes back to Spot once ahead of its line
//! by two switches.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spot_worker_consumer::{CompletionRecord, DrainSignals};
use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::{Envelope, LaneRecords, PROBE_BODY, enqueue};
use spot_worker_storage::{CheckpointStore, MessageEncoding, StoredMessage};
use tokio::time::Instant;

use super::common::*;

const RECHECK: Duration = Duration::from_secs(1);
const BODY: &str = "{\"job\":\"j1\",\"text\":\"two\\nlines\"}";

/// The envelope and body of a message as stored.
fn opened(message: &StoredMessage) -> (Envelope, Vec<u8>) {
    let (envelope, body) = Envelope::unwrap(message.body.as_bytes()).unwrap();
    (envelope.expect("an envelope"), body.to_vec())
}

/// Runs a Spot consumer until its handler holds the job, then evicts it
/// (a notice with time to save) and waits for the release to settle.
async fn evict_on_spot(fleet: &Fleet, recorder: &Recorder) -> spot_worker_consumer::ConsumerStats {
    let consumer = fleet.consumer(Lane::Spot, RECHECK);
    let signals = DrainSignals::new();
    let runs_before = recorder.runs().len();
    let task = tokio::spawn({
        let (consumer, signals, handler) = (consumer.clone(), signals.clone(), recorder.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    wait_until("the handler runs", || recorder.runs().len() > runs_before).await;
    // Its save is made before it waits.
    wait_until("the handler saved", || fleet.store.get("j1").is_some()).await;
    signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    wait_until("the job settled", || {
        let stats = consumer.stats();
        stats.moved + stats.released > 0
    })
    .await;
    signals.release();
    task.await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_job_evicted_behind_its_line_moves_to_the_regular_lane_and_finishes_there() {
    let fleet = Fleet::new(Duration::from_secs(1));
    // 150 s of work due 300 s after its start, 100 s ago: the line is at
    // 50 s of work; the job reports 10 % (15 s) done.
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    let (lane, _) = enqueue(
        &lanes,
        MessageEncoding::Text,
        BODY.as_bytes(),
        Some(deadline(100, 200, 150)),
    )
    .await
    .unwrap();
    assert_eq!(lane, Lane::Spot, "enqueued with slack to spare");
    let recorder = Recorder::default();
    recorder.hold.store(true, Ordering::SeqCst);
    *recorder.progress.lock().unwrap() = Some(0.1);

    let stats = evict_on_spot(&fleet, &recorder).await;
    assert_eq!(
        (stats.moved, stats.released, stats.retried),
        (1, 0, 0),
        "{stats:?}"
    );
    assert!(fleet.spot.is_empty(), "the Spot lane's message is deleted");
    let moved = fleet.regular.messages();
    assert_eq!(moved.len(), 1);
    let (envelope, body) = opened(&moved[0]);
    assert_eq!(body, BODY.as_bytes(), "the body travels unchanged");
    assert_eq!(
        (envelope.generation, envelope.lane),
        (1, Some(Lane::Regular))
    );
    assert_eq!(envelope.key.as_deref(), Some("j1"));
    assert_eq!(envelope.carried.deliveries, 1);
    assert!(envelope.carried.tails.total_ms() > 0, "{envelope:?}");
    // The stamp of the save carries the progress the job reported.
    let stamp = fleet
        .store
        .read("j1")
        .await
        .unwrap()
        .unwrap()
        .stamp
        .unwrap();
    assert!(stamp.contains(",f=0.100000"), "{stamp}");

    // On regular capacity it finishes, from its checkpoint.
    recorder.hold.store(false, Ordering::SeqCst);
    let running = Running::start(fleet.consumer(Lane::Regular, RECHECK), recorder.clone());
    running.wait_for("finished", |s| s.succeeded == 1).await;
    running.stop().await;
    let runs = recorder.runs();
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(
            (run.key.as_str(), run.body.as_slice()),
            ("j1", BODY.as_bytes())
        );
    }
    assert_eq!(
        runs.iter().map(|run| run.lane).collect::<Vec<_>>(),
        [Some(Lane::Spot), Some(Lane::Regular)]
    );
    assert_eq!(fleet.messages(), 0);

    let record = fleet
        .store
        .read(&CompletionRecord::key("j1"))
        .await
        .unwrap()
        .expect("a completion record");
    let record = CompletionRecord::from_checkpoint(&record.checkpoint, "record").unwrap();
    let outcome = record.deadline.expect("the deadline's outcome");
    assert!(outcome.met);
    assert_eq!((outcome.lane, outcome.moves), (Lane::Regular, 1));
    assert_eq!(record.goodput.deliveries, 2);
    assert!(record.goodput.spot_ms() > 0, "{:?}", record.goodput);
    assert_eq!(record.goodput.unaccounted, 0);
    // Its lane record says it finished: a copy turning up later is stale.
    let lane_record = LaneRecords::new(fleet.store.clone())
        .read("j1")
        .await
        .unwrap()
        .unwrap();
    assert!(lane_record.finished, "{lane_record:?}");
    assert_eq!(
        (lane_record.generation, lane_record.lane),
        (1, Lane::Regular)
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_evicted_ahead_of_its_line_stays_on_spot() {
    let fleet = Fleet::new(Duration::from_secs(1));
    // 100 s of work due in 1000 s, just started; half done.
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    enqueue_text(&lanes, BODY.as_bytes(), deadline(0, 1000, 100)).await;
    let recorder = Recorder::default();
    recorder.hold.store(true, Ordering::SeqCst);
    *recorder.progress.lock().unwrap() = Some(0.5);

    let stats = evict_on_spot(&fleet, &recorder).await;
    assert_eq!((stats.moved, stats.released), (0, 1), "{stats:?}");
    assert!(fleet.regular.is_empty());
    assert_eq!(fleet.spot.messages().len(), 1, "released where it was");

    recorder.hold.store(false, Ordering::SeqCst);
    let running = Running::start(fleet.consumer(Lane::Spot, RECHECK), recorder.clone());
    running.wait_for("finished", |s| s.succeeded == 1).await;
    running.stop().await;
    let record = fleet
        .store
        .read(&CompletionRecord::key("j1"))
        .await
        .unwrap()
        .unwrap();
    let record = CompletionRecord::from_checkpoint(&record.checkpoint, "record").unwrap();
    let outcome = record.deadline.unwrap();
    assert_eq!(
        (outcome.met, outcome.lane, outcome.moves),
        (true, Lane::Spot, 0)
    );
    assert_eq!(record.goodput.regular_ms, 0, "never on regular capacity");
}

#[tokio::test(start_paused = true)]
async fn a_job_on_regular_capacity_goes_back_to_spot_once_ahead_of_its_line() {
    let fleet = Fleet::new(Duration::from_secs(1));
    // 100 s of work due in 1000 s, half done: ahead of its line by far
    // more than two switches (2 s).
    let envelope = Envelope {
        lane: Some(Lane::Regular),
        ..Envelope::new(deadline(0, 1000, 100))
    };
    let text = String::from_utf8(envelope.wrap(BODY.as_bytes())).unwrap();
    send_plain(&fleet.regular, &text).await;
    let recorder = Recorder::default();
    recorder.hold.store(true, Ordering::SeqCst);
    *recorder.progress.lock().unwrap() = Some(0.5);

    let running = Running::start(fleet.consumer(Lane::Regular, RECHECK), recorder.clone());
    // No Spot worker in sight: the job stays, and one probe asks the Spot
    // pool for a worker (however many rechecks pass).
    wait_until("a probe for Spot capacity", || fleet.spot.len() == 1).await;
    tokio::time::sleep(RECHECK * 5).await;
    assert_eq!(running.consumer.stats().moved, 0);
    let probes = fleet.spot.messages();
    assert_eq!(probes.len(), 1, "one probe at a time");
    assert_eq!(probes[0].body.as_bytes(), PROBE_BODY);
    // A Spot worker comes and takes the probe (unrun: its handler sees
    // nothing); the job goes back to Spot, where that worker takes it.
    let spot_recorder = Recorder::default();
    spot_recorder.hold.store(true, Ordering::SeqCst);
    let spot_worker = Running::start(fleet.consumer(Lane::Spot, RECHECK), spot_recorder.clone());
    running.wait_for("moved back", |s| s.moved == 1).await;
    wait_until("the Spot worker runs the job", || {
        spot_recorder.runs().len() == 1
    })
    .await;
    assert_eq!(
        spot_recorder.runs()[0].body,
        BODY.as_bytes(),
        "only the job ran"
    );
    let sightings = fleet.spot_capacity.fleet().read().await.unwrap();
    assert!(sightings.probe_taken_at.is_some(), "{sightings:?}");
    spot_worker.stop().await;
    let stats = running.stop().await;
    assert_eq!(
        (stats.retried, stats.released, stats.poisoned),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(fleet.regular.is_empty());
    let back = fleet.spot.messages();
    assert_eq!(back.len(), 1);
    let (envelope, body) = opened(&back[0]);
    assert_eq!((envelope.generation, envelope.lane), (1, Some(Lane::Spot)));
    assert_eq!(body, BODY.as_bytes());
    // Its time since its save (a recheck at least) was on regular capacity.
    let tails = envelope.carried.tails;
    assert!(tails.regular_ms >= 1000, "{tails:?}");
    assert_eq!(tails.regular_ms, tails.total_ms());
}
