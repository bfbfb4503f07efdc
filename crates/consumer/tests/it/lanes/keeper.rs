//! The lane keeper: the jobs waiting in the Spot lane behind their line go
//! to the regular lane, once each, whatever two keepers racing or a keeper
//! killed mid-move do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::{Envelope, LaneKeeper, Lanes};
use spot_worker_storage::{
    InMemoryLeases, InMemoryQueue, LeaseStore, MessageEncoding, MessageQueue,
};
use spot_worker_testkit::faulty::FaultyQueue;
use tokio_util::sync::CancellationToken;

use super::common::*;

const RECHECK: Duration = Duration::from_secs(1);
/// How long a keeper holds what it receives.
const HOLD: Duration = Duration::from_secs(5);

fn job(key: &str) -> String {
    format!("{{\"job\":\"{key}\"}}")
}

/// A keeper of `lanes` over the fleet's store, keyed like [`Recorder`].
fn keeper(fleet: &Fleet, lanes: Lanes, leases: Arc<dyn LeaseStore>) -> LaneKeeper {
    let store: Arc<dyn spot_worker_storage::CheckpointStore> = fleet.store.clone();
    LaneKeeper::new(
        lanes,
        store,
        leases,
        MessageEncoding::Text,
        Arc::new(|body: &[u8]| body_key(body)),
        HOLD,
    )
}

/// Enqueues `count` jobs j0.. to the Spot lane, each already behind its
/// line (150 s of work due in 200 s, started 100 s ago), and a plain job.
async fn behind(fleet: &Fleet, count: usize) {
    send_plain(&fleet.spot, "plain").await;
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    for i in 0..count {
        enqueue_text(
            &lanes,
            job(&format!("j{i}")).as_bytes(),
            deadline(100, 200, 150),
        )
        .await;
    }
}

/// Runs both lanes' consumers until every job ran to the end; returns
/// how often each job's handler ran.
async fn drain_lanes(fleet: &Fleet, jobs: usize) -> BTreeMap<String, usize> {
    let recorder = Recorder::default();
    let spot = Running::start(fleet.consumer(Lane::Spot, RECHECK), recorder.clone());
    let regular = Running::start(fleet.consumer(Lane::Regular, RECHECK), recorder.clone());
    wait_until("every job finished and every copy settled", || {
        let done = spot.consumer.stats().succeeded + regular.consumer.stats().succeeded;
        done as usize == jobs + 1 && fleet.spot.is_empty() && fleet.regular.is_empty()
    })
    .await;
    // A copy may be settled just after the last job finished: give it a
    // moment, then nothing may be left or have run twice.
    tokio::time::sleep(RECHECK * 3).await;
    spot.stop().await;
    regular.stop().await;
    let mut runs = BTreeMap::new();
    for run in recorder.runs() {
        *runs.entry(run.key).or_insert(0) += 1;
    }
    runs
}

fn generations(queue: &InMemoryQueue) -> Vec<(String, u32)> {
    let mut seen: Vec<(String, u32)> = queue
        .messages()
        .iter()
        .filter_map(|m| {
            let (envelope, body) = Envelope::unwrap(m.body.as_bytes()).ok()?;
            let key = body_key(body)?;
            Some((key, envelope?.generation))
        })
        .collect();
    seen.sort();
    seen
}

