//! The lanes under faults (issue 37): a hold that runs out in the middle
//! of a move never has a job with a deadline run in two places at once,
//! and a poisoned job's stale copies never run it again. On tokio's paused
//! clock: holds run out as the clock moves, never by a sleep standing in
//! for one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_consumer::{DrainSignals, HandlerError, Job, MessageHandler, PoisonRecord};
use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::{
    Carried, Envelope, LANE_RECORD_PREFIX, LaneKeeper, LaneRecords, requeue_text,
};
use spot_worker_storage::{
    CheckpointStore, InMemoryCheckpointStore, InMemoryLeases, LeaseStore, MessageEncoding,
    MessageQueue,
};

use spot_worker_testkit::faulty::FaultyQueue;
use spot_worker_testkit::store_layer::{Action, Call, Layered, Policy, StoreCall};
use tokio::time::Instant;

use super::common::*;

const RECHECK: Duration = Duration::from_secs(1);
/// How long a keeper holds what it receives.
const HOLD: Duration = Duration::from_secs(5);

fn job(key: &str) -> String {
    format!("{{\"job\":\"{key}\"}}")
}

/// Counts each job's runs, and the most of them under way at once; each
/// run holds until it is cancelled (`fail`: fails at once instead).
#[derive(Clone, Default)]
struct Overlap {
    fail: bool,
    runs: Arc<AtomicUsize>,
    running: Arc<Mutex<HashMap<String, usize>>>,
    most: Arc<Mutex<HashMap<String, usize>>>,
}

impl Overlap {
    fn failing() -> Self {
        Overlap {
            fail: true,
            ..Overlap::default()
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn most_at_once(&self, key: &str) -> usize {
        self.most.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// One run under way: counted out when it ends, however it ends.
struct Underway(Overlap, String);

impl Drop for Underway {
    fn drop(&mut self) {
        *self
            .0
            .running
            .lock()
            .unwrap()
            .entry(self.1.clone())
            .or_default() -= 1;
    }
}

impl MessageHandler for Overlap {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let key = job.key().to_owned();
        self.runs.fetch_add(1, Ordering::SeqCst);
        let now = {
            let mut running = self.running.lock().unwrap();
            let now = running.entry(key.clone()).or_default();
            *now += 1;
            *now
        };
        {
            let mut most = self.most.lock().unwrap();
            let most = most.entry(key.clone()).or_default();
            *most = (*most).max(now);
        }
        let _underway = Underway(self.clone(), key);
        if self.fail {
            return Err("fails every time".into());
        }
        job.cancellation().cancelled().await;
        Err("interrupted".into())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        body_key(body)
    }
}

/// The fleet's store, whose lane record reads answer `delay` late (what
/// the reader sees is the record as it is when the answer comes): the
/// keeper's storage calls, slow enough for its hold to run out.
fn slow_record_reads(inner: Arc<InMemoryCheckpointStore>, delay: Duration) -> Layered<impl Policy> {
    Layered::wrap(inner, move |call: &Call<'_>| {
        if call.kind == StoreCall::CheckpointRead && call.key.starts_with(LANE_RECORD_PREFIX) {
            Action::Delay(delay)
        } else {
            Action::Pass
        }
    })
}

/// Issue 37, item 4: the keeper receives a job behind its line, and its
/// storage calls outlast its hold; a Spot worker receives the job again
/// and starts it. The keeper must not move it (today it did: the Spot run
/// and a regular run of generation 1 under way at once).
#[tokio::test(start_paused = true)]
async fn a_keeper_whose_hold_runs_out_never_moves_a_job_a_spot_worker_runs() {
    let fleet = Fleet::new(Duration::ZERO);
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    enqueue_text(&lanes, job("j0").as_bytes(), deadline(100, 200, 150)).await;
    let slow: Arc<dyn CheckpointStore> = Arc::new(slow_record_reads(
        fleet.store.clone(),
        HOLD + Duration::from_secs(2),
    ));
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let keeper = LaneKeeper::new(
        lanes,
        slow,
        leases,
        MessageEncoding::Text,
        Arc::new(|body: &[u8]| body_key(body)),
        HOLD,
    );
    let pass = tokio::spawn(async move { keeper.pass().await });
    wait_within("the keeper holds j0", Duration::from_secs(1), || {
        fleet.spot.messages().iter().all(|m| !m.visible)
    })
    .await;
    let handler = Overlap::default();
    let spot = Running::start(fleet.consumer(Lane::Spot, RECHECK), handler.clone());
    let regular = Running::start(fleet.consumer(Lane::Regular, RECHECK), handler.clone());
    wait_until("a Spot worker runs j0", || handler.runs() >= 1).await;
    let pass = pass.await.unwrap().unwrap();
    // Time for the regular worker to take whatever the keeper sent.
    tokio::time::sleep(RECHECK * 5).await;
    assert_eq!(
        handler.most_at_once("j0"),
        1,
        "j0 ran in two places at once"
    );
    assert_eq!(handler.runs(), 1);
    assert!(pass.moved.is_empty(), "{pass:?}");
    assert_eq!(fleet.regular.len(), 0, "nothing sent to the regular lane");
    regular.stop().await;
    spot.stop().await;
}

/// The fleet's store, every read answering `delay` late once `slow` is
/// set: a releasing worker's storage calls, slow enough for its hold to
/// run out.
fn slow_reads_from(
    inner: Arc<InMemoryCheckpointStore>,
    slow: Arc<AtomicBool>,
    delay: Duration,
) -> Layered<impl Policy> {
    Layered::wrap(inner, move |call: &Call<'_>| {
        if call.kind == StoreCall::CheckpointRead && slow.load(Ordering::SeqCst) {
            Action::Delay(delay)
        } else {
            Action::Pass
        }
    })
}

/// Issue 37, item 4, the releasing worker: a Spot worker's renewals fail
/// (it does not know yet that its hold will run out), it is evicted just
/// before its hold runs out, and its move to the regular lane (the job is
/// behind its line) is slow; meanwhile another Spot worker receives the
/// job and runs it. The move must not send it on (today it did: two runs
/// at once).
#[tokio::test(start_paused = true)]
async fn a_releasing_worker_whose_hold_ran_out_never_moves_a_job_another_runs() {
    let fleet = Fleet::new(Duration::from_secs(1));
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    enqueue_text(&lanes, job("j0").as_bytes(), deadline(100, 200, 150)).await;
    let failing = FaultyQueue::new(fleet.spot.clone());
    failing
        .faults()
        .renewals_failing
        .store(true, Ordering::SeqCst);
    let slow = Arc::new(AtomicBool::new(false));
    let store = Arc::new(slow_reads_from(
        fleet.store.clone(),
        Arc::clone(&slow),
        Duration::from_secs(4),
    ));
    let evicted = spot_worker_consumer::Consumer::new(
        Arc::new(failing),
        Arc::new(fleet.poison.clone()),
        config(),
    )
    .unwrap()
    .with_checkpoints(store)
    .with_lanes(fleet.lanes(Lane::Spot, RECHECK));
    let handler = Overlap::default();
    let signals = DrainSignals::new();
    let task = tokio::spawn({
        let (evicted, signals, handler) = (evicted.clone(), signals.clone(), handler.clone());
        async move { evicted.run_until(handler, signals).await }
    });
    wait_until("the first Spot worker runs j0", || handler.runs() == 1).await;
    let other = Running::start(fleet.consumer(Lane::Spot, RECHECK), handler.clone());
    let regular = Running::start(fleet.consumer(Lane::Regular, RECHECK), handler.clone());
    // Evicted 2 s before its hold (6 s) runs out; its reads take 4 s.
    tokio::time::sleep(VISIBILITY - Duration::from_secs(2)).await;
    slow.store(true, Ordering::SeqCst);
    signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
    wait_until("the other Spot worker runs j0", || handler.runs() >= 2).await;
    // Time for the move to land, and the regular worker to take it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        handler.most_at_once("j0"),
        1,
        "j0 ran in two places at once"
    );
    assert_eq!(handler.runs(), 2);
    assert_eq!(fleet.regular.len(), 0, "nothing sent to the regular lane");
    signals.release();
    task.await.unwrap();
    regular.stop().await;
    other.stop().await;
}

