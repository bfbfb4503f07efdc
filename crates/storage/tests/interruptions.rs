//! What the checkpoint interval learns from the consumer: each interrupted
//! delivery counted once, by kind (drained in time, a notice too late, no
//! outcome at all), the job time they happened in, and the cost of every
//! save a handler makes; a handler's checkpoint asks the same cadence
//! whether a save is due. The fleet's counts cost storage requests only as
//! stated. In-memory queue and store, tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_decisions::cadence::{
    CheckpointCadence, FLUSH_EVERY, Interruption, IntervalSource,
};
use spot_worker_storage::{
    CheckpointStore, ConsumerStats, DrainSignals, FleetLedger, HandlerError,
    InMemoryCheckpointStore, InMemoryQueue, Job, MessageQueue, handler_fn,
};
use spot_worker_testkit::counting::CountingStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod common;

use common::*;

fn cadence() -> Arc<CheckpointCadence> {
    Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
        seed_evictions_per_hour: 0.1,
    }))
}

/// Waits for its cancellation and returns "interrupted" (as `primes`
/// does) after a minute of work, unless `finish` is set.
fn evictable(
    runs: Arc<AtomicU32>,
    finish: Arc<AtomicBool>,
) -> impl spot_worker_storage::MessageHandler {
    handler_fn(move |job: Job| {
        let (runs, finish) = (runs.clone(), finish.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(60)).await;
            if finish.load(Ordering::SeqCst) {
                return Ok(());
            }
            job.cancellation().cancelled().await;
            Err::<(), HandlerError>("interrupted".into())
        }
    })
}

/// One "VM": a consumer of `queue` running [`evictable`] on `store`,
/// following `cadence` (shared by every VM: what the fleet's counts would
/// sum), until its drain signals say.
fn start_vm(
    queue: &InMemoryQueue,
    poison: &InMemoryQueue,
    store: &Arc<InMemoryCheckpointStore>,
    cadence: &Arc<CheckpointCadence>,
    runs: &Arc<AtomicU32>,
    finish: &Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<ConsumerStats>, DrainSignals) {
    let consumer = consumer(queue, poison, config())
        .with_checkpoints(store.clone())
        .with_cadence(cadence.clone());
    let signals = DrainSignals::new();
    let handler = evictable(runs.clone(), finish.clone());
    let task = tokio::spawn({
        let signals = signals.clone();
        async move { consumer.run_until(handler, signals).await }
    });
    (task, signals)
}

#[tokio::test(start_paused = true)]
async fn every_interruption_is_counted_once_by_its_kind() {
    let (queue, poison) = queues();
    queue.send("job", Duration::ZERO).await.unwrap();
    let store = Arc::new(InMemoryCheckpointStore::new());
    // One cadence for every "VM" below: what the fleet's counts would sum.
    let cadence = cadence();
    let runs = Arc::new(AtomicU32::new(0));
    let finish = Arc::new(AtomicBool::new(false));
    let deliver = |ending: &'static str| {
        let (task, signals) = start_vm(&queue, &poison, &store, &cadence, &runs, &finish);
        (task, signals, ending)
    };
    let endings = ["notice in time", "notice too late", "crash", "crash"];
    for (n, ending) in endings.into_iter().enumerate() {
        let (task, signals, ending) = deliver(ending);
        wait_until("the handler runs", || {
            runs.load(Ordering::SeqCst) == n as u32 + 1
        })
        .await;
        if ending != "notice too late" {
            tokio::time::sleep(Duration::from_secs(61)).await;
        }
        match ending {
            "notice in time" => {
                signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
                wait_until("released", || {
                    queue.messages().iter().filter(|m| m.visible).count() == 1
                })
                .await;
                signals.release();
                task.await.unwrap();
            }
            "notice too late" => {
                // Mid-work, no time to save: released at once, the
                // handler dropped before it saw its cancellation.
                signals.release();
                task.await.unwrap();
            }
            _ => {
                // The process dies: nothing settles or is recorded; the
                // message comes back when its lease runs out.
                task.abort();
                let _ = task.await;
            }
        }
    }
    finish.store(true, Ordering::SeqCst);
    let (task, signals, _) = deliver("success");
    wait_until("deleted", || queue.is_empty()).await;
    signals.release();
    task.await.unwrap();
    let counts = cadence.view().counts;
    assert_eq!(
        (counts.drained, counts.late, counts.no_outcome),
        (1, 1, 2),
        "{counts:?}"
    );
    // Job time: every delivery's, counted as it ran, the aborted ones'
    // too (the cadence outlives them here; a process that dies loses at
    // most the time since its last addition to the fleet's counts): four
    // ran their minute, the late one none.
    assert!(
        counts.job_seconds >= 4.0 * 60.0 && counts.job_seconds < 4.0 * 60.0 + 10.0,
        "{counts:?}"
    );
    assert!(poison.is_empty());
    // What stays is the job's completion record (five deliveries: worth
    // one, see `goodput`), nothing else.
    let left: Vec<String> = store
        .keys()
        .into_iter()
        .filter(|key| !key.starts_with(spot_worker_storage::COMPLETION_RECORD_PREFIX))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A worker that saw a notice too late and was killed before it could
