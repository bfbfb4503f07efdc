//! A job's goodput ledger across its deliveries, as the consumer keeps it:
//! carried by the checkpoint a delivery saves, completed by the tails of
//! deliveries that end without finishing, summed up by the delivery that
//! finishes the job and kept in its completion record. Tokio's paused
//! clock makes the handlers' work (sleeps) exact durations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{CompletionRecord, Consumer, HandlerError, Job, handler_fn};
use spot_worker_decisions::goodput::Ledger;
use spot_worker_storage::{CheckpointStore, InMemoryCheckpointStore, MessageQueue};

use crate::common::*;

/// The ledgers the consumer reported, one per finished job.
fn observed(consumer: Consumer) -> (Consumer, Arc<Mutex<Vec<Ledger>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = consumer.with_goodput_observer({
        let seen = Arc::clone(&seen);
        Arc::new(move |ledger: &Ledger| seen.lock().unwrap().push(*ledger))
    });
    (consumer, seen)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Work of `n` ms (on the paused clock, exactly that).
async fn work(n: u64) {
    tokio::time::sleep(ms(n)).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_deliverys_unsaved_work_is_redone_and_the_rest_useful() {
    let (queue, poison) = queues();
    let store = Arc::new(InMemoryCheckpointStore::new());
    let id = queue.send("job", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        if job.dequeue_count() == 1 {
            work(1000).await;
            checkpoint.save_progress(json!({"step": 1})).await?;
            work(300).await;
            return Err::<(), HandlerError>("crashed after the save".into());
        }
        assert_eq!(checkpoint.progress(), Some(&json!({"step": 1})));
        work(500).await;
        checkpoint.save_progress(json!({"step": 2})).await?;
        work(200).await;
        Ok(())
    });
    let (consumer, seen) =
        observed(consumer(&queue, &poison, config()).with_checkpoints(store.clone()));
    let running = Running::start(consumer, handler);
    running
        .wait_for("the retry succeeded", |s| s.succeeded == 1)
        .await;
    running.stop().await;

    let ledgers = seen.lock().unwrap().clone();
    assert_eq!(ledgers.len(), 1, "{ledgers:?}");
    let ledger = ledgers[0];
    // Saved work and the finishing delivery's are useful; the 300 ms after
    // the first delivery's save were lost and counted as redone.
    assert_eq!(
        (
            ledger.useful_ms,
            ledger.redone_ms,
            ledger.deliveries,
            ledger.saves
        ),
        (1700, 300, 2, 2),
        "{ledger:?}"
    );
    assert_eq!(ledger.unaccounted, 0);
    // Saves and reads in memory take no time on the paused clock.
    assert_eq!((ledger.checkpointing_ms, ledger.waiting_ms), (0, 0));

    // Two deliveries: worth a completion record, which holds the same.
    let key = CompletionRecord::key(id.as_str());
    let stored = store
        .read(&key)
        .await
        .unwrap()
        .expect("a completion record");
    let record = CompletionRecord::from_checkpoint(&stored.checkpoint, &key).unwrap();
    assert_eq!(record.goodput, ledger);
    assert_eq!(record.message_id, id.as_str());
    // The attempt record, tails and all, went with its message.
    assert!(
        store
            .read(&format!(".spot-worker/attempts/{id}"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn a_delivery_cut_without_a_word_keeps_what_it_saved() {
    let (queue, poison) = queues();
    let store = Arc::new(InMemoryCheckpointStore::new());
    queue.send("job", Duration::ZERO).await.unwrap();
    let handler = Arc::new(handler_fn(|job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        if job.dequeue_count() == 1 {
            work(800).await;
            checkpoint.save_progress(json!({"step": 1})).await?;
            work(400).await;
            // Never returns: the process is killed here.
            std::future::pending::<()>().await;
        }
        work(600).await;
        Ok::<(), HandlerError>(())
    }));
    // The first worker is killed mid-job: its task aborted, nothing
    // settled, no tail written.
    let first = Running::start(
        consumer(&queue, &poison, config()).with_checkpoints(store.clone()),
        Arc::clone(&handler),
    );
    // Keyed by the message id: the only checkpoint is the job's.
    wait_until("the first delivery saved", || !store.is_empty()).await;
    work(400).await;
    first.abort();
    // The next worker takes the message once its lease runs out.
    let (consumer, seen) =
        observed(consumer(&queue, &poison, config()).with_checkpoints(store.clone()));
    let second = Running::start(consumer, handler);
    second
        .wait_for("the job finished", |s| s.succeeded == 1)
        .await;
    second.stop().await;

    let ledger = seen.lock().unwrap()[0];
    // The 800 ms the first delivery saved are useful; its 400 ms after the
    // save went unmeasured (the documented blind spot, at most one
    // checkpoint interval), so nothing is redone and nothing is invented.
    assert_eq!(
        (ledger.useful_ms, ledger.redone_ms, ledger.deliveries),
        (1400, 0, 2),
        "{ledger:?}"
    );
    assert_eq!(ledger.unaccounted, 0);
}

#[tokio::test(start_paused = true)]
async fn a_short_job_on_one_delivery_costs_no_completion_record() {
    let (queue, poison) = queues();
    let store = Arc::new(InMemoryCheckpointStore::new());
    queue.send("job", Duration::ZERO).await.unwrap();
    let handler = handler_fn(|_job: Job| async move {
        work(50).await;
        Ok::<(), HandlerError>(())
    });
    let (consumer, seen) =
        observed(consumer(&queue, &poison, config()).with_checkpoints(store.clone()));
    let running = Running::start(consumer, handler);
    running.wait_for("done", |s| s.succeeded == 1).await;
    running.stop().await;
    let ledger = seen.lock().unwrap()[0];
    assert_eq!((ledger.useful_ms, ledger.deliveries), (50, 1));
    assert!(store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_evicted_delivery_that_saved_nothing_reports_its_work_as_redone() {
    let (queue, poison) = queues();
    let store = Arc::new(InMemoryCheckpointStore::new());
    queue.send("job", Duration::ZERO).await.unwrap();
    let (consumer, seen) =
        observed(consumer(&queue, &poison, config()).with_checkpoints(store.clone()));
    // The first delivery works 700 ms, then ignores the wind-down's
    // request to save: its work is lost when the message is released.
    let worked = Arc::new(tokio::sync::Notify::new());
    let stubborn = handler_with(Arc::clone(&worked), move |worked, job: Job| async move {
        work(700).await;
        worked.notify_one();
        job.cancellation().cancelled().await;
        Err::<(), HandlerError>("interrupted, nothing saved".into())
    });
    let signals = spot_worker_consumer::DrainSignals::new();
    let task = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(stubborn, signals).await }
    });
    // The eviction comes the moment the work is done (on the paused clock,
    // no time passes in between).
    tokio::time::timeout(Duration::from_secs(60), worked.notified())
        .await
        .expect("the handler worked");
    signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
    wait_until("released", || consumer.stats().released == 1).await;
    signals.release();
    stopped(task).await;

    let finishing = handler_fn(|_job: Job| async move {
        work(300).await;
        Ok::<(), HandlerError>(())
    });
    let running = Running::start(consumer, finishing);
    running.wait_for("done", |s| s.succeeded == 1).await;
    running.stop().await;
    let ledger = seen.lock().unwrap()[0];
    assert_eq!(
        (
            ledger.useful_ms,
            ledger.redone_ms,
            ledger.deliveries,
            ledger.unaccounted
        ),
        (300, 700, 2, 0),
        "{ledger:?}"
    );
}
