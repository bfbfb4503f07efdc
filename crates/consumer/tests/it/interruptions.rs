//! What the checkpoint interval learns from the consumer: each interrupted
//! delivery counted once, by what it lost (saved at the notice, drained in
//! time without a save after it, a notice too late, no outcome at all),
//! the job time they happened in, and the cost of every save a handler
//! makes; a handler's checkpoint asks the same cadence whether a save is
//! due. The fleet's counts cost storage requests only as stated. In-memory
//! queue and store, tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{ConsumerStats, DrainSignals, HandlerError, Job, handler_fn};
use spot_worker_decisions::cadence::{
    CheckpointCadence, FLUSH_EVERY, Interruption, IntervalSource,
};
use spot_worker_storage::{
    CheckpointStore, FleetLedger, InMemoryCheckpointStore, InMemoryQueue, MessageQueue,
};
use spot_worker_testkit::counting::CountingStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn cadence() -> Arc<CheckpointCadence> {
    Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
        seed_evictions_per_hour: 0.1,
    }))
}

/// Runs `handler` on a consumer of `queue` following `cadence`, with a
/// fresh in-memory store, until one message succeeded.
async fn succeeds_once(
    queue: &InMemoryQueue,
    poison: &InMemoryQueue,
    cadence: &Arc<CheckpointCadence>,
    handler: impl spot_worker_consumer::MessageHandler,
) {
    let running = Running::start(
        consumer(queue, poison, config())
            .with_checkpoints(Arc::new(InMemoryCheckpointStore::new()))
            .with_cadence(cadence.clone()),
        handler,
    );
    running.wait_for("settled", |s| s.succeeded == 1).await;
    running.stop().await;
}

/// Keeps `cadence` and `ledger` in step, as a worker does, until the token
/// returned is cancelled (then the task adds what is left and ends).
fn keeping(
    ledger: FleetLedger,
    cadence: &Arc<CheckpointCadence>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let keeper = tokio::spawn({
        let (cadence, stop) = (cadence.clone(), stop.clone());
        async move {
            ledger
                .keep(cadence, FLUSH_EVERY, stop, Duration::from_secs(1))
                .await;
        }
    });
    (stop, keeper)
}

/// What [`evictable`] does on its cancellation.
const SAVES: u8 = 0;
const DIES: u8 = 1;
const FINISHES: u8 = 2;