#[tokio::test(start_paused = true)]
async fn the_keeper_moves_the_jobs_behind_their_line_and_leaves_the_rest() {
    // d of a minute: a job is on its way to a worker for its first 30 s
    // in the queue (d's queue-wait part), unless it has no slack to spend.
    let fleet = Fleet::new(Duration::from_secs(60));
    send_plain(&fleet.spot, "plain").await;
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    // j-late: 50 s of slack, less than two switches: moved at once.
    enqueue_text(&lanes, job("j-late").as_bytes(), deadline(100, 200, 150)).await;
    // j-fresh: slack to spare, just enqueued: left to the Spot workers.
    enqueue_text(&lanes, job("j-fresh").as_bytes(), deadline(0, 10_000, 100)).await;
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let pass = keeper(&fleet, lanes, leases).pass().await.unwrap();
    assert_eq!(
        (pass.peeked, pass.with_deadline, pass.at_risk),
        (3, 2, 1),
        "{pass:?}"
    );
    assert_eq!(pass.moved, ["j-late"]);
    // Received up to j-late: the plain job in front of it was put back.
    assert_eq!((pass.put_back, pass.discarded), (1, 0));
    assert_eq!(generations(&fleet.regular), [("j-late".to_owned(), 1)]);
    assert_eq!(generations(&fleet.spot), [("j-fresh".to_owned(), 0)]);
    assert_eq!(fleet.spot.len(), 2, "the plain job and j-fresh stay");
    assert!(fleet.spot.messages().iter().all(|m| m.visible));
    // The keeper's look is no delivery: the job runs and finishes as ever.
    let runs = drain_lanes(&fleet, 2).await;
    assert_eq!(
        runs.values().copied().collect::<Vec<_>>(),
        [1, 1, 1],
        "{runs:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn two_keepers_at_once_move_each_job_once() {
    // d of nothing: a job waiting is waiting for Spot at once (the paused
    // clock stops the wall clock the queue wait is measured on).
    let fleet = Fleet::new(Duration::ZERO);
    behind(&fleet, 6).await;
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let stop = CancellationToken::new();
    let mut keepers = Vec::new();
    for _ in 0..2 {
        let keeper = Arc::new(keeper(
            &fleet,
            fleet.lanes(Lane::Spot, RECHECK),
            Arc::clone(&leases),
        ));
        let stop = stop.clone();
        keepers.push(tokio::spawn(async move { keeper.run(stop).await }));
    }
    wait_until("all moved", || fleet.regular.len() == 6).await;
    // A few more passes change nothing.
    tokio::time::sleep(RECHECK * 5).await;
    stop.cancel();
    for keeper in keepers {
        keeper.await.unwrap();
    }
    let moved: Vec<(String, u32)> = (0..6).map(|i| (format!("j{i}"), 1)).collect();
    assert_eq!(generations(&fleet.regular), moved);
    assert_eq!(fleet.spot.len(), 1, "only the plain job is left");
    let runs = drain_lanes(&fleet, 6).await;
    assert!(runs.values().all(|&n| n == 1), "{runs:?}");
}

#[tokio::test(start_paused = true)]
async fn keepers_racing_over_one_message_still_run_the_job_once() {
    // Keeper a's send is so slow that the message it holds reappears and
    // keeper b takes it over: both send it. The second copy is discarded
    // unrun.
    let fleet = Fleet::new(Duration::ZERO);
    behind(&fleet, 1).await;
    let slow = FaultyQueue::new(fleet.regular.clone());
    slow.faults()
        .send_delay_ms
        .store(HOLD.as_millis() as u64 * 2, Ordering::SeqCst);
    let slow_lanes = Lanes {
        regular: Arc::new(slow),
        ..fleet.lanes(Lane::Spot, RECHECK)
    };
    let (a_leases, b_leases): (Arc<dyn LeaseStore>, Arc<dyn LeaseStore>) = (
        Arc::new(InMemoryLeases::new()),
        Arc::new(InMemoryLeases::new()),
    );
    let a = keeper(&fleet, slow_lanes, a_leases);
    let b = keeper(&fleet, fleet.lanes(Lane::Spot, RECHECK), b_leases);
    let a_pass = tokio::spawn(async move { a.pass().await });
    tokio::time::sleep(HOLD + Duration::from_secs(1)).await;
    let b_pass = b.pass().await.unwrap();
    assert_eq!(b_pass.moved, ["j0"], "b finished the move a began");
    let a_pass = a_pass.await.unwrap().unwrap();
    assert_eq!(a_pass.moved, ["j0"], "a sent it too");
    assert_eq!(
        generations(&fleet.regular),
        [("j0".to_owned(), 1), ("j0".to_owned(), 1)]
    );
    let runs = drain_lanes(&fleet, 1).await;
    assert_eq!(runs.get("j0"), Some(&1), "{runs:?}");
    assert_eq!(fleet.messages(), 0);
}

/// Kills a keeper's pass at `kill` and checks that the jobs then run once
/// each, nothing lost, nothing left.
async fn killed_mid_move(kill: Kill) {
    let fleet = Fleet::new(Duration::ZERO);
    behind(&fleet, 3).await;
    let faulty = FaultyQueue::new(fleet.regular.clone());
    let regular: Arc<dyn MessageQueue> = match kill {
        Kill::AfterSend => {
            faulty
                .faults()
                .sends_hang_after_landing
                .store(true, Ordering::SeqCst);
            Arc::new(faulty.clone())
        }
        // Killed after writing the lane record's intent, before the send.
        Kill::BeforeSend => {
            faulty
                .faults()
                .send_delay_ms
                .store(u64::MAX / 4, Ordering::SeqCst);
            Arc::new(faulty.clone())
        }
    };
    let lanes = Lanes {
        regular,
        ..fleet.lanes(Lane::Spot, RECHECK)
    };
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let doomed = keeper(&fleet, lanes, leases);
    let pass = tokio::spawn(async move { doomed.pass().await });
    wait_until("the first move's send began", || {
        faulty.faults().calls().3 == 1
    })
    .await;
    if kill == Kill::AfterSend {
        assert_eq!(fleet.regular.len(), 1, "its send landed");
    }
    pass.abort();
    let _ = pass.await;
    // What it held reappears after its hold; both lanes' workers take over.
    tokio::time::sleep(HOLD).await;
    let runs = drain_lanes(&fleet, 3).await;
    let expected: BTreeMap<String, usize> = (0..3).map(|i| (format!("j{i}"), 1)).collect();
    assert_eq!(
        runs.into_iter()
            .filter(|(k, _)| k.starts_with('j'))
            .collect::<BTreeMap<_, _>>(),
        expected
    );
    assert_eq!(fleet.messages(), 0, "no copy left anywhere");
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kill {
    BeforeSend,
    AfterSend,
}

#[tokio::test(start_paused = true)]
async fn a_keeper_killed_after_its_send_loses_and_duplicates_nothing() {
    killed_mid_move(Kill::AfterSend).await;
}

#[tokio::test(start_paused = true)]
async fn a_keeper_killed_before_its_send_loses_and_duplicates_nothing() {
    killed_mid_move(Kill::BeforeSend).await;
}

/// A job that waits in the Spot lane longer than the usual queue wait (0
/// here) with no Spot worker heard from since it was sent tells the keeper
/// the Spot pool was asked for a VM and none came: Spot capacity is gone.
/// One sent before a Spot worker was last heard from says nothing.
#[tokio::test]
async fn a_job_nobody_takes_tells_the_keeper_spot_is_gone() {
    let fleet = Fleet::new(Duration::ZERO);
    send_plain(&fleet.spot, "before").await;
    fleet.spot_worker_runs().await;
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let keeper = keeper(&fleet, fleet.lanes(Lane::Spot, RECHECK), leases);
    keeper.pass().await.unwrap();
    let seen = fleet.spot_capacity.fleet().read().await.unwrap();
    assert!(
        seen.history.is_there(),
        "sent before the last word: {seen:?}"
    );
    // Sent now, after the word (at least a millisecond on).
    tokio::time::sleep(Duration::from_millis(5)).await;
    send_plain(&fleet.spot, "after").await;
    keeper.pass().await.unwrap();
    let seen = fleet.spot_capacity.fleet().read().await.unwrap();
    assert!(!seen.history.is_there(), "nobody took it: {seen:?}");
    assert!(!fleet.spot_capacity.there());
    assert_eq!(fleet.spot.len(), 2, "nothing moved or taken");
}

/// Issue 37, item 4: a pass longer than the keeper's lease (each move's
/// send takes 12 s, four moves; the lease lasts 30 s) keeps the lease, so
/// no second keeper starts a pass over the same queue meanwhile (before:
/// renewed only between passes, free 30 s into this one).
#[tokio::test(start_paused = true)]
async fn a_long_pass_keeps_the_keepers_lease() {
    let fleet = Fleet::new(Duration::ZERO);
    behind(&fleet, 4).await;
    let slow = FaultyQueue::new(fleet.regular.clone());
    slow.faults().send_delay_ms.store(12_000, Ordering::SeqCst);
    let lanes = Lanes {
        regular: Arc::new(slow.clone()),
        ..fleet.lanes(Lane::Spot, RECHECK)
    };
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let keeper = Arc::new(keeper(&fleet, lanes, Arc::clone(&leases)));
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let (keeper, stop) = (Arc::clone(&keeper), stop.clone());
        async move { keeper.run(stop).await }
    });
    wait_until("the pass's first send began", || {
        slow.faults().calls().3 == 1
    })
    .await;
    let mut looked = 0;
    while fleet.regular.len() < 4 {
        assert!(looked < 120, "the pass did not end");
        let taken = leases
            .acquire(spot_worker_lanes::KEEPER_LEASE, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(
            taken.is_none(),
            "the lease was free {looked} s into the pass"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        looked += 1;
    }
    assert!(looked > 30, "the pass outlasted the lease ({looked} s)");
    stop.cancel();
    running.await.unwrap();
}

/// Issue 37, item 3: a job that waits unrun keeps its checkpoint files
/// past the container's retention when its message is moved (a fresh
/// time-to-live): the move dates them anew. Saved on day 0 under a 7-day
/// rule that runs daily, moved by the keeper on day 6, restored on day
/// 12 (before: the rule removed its chunks on day 8, dated by their
/// upload, and the restore failed "the chunk … is missing").
#[tokio::test(start_paused = true)]
async fn a_job_moved_while_it_waits_keeps_its_checkpoint_files_past_the_retention() {
    use spot_worker_storage::files::CheckpointFiles;
    use spot_worker_storage::{CheckpointStore, JobCheckpoint};

    let fleet = Fleet::new(Duration::from_secs(60));
    let store: Arc<dyn CheckpointStore> = fleet.store.clone();
    let chunks = fleet.store.chunk_store();
    let retention = Duration::from_secs(7 * 24 * 3600);
    let day = Duration::from_secs(24 * 3600);
    let waits_a_day = || {
        chunks.advance_clock(day);
        chunks.expire_older_than(retention);
    };
    let saved = tempfile::tempdir().unwrap();
    let weights: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(saved.path().join("weights"), &weights).unwrap();
    let mut holder = JobCheckpoint::load(store.clone(), "j-late").await.unwrap();
    holder
        .save_files(&CheckpointFiles::dir(saved.path()))
        .await
        .unwrap();
    let before = fleet.store.read("j-late").await.unwrap().unwrap();
    let lanes = fleet.lanes(Lane::Spot, RECHECK);
    enqueue_text(&lanes, job("j-late").as_bytes(), deadline(100, 200, 150)).await;
    for _ in 0..6 {
        waits_a_day();
    }
    let leases: Arc<dyn LeaseStore> = Arc::new(InMemoryLeases::new());
    let pass = keeper(&fleet, lanes, leases).pass().await.unwrap();
    assert_eq!(pass.moved, ["j-late"]);
    // The manifest was written again, dated anew, its stamp (the job's
    // progress as the lane rule reads it) kept.
    let after = fleet.store.read("j-late").await.unwrap().unwrap();
    assert_ne!(after.etag, before.etag, "the manifest was dated anew");
    assert_eq!(after.stamp, before.stamp);
    for _ in 0..6 {
        waits_a_day();
    }
    let into = tempfile::tempdir().unwrap();
    let mut resumed = JobCheckpoint::load(store, "j-late").await.unwrap();
    let restored = resumed
        .restore_files(&CheckpointFiles::dir(into.path()))
        .await
        .expect("every chunk the manifest names outlived the wait")
        .expect("a manifest is stored");
    assert_eq!(restored.files, 1);
    assert_eq!(std::fs::read(into.path().join("weights")).unwrap(), weights);
}
