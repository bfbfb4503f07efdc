//! The crash-loop guard counts only what it knows: deliveries without a
//! recorded outcome. An attempt record it cannot read (the store is out)
//! is not taken for one without outcomes. In-memory queue, tokio's paused
//! clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{HandlerError, Job};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryCheckpointStore, MessageQueue, WritePrecondition,
};
use spot_worker_testkit::counting::CountingStore;

use crate::common::*;

// Issue 16, item 10: before the fix a record that could not be read at
// arrival counted as empty, so ten recorded waits for a peer became ten
// deliveries without an outcome and the guard poisoned the message: a
// storage outage poisoned a message.
#[tokio::test(start_paused = true)]
async fn an_outage_at_arrival_never_lets_the_crash_loop_guard_poison() {
    let (queue, poison) = queues();
    let id = queue.send("job", Duration::ZERO).await.unwrap();
    // Ten earlier deliveries, each of which recorded a wait for a peer.
    for _ in 0..10 {
        let message = queue.receive(1, VISIBILITY).await.unwrap().remove(0);
        queue
            .update_visibility(&message.id, &message.pop_receipt, Duration::ZERO)
            .await
            .unwrap();
    }
    let inner = InMemoryCheckpointStore::new();
    let record = Checkpoint::InProgress {
        progress: json!({"failures": 0, "waits": 10}),
    };
    inner
        .write(
            &format!(".spot-worker/attempts/{id}"),
            &record,
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    inner.set_available(false);
    let store = CountingStore::new(inner.clone());
    let runs = Arc::new(AtomicU32::new(0));
    let handler = handler_with(runs.clone(), move |runs, _job: Job| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<(), HandlerError>(())
    });
    // The 11th delivery is past max_deliveries (10): the guard is consulted.
    let running = Running::with_store(&queue, &poison, &store, handler);
    wait_until("the record and the checkpoint asked for", || {
        store.calls().reads() >= 2
    })
    .await;
    inner.set_available(true);
    running
        .wait_for("settled", |s| s.succeeded + s.poisoned > 0)
        .await;
    let stats = running.stop().await;
    assert_eq!((stats.succeeded, stats.poisoned), (1, 0), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(queue.is_empty() && poison.is_empty());
}

// Issue 16, item 10: deliveries that each waited for the store leave no
// record (it would live in that store), so the guard is what stops them;
// its reason says what it knows, not "the worker died or was evicted".
#[tokio::test(start_paused = true)]
async fn deliveries_that_keep_waiting_for_the_store_are_poisoned_by_the_guard_saying_so() {
    let (queue, poison) = queues_holding("job").await;
    let store = InMemoryCheckpointStore::new();
    let handler = handler_with(store.clone(), move |store, job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        // The store drops out just for this job's write, every time.
        store.set_available(false);
        let saved = checkpoint.save_progress(json!(1)).await;
        store.set_available(true);
        saved?;
        Ok::<(), HandlerError>(())
    });
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!(
        (stats.waited_for_store, stats.retried),
        (10, 0),
        "{stats:?}"
    );
    let record: spot_worker_consumer::PoisonRecord =
        serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!((record.dequeue_count, record.failures), (11, 0));
    assert_eq!(
        record.last_error,
        "crash-loop guard: delivered 11 times without an outcome (no failure, wait for a \
         peer or release recorded), more than max_deliveries 10"
    );
}