/// A generation-1 message of `key` as a move from `moved_from` sends it
/// to the regular lane.
fn moved_copy(key: &str, moved_from: &str) -> String {
    let envelope = Envelope {
        deadline: deadline(100, 200, 150),
        generation: 1,
        key: Some(key.to_owned()),
        lane: Some(Lane::Regular),
        moved_from: Some(moved_from.to_owned()),
        carried: Carried::default(),
    };
    String::from_utf8(envelope.wrap(job(key).as_bytes())).unwrap()
}

/// Issue 37, item 5: a move finished twice left two copies of j0 in the
/// regular lane (its mover's hold ran out mid-send, and the next receive
/// finished the move again). The first runs, fails until poisoned; the
/// second turns up after: it must not run the job again (today: 2 × the
/// failures, 2 poison records). Requeued by the operator, the job runs.
#[tokio::test(start_paused = true)]
async fn a_poisoned_job_stays_poisoned_and_runs_again_only_when_requeued() {
    let fleet = Fleet::new(Duration::ZERO);
    fleet
        .regular
        .send(&moved_copy("j0", "m0"), Duration::ZERO)
        .await
        .unwrap();
    let handler = Overlap::failing();
    let regular = Running::start(fleet.consumer(Lane::Regular, RECHECK), handler.clone());
    let max_failures = config().max_failures as usize;
    wait_until("j0 poisoned", || fleet.poison.len() == 1).await;
    assert_eq!(handler.runs(), max_failures);
    // The second copy of the same move turns up.
    fleet
        .regular
        .send(&moved_copy("j0", "m0"), Duration::ZERO)
        .await
        .unwrap();
    wait_until("the copy settled", || fleet.regular.is_empty()).await;
    tokio::time::sleep(RECHECK * 5).await;
    assert_eq!(handler.runs(), max_failures, "the stale copy ran the job");
    assert_eq!(fleet.poison.len(), 1, "one poison record");
    let tomb = LaneRecords::new(fleet.store.clone())
        .read("j0")
        .await
        .unwrap()
        .expect("a tombstone");
    assert!(tomb.poisoned, "{tomb:?}");
    // `poison requeue` sends the original back (as the CLI does): it runs.
    let poison = fleet.poison.messages();
    let record = PoisonRecord::from_message_text(&poison[0].body).unwrap();
    let original = requeue_text(
        record.encoding,
        record.body.as_deref().unwrap(),
        &record.original_id,
    )
    .unwrap();
    fleet.regular.send(&original, Duration::ZERO).await.unwrap();
    wait_until("the requeued job poisoned again", || {
        fleet.poison.len() == 2
    })
    .await;
    assert_eq!(handler.runs(), 2 * max_failures, "the requeued job ran");
    regular.stop().await;
}