/// release the message (the VM gone seconds after a `Started` event)
/// counts nothing itself; its release note, written as the wind-down
/// began, is what the next delivery finds: a late notice, not a crash.
/// One killed before its note leaves nothing to tell it from a crash.
#[tokio::test(start_paused = true)]
async fn a_late_notice_whose_worker_was_killed_is_counted_late_by_the_next_delivery() {
    let (queue, poison) = queues();
    let id = queue.send("job", Duration::ZERO).await.unwrap();
    let store = Arc::new(InMemoryCheckpointStore::new());
    let cadence = cadence();
    let runs = Arc::new(AtomicU32::new(0));
    let finish = Arc::new(AtomicBool::new(false));
    let releases_noted = || {
        store
            .get(&format!(".spot-worker/attempts/{id}"))
            .and_then(|record| match record {
                spot_worker_storage::Checkpoint::InProgress { progress } => {
                    progress["releases"].as_u64()
                }
                _ => None,
            })
            .unwrap_or(0)
    };
    for (n, noted) in [(1, true), (2, false), (3, true)] {
        if n == 3 {
            finish.store(true, Ordering::SeqCst);
        }
        let (task, signals) = start_vm(&queue, &poison, &store, &cadence, &runs, &finish);
        wait_until("the handler runs", || runs.load(Ordering::SeqCst) == n).await;
        if n == 3 {
            wait_until("deleted", || queue.is_empty()).await;
            signals.release();
            task.await.unwrap();
            break;
        }
        if noted {
            // A notice already `Started`: a second to go; the note is
            // written, then the process dies before the release.
            let before = releases_noted();
            signals.wind_down(Some(Instant::now() + Duration::from_secs(1)));
            wait_until("the release noted", || releases_noted() == before + 1).await;
        }
        task.abort();
        let _ = task.await;
    }
    let counts = cadence.view().counts;
    assert_eq!(
        (counts.drained, counts.late, counts.no_outcome),
        (0, 1, 1),
        "{counts:?}"
    );
    assert!(poison.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_handlers_checkpoint_asks_the_workers_cadence_and_measures_its_saves() {
    let (queue, poison) = queues();
    queue.send("job", Duration::ZERO).await.unwrap();
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(30),
    )));
    let checked = Arc::new(AtomicBool::new(false));
    let handler = handler_fn({
        let checked = checked.clone();
        move |job: Job| {
            let checked = checked.clone();
            async move {
                let mut checkpoint = job.checkpoint().await?;
                let not_yet = !checkpoint.is_due();
                tokio::time::sleep(Duration::from_secs(30)).await;
                let due = checkpoint.is_due();
                checkpoint.save_progress(json!({"step": 1})).await?;
                let not_again = !checkpoint.is_due();
                checked.store(not_yet && due && not_again, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        }
    });
    let running = Running::start(
        consumer(&queue, &poison, config())
            .with_checkpoints(Arc::new(InMemoryCheckpointStore::new()))
            .with_cadence(cadence.clone()),
        handler,
    );
    running.wait_for("settled", |s| s.succeeded == 1).await;
    running.stop().await;
    assert!(
        checked.load(Ordering::SeqCst),
        "due after 30 s, not before, not after a save"
    );
    let view = cadence.view();
    assert_eq!((view.cost.saves, view.cost.requests), (1, 1));
    assert!(view.cost.bytes > 0);
    assert_eq!(view.counts.saves, 1);
    assert!(view.explicit);
}

/// The fleet's counts cost one read as a worker starts, then a read and a
/// write per [`FLUSH_EVERY`] (an hour), and a last read and write as it
/// stops: 2 + 2·H requests in H hours.
#[tokio::test(start_paused = true)]
async fn keeping_the_fleets_counts_costs_two_requests_per_worker_hour() {
    let inner = InMemoryCheckpointStore::new();
    let store = CountingStore::new(inner);
    let counted: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let cadence = cadence();
    let stop = CancellationToken::new();
    let keeper = tokio::spawn({
        let (cadence, stop) = (cadence.clone(), stop.clone());
        async move {
            FleetLedger::new(counted)
                .keep(cadence, FLUSH_EVERY, stop, Duration::from_secs(1))
                .await;
        }
    });
    const HOURS: u64 = 10;
    // Counting mid-hour, so each hourly addition has one hour's counts.
    tokio::time::sleep(FLUSH_EVERY / 2).await;
    for _ in 0..HOURS {
        cadence.note(Interruption::Drained);
        cadence.add_job_time(Duration::from_secs(3600));
        tokio::time::sleep(FLUSH_EVERY).await;
    }
    // Past the last hourly addition: a late notice's count, added as the
    // worker stops.
    cadence.note(Interruption::Late);
    stop.cancel();
    keeper.await.unwrap();
    let calls = store.calls();
    assert_eq!(calls.fleet(), 1 + 2 * HOURS + 2, "{calls:?}");
    assert_eq!(calls.reads() + calls.writes(), 0, "{calls:?}");
    let counts = cadence.view().counts;
    assert_eq!((counts.drained, counts.late), (HOURS, 1));
    assert_eq!(counts.job_hours(), HOURS as f64);
}
