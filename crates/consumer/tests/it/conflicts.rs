//! A noted checkpoint conflict explains only itself: a delivery waits for
//! another holder of its job only when its failure is that conflict on the
//! job's own key. A conflict the handler resolved, or one on another key,
//! leaves its failure counted as usual, and a permanent failure is poisoned
//! at once whatever was noted. In-memory queue, tokio's paused clock.

use std::time::Duration;

use serde_json::{Value, json};
use spot_worker_consumer::{HandlerError, Job, PoisonRecord, permanent};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryCheckpointStore, MessageQueue, StorageError,
    WritePrecondition,
};

use crate::common::*;

/// Another worker (holding a duplicate message) writes `progress` under
/// `key`, after whatever is there.
async fn a_peer_writes(store: &InMemoryCheckpointStore, key: &str, progress: Value) {
    let precondition = match store.read(key).await.unwrap() {
        Some(stored) => WritePrecondition::IfMatch(stored.etag),
        None => WritePrecondition::Create,
    };
    let checkpoint = Checkpoint::InProgress { progress };
    store
        .write(key, &checkpoint, precondition, None)
        .await
        .unwrap();
}

// Issue 16, item 3: before the fix the resolved conflict stayed noted and
// was settled before the permanent failure, so the message waited for a
// peer at every delivery, for ever, at info level.
#[tokio::test(start_paused = true)]
async fn a_permanent_failure_after_a_resolved_conflict_is_poisoned_at_once() {
    let (queue, poison) = queues();
    let id = queue.send("job", Duration::ZERO).await.unwrap();
    let store = InMemoryCheckpointStore::new();
    let handler = handler_with(store.clone(), move |store, job: Job| async move {
        let mut checkpoint = job.checkpoint().await?;
        checkpoint.save_progress(json!(1)).await?;
        a_peer_writes(&store, job.key(), json!(50)).await;
        let lost = checkpoint.save_progress(json!(2)).await.unwrap_err();
        assert!(matches!(lost, StorageError::Conflict { .. }), "{lost}");
        // The handler resolves it: it reloads and builds on the
        // peer's progress...
        let mut reloaded = job.checkpoint().await?;
        reloaded.save_progress(json!(51)).await?;
        // ...then finds the job itself is bad.
        Err::<(), HandlerError>(permanent("row 51 is not a number"))
    });
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.waited_for_peer, stats.retried), (0, 0), "{stats:?}");
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!(record.original_id, id.as_str());
    assert_eq!(record.dequeue_count, 1, "poisoned on its first delivery");
    assert_eq!(
        record.last_error,
        "permanent failure: row 51 is not a number"
    );
}

// Issue 16, item 3: a conflict on a key other than the job's own says
// nothing about the job; before the fix it turned every failure into an
// uncounted wait for a peer, for ever.
#[tokio::test(start_paused = true)]
async fn a_conflict_on_another_key_does_not_excuse_the_jobs_failure() {
    let (queue, poison) = queues_holding("job").await;
    let store = InMemoryCheckpointStore::new();
    let handler = handler_with(store.clone(), move |store, job: Job| async move {
        let mut shared = job.checkpoint_for("shared-index").await?;
        a_peer_writes(&store, "shared-index", json!(job.dequeue_count())).await;
        let lost = shared.save_progress(json!("mine")).await.unwrap_err();
        assert!(matches!(lost, StorageError::Conflict { .. }), "{lost}");
        Err::<(), HandlerError>("the database is down".into())
    });
    let running = Running::with_store(&queue, &poison, &store, handler);
    running.wait_for("poisoned", |s| s.poisoned == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.waited_for_peer, stats.retried), (0, 2), "{stats:?}");
    let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
    assert_eq!((record.dequeue_count, record.failures), (3, 3));
    assert_eq!(
        record.last_error,
        "the handler failed 3 times (max_failures 3); last error: the database is down"
    );
}
