//! Handlers that do not stop when told to (issue 16, item 4): the consumer
//! releases their messages anyway, and whatever they left running writes
//! no result once the delivery is no longer theirs.
//!
//! On the real clock and a multi-thread runtime: the handlers block threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use spot_worker_consumer::{
    Consumer, ConsumerStats, DrainSignals, HandlerError, Job, MessageHandler, handler_fn,
};
use spot_worker_storage::{InMemoryResultStore, PutOutcome, ResultStore, StorageError};
use tokio::task::JoinHandle;

use crate::common::*;

/// Bound on every wait for something that should happen at once.
const SOON: Duration = Duration::from_secs(20);

/// What a blocking thread left behind by a handler got when it tried to
/// write its result.
type WriteOutcome = Result<PutOutcome, StorageError>;

/// A handler that hands its blocking work to the blocking pool and does
/// not watch its cancellation: the work waits for `go`, then writes the
/// result `late.json` through the job's fenced store and reports how that
/// went on `outcome`. `detach` returns at the first sign of wind-down
/// without waiting for the work; otherwise the handler awaits it.
fn leaves_blocking_work(
    results: InMemoryResultStore,
    go: Arc<std::sync::Mutex<mpsc::Receiver<()>>>,
    outcome: mpsc::Sender<WriteOutcome>,
    started: Arc<AtomicBool>,
    detach: bool,
) -> impl MessageHandler {
    handler_fn(move |job: Job| {
        let fenced = job.results(Arc::new(results.clone()));
        let (go, outcome, started) = (go.clone(), outcome.clone(), started.clone());
        async move {
            let runtime = tokio::runtime::Handle::current();
            let work = tokio::task::spawn_blocking(move || {
                started.store(true, Ordering::SeqCst);
                let signalled = go.lock().unwrap().recv_timeout(SOON);
                assert!(signalled.is_ok(), "the test lets the work go on");
                let written = runtime.block_on(fenced.put_new("late.json", b"late"));
                let _ = outcome.send(written);
            });
            if detach {
                job.cancellation().cancelled().await;
                return Err::<(), HandlerError>("interrupted".into());
            }
            work.await?;
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_yields_does_not_hold_up_the_release() {
    let (queue, poison) = queues_holding("stubborn").await;
    let started = Arc::new(AtomicBool::new(false));
    let let_go = Arc::new(AtomicBool::new(false));
    let handler = handler_with(
        (started.clone(), let_go.clone()),
        move |(started, let_go), _job: Job| async move {
            started.store(true, Ordering::SeqCst);
            // Blocks its worker thread and never awaits (bounded, so the
            // test binary does not spin after the test).
            for _ in 0..600 {
                if let_go.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok::<(), HandlerError>(())
        },
    );
    let consumer = consumer(&queue, &poison, config());
    let signals = DrainSignals::new();
    let task = run_in_background(&consumer, handler, &signals);
    wait_until("the handler to start", || started.load(Ordering::SeqCst)).await;

    signals.release();
    let stats = tokio::time::timeout(SOON, task).await;
    let_go.store(true, Ordering::SeqCst);
    let stats = stats
        .expect("the consumer returns without waiting for the handler")
        .unwrap();
    assert_eq!(stats.released, 1);
    let messages = queue.messages();
    assert!(
        messages.len() == 1 && messages[0].visible,
        "the message is visible again at once: {messages:?}"
    );
}

/// A consumer running [`leaves_blocking_work`] on one message, and the
/// handles to let that work write and to learn how it went.
struct LeftBehind {
    consumer: Consumer,
    signals: DrainSignals,
    task: JoinHandle<ConsumerStats>,
    results: InMemoryResultStore,
    go: mpsc::Sender<()>,
    outcome: Arc<std::sync::Mutex<mpsc::Receiver<WriteOutcome>>>,
}

impl LeftBehind {
    async fn start(detach: bool) -> LeftBehind {
        let (queue, poison) = queues_holding("job").await;
        let results = InMemoryResultStore::new("results");
        let (go, go_rx) = mpsc::channel();
        let (outcome_tx, outcome) = mpsc::channel();
        let started = Arc::new(AtomicBool::new(false));
        let handler = leaves_blocking_work(
            results.clone(),
            Arc::new(std::sync::Mutex::new(go_rx)),
            outcome_tx,
            started.clone(),
            detach,
        );
        let consumer = consumer(&queue, &poison, config());
        let signals = DrainSignals::new();
        let task = run_in_background(&consumer, handler, &signals);
        // Taken is not yet running: on a loaded machine the release could
        // come before the handler starts, and then nothing is left behind
        // to test. The work itself says when it runs.
        wait_until("the blocking work to run", || {
            started.load(Ordering::SeqCst)
        })
        .await;
        LeftBehind {
            consumer,
            signals,
            task,
            results,
            go,
            outcome: Arc::new(std::sync::Mutex::new(outcome)),
        }
    }

    /// Lets the work write now, and checks it was refused.
    async fn assert_late_write_refused(&self) {
        self.go.send(()).unwrap();
        let outcome = Arc::clone(&self.outcome);
        let written =
            tokio::task::spawn_blocking(move || outcome.lock().unwrap().recv_timeout(SOON))
                .await
                .unwrap()
                .expect("the blocking work tried to write");
        assert!(
            matches!(written, Err(StorageError::JobCancelled { .. })),
            "refused: {written:?}"
        );
        assert_eq!(self.results.get("late.json").await.unwrap(), None);
    }
}

fn run_in_background(
    consumer: &Consumer,
    handler: impl MessageHandler,
    signals: &DrainSignals,
) -> JoinHandle<ConsumerStats> {
    let (consumer, signals) = (consumer.clone(), signals.clone());
    tokio::spawn(async move { consumer.run_until(handler, signals).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_left_running_at_the_release_writes_no_result() {
    let mut left = LeftBehind::start(false).await;
    left.signals.release();
    let stats = tokio::time::timeout(SOON, &mut left.task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stats.released, 1);
    // Only now, after the release, does the abandoned work write.
    left.assert_late_write_refused().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_a_handler_left_behind_when_it_returned_writes_nothing_after_its_release() {
    let mut left = LeftBehind::start(true).await;
    // Winding down: the handler returns, its message is released by
    // settling (not by the release stage), and its work runs on.
    left.signals.wind_down(None);
    let consumer = left.consumer.clone();
    wait_until("the message released", || consumer.stats().released == 1).await;
    // Before the release stage, which would close every fence anyway.
    left.assert_late_write_refused().await;
    left.signals.release();
    tokio::time::timeout(SOON, &mut left.task)
        .await
        .unwrap()
        .unwrap();
}