/// After a minute of work: finishes if `mode` says [`FINISHES`]; else
/// waits for its cancellation, saves its progress if `mode` says [`SAVES`]
/// (as `primes` does) and returns "interrupted", or returns at once
/// without saving if it says [`DIES`] (a program that dies on its stop
/// signal).
fn evictable(
    runs: Arc<AtomicU32>,
    mode: Arc<AtomicU8>,
) -> impl spot_worker_consumer::MessageHandler {
    handler_fn(move |job: Job| {
        let (runs, mode) = (runs.clone(), mode.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut checkpoint = job.checkpoint().await?;
            tokio::time::sleep(Duration::from_secs(60)).await;
            let mode = mode.load(Ordering::SeqCst);
            if mode == FINISHES {
                return Ok(());
            }
            job.cancellation().cancelled().await;
            if mode == SAVES {
                checkpoint.save_progress(json!({"minutes": 1})).await?;
            }
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
    mode: &Arc<AtomicU8>,
) -> (tokio::task::JoinHandle<ConsumerStats>, DrainSignals) {
    let consumer = consumer(queue, poison, config())
        .with_checkpoints(store.clone())
        .with_cadence(cadence.clone());
    let signals = DrainSignals::new();
    let handler = evictable(runs.clone(), mode.clone());
    let task = tokio::spawn({
        let signals = signals.clone();
        async move { consumer.run_until(handler, signals).await }
    });
    (task, signals)
}

#[tokio::test(start_paused = true)]
async fn every_interruption_is_counted_once_by_its_kind() {
    let (queue, poison) = queues_holding("job").await;
    let store = Arc::new(InMemoryCheckpointStore::new());
    // One cadence for every "VM" below: what the fleet's counts would sum.
    let cadence = cadence();
    let runs = Arc::new(AtomicU32::new(0));
    let mode = Arc::new(AtomicU8::new(SAVES));
    let deliver = |ending: &'static str| {
        let (task, signals) = start_vm(&queue, &poison, &store, &cadence, &runs, &mode);
        (task, signals, ending)
    };
    let endings = [
        "notice in time, saved",
        "notice in time, nothing saved",
        "notice too late",
        "crash",
        "crash",
    ];
    for (n, ending) in endings.into_iter().enumerate() {
        let dies = ending == "notice in time, nothing saved";
        mode.store(if dies { DIES } else { SAVES }, Ordering::SeqCst);
        let (task, signals, ending) = deliver(ending);
        wait_until("the handler runs", || {
            runs.load(Ordering::SeqCst) == n as u32 + 1
        })
        .await;
        if ending != "notice too late" {
            tokio::time::sleep(Duration::from_secs(61)).await;
        }
        match ending {
            "notice in time, saved" | "notice in time, nothing saved" => {
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
    mode.store(FINISHES, Ordering::SeqCst);
    let (task, signals, _) = deliver("success");
    wait_until("deleted", || queue.is_empty()).await;
    signals.release();
    task.await.unwrap();
    let counts = cadence.view().counts;
    assert_eq!(
        (
            counts.drained,
            counts.unsaved,
            counts.late,
            counts.no_outcome
        ),
        (1, 1, 1, 2),
        "{counts:?}"
    );
    // What the two that lost work lost, measured: the one that saved
    // nothing after the notice its 61 s since its start (it had not saved
    // before), the late one nothing (released as it started).
    assert_eq!(counts.losses, 2, "{counts:?}");
    assert!((counts.lost_seconds - 61.0).abs() < 1.0, "{counts:?}");
    // Job time: every delivery's, counted as it ran, the aborted ones'
    // too (the cadence outlives them here; a process that dies loses at
    // most the time since its last addition to the fleet's counts): five
    // ran their minute, the late one none.
    assert!(
        counts.job_seconds >= 5.0 * 60.0 && counts.job_seconds < 5.0 * 60.0 + 10.0,
        "{counts:?}"
    );
    // The finished job's length (its useful work) is counted once.
    assert_eq!(counts.job_lengths.jobs(), 1, "{counts:?}");
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
    let mode = Arc::new(AtomicU8::new(SAVES));
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
            mode.store(FINISHES, Ordering::SeqCst);
        }
        let (task, signals) = start_vm(&queue, &poison, &store, &cadence, &runs, &mode);
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
    let (queue, poison) = queues_holding("job").await;
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(30),
    )));
    let checked = Arc::new(AtomicBool::new(false));
    let handler = handler_with(checked.clone(), move |checked, job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        let not_yet = !checkpoint.is_due();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let due = checkpoint.is_due();
        checkpoint.save_progress(json!({"step": 1})).await?;
        let not_again = !checkpoint.is_due();
        checked.store(not_yet && due && not_again, Ordering::SeqCst);
        Ok::<(), HandlerError>(())
    });
    succeeds_once(&queue, &poison, &cadence, handler).await;
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
    let (stop, keeper) = keeping(FleetLedger::for_queue(counted, "jobs"), &cadence);
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

/// A Rust handler that saves on its own schedule and, cancelled by the
/// notice, returns without saving (the way most batch loops die on
/// SIGTERM) loses its work since its last save: the completion record
/// counts it as redone, not useful, and the fleet's counts record one
/// drain that lost work, with that loss. The same handler saving on its
/// cancellation loses nothing and is counted as saved at the notice.
#[tokio::test(start_paused = true)]
async fn a_handler_that_returns_on_its_cancellation_without_saving_is_counted_by_what_it_lost() {
    // (saves on its cancellation, redone ms, useful ms, saved at the
    // notice, drained without a save, lost s)
    let rows = [(false, 2500, 1500, 0, 1, 2.5), (true, 0, 4000, 1, 0, 0.0)];
    for (saves, redone, useful, drained, unsaved, lost) in rows {
        let (queue, poison) = queues();
        let id = queue.send("job", Duration::ZERO).await.unwrap();
        let store = Arc::new(InMemoryCheckpointStore::new());
        let cadence = cadence();
        let ledger = FleetLedger::for_queue(store.clone(), "jobs");
        let (stop_ledger, keeper) = keeping(ledger.clone(), &cadence);
        let worked = Arc::new(tokio::sync::Notify::new());
        let handler = handler_with(worked.clone(), move |worked, job: Job| async move {
            let mut checkpoint = job.checkpoint().await?;
            if job.dequeue_count() > 1 {
                // The next VM finishes what is left.
                tokio::time::sleep(Duration::from_millis(500)).await;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            checkpoint.save_progress(json!({"step": 16})).await?;
            // 2.5 s of work past the save when the notice comes.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            worked.notify_one();
            job.cancellation().cancelled().await;
            if saves {
                checkpoint.save_progress(json!({"step": 26})).await?;
            }
            Err::<(), HandlerError>("stopped".into())
        });
        let handler = Arc::new(handler);
        let consumer = || {
            consumer(&queue, &poison, config())
                .with_checkpoints(store.clone())
                .with_cadence(cadence.clone())
        };
        let signals = DrainSignals::new();
        let first = tokio::spawn({
            let (consumer, signals, handler) = (consumer(), signals.clone(), handler.clone());
            async move { consumer.run_until(handler, signals).await }
        });
        tokio::time::timeout(Duration::from_secs(60), worked.notified())
            .await
            .expect("the handler worked");
        signals.wind_down(Some(Instant::now() + Duration::from_secs(20)));
        wait_until("released", || {
            queue.messages().iter().filter(|m| m.visible).count() == 1
        })
        .await;
        signals.release();
        first.await.unwrap();
        let second = Running::start(consumer(), handler);
        second.wait_for("finished", |s| s.succeeded == 1).await;
        second.stop().await;
        stop_ledger.cancel();
        keeper.await.unwrap();

        let key = spot_worker_consumer::CompletionRecord::key(id.as_str());
        let record = store
            .read(&key)
            .await
            .unwrap()
            .expect("a completion record");
        let record =
            spot_worker_consumer::CompletionRecord::from_checkpoint(&record.checkpoint, &key)
                .unwrap();
        assert_eq!(
            (record.goodput.redone_ms, record.goodput.useful_ms),
            (redone, useful),
            "saves on its cancellation: {saves}; {record:?}"
        );
        let fleet = ledger.read().await.unwrap();
        assert_eq!(
            (fleet.drained, fleet.unsaved, fleet.late, fleet.no_outcome),
            (drained, unsaved, 0, 0),
            "saves on its cancellation: {saves}; {fleet:?}"
        );
        assert_eq!(fleet.losses, unsaved, "{fleet:?}");
        assert!((fleet.lost_seconds - lost).abs() < 1e-9, "{fleet:?}");
    }
}

/// A handler that says nothing of its job's end (`is_due` after each
/// second of work) on a fleet whose finished jobs took 25 s: its one save
/// is spread to half-way, at 13 s, where Daly's 10 s interval alone saves
/// at 10 and 20 s, the second just before the end.
#[tokio::test(start_paused = true)]
async fn is_due_spreads_a_job_over_what_the_fleets_finished_jobs_took() {
    // (the fleet's finished jobs of 25 s, the seconds of work at each save)
    let rows: [(u32, &[u64]); 2] = [(20, &[13]), (0, &[10, 20])];
    for (finished, expected) in rows {
        let (queue, poison) = queues_holding("job").await;
        // Many losses: Daly's interval is the least, 10 s.
        let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
            seed_evictions_per_hour: 1000.0,
        }));
        let mut fleet = spot_worker_decisions::cadence::InterruptionCounts {
            saves: 1,
            save_seconds: 0.001,
            ..Default::default()
        };
        for _ in 0..finished {
            fleet.job_lengths.add(Duration::from_secs(25));
        }
        cadence.set_fleet(fleet);
        let saved_at = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = handler_with(saved_at.clone(), move |saved_at, job: Job| async move {
            let mut checkpoint = job.checkpoint().await?;
            for second in 1..=25_u64 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if second < 25 && checkpoint.is_due() {
                    checkpoint
                        .save_progress(json!({ "second": second }))
                        .await?;
                    saved_at.lock().unwrap().push(second);
                }
            }
            Ok::<(), HandlerError>(())
        });
        succeeds_once(&queue, &poison, &cadence, handler).await;
        assert_eq!(
            saved_at.lock().unwrap().as_slice(),
            expected,
            "{finished} finished jobs of 25 s"
        );
    }
}
