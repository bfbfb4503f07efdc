//! Contract tests: what every implementation of a storage trait must do,
//! written once and run against each backend (the in-memory stores in
//! `spot-worker-storage`'s tests, the blob stores on a real Azurite in
//! `spot-worker-azure`'s), so the in-memory double cannot drift from the
//! real service.
//!
//! Each function takes a fresh, empty store and panics, naming the broken
//! property, at the first thing the store gets wrong. Backend-specific
//! behaviour (blob naming, listing, throttling, outages) stays in the
//! backend's own tests.

mod files;

pub use files::{checkpoint_files, chunk_store, listed_chunk_names, pseudo_random, until_gone};

use std::sync::Arc;

use serde_json::json;
use spot_worker_decisions::cadence::{Interruption, InterruptionCounts};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, FleetLedger, JobCheckpoint, PutOutcome, ResultStore,
    StorageError, StoredCheckpoint, WritePrecondition,
};

/// Runs the [`CheckpointStore`] contract against `store`, fresh and empty:
/// ETag-fenced reads and writes (If-None-Match and If-Match conflicts),
/// keys with slashes, the write stamp's round trip, completed checkpoints,
/// delete, listing a prefix, [`JobCheckpoint`] fencing out a stale handle, and the fleet's
/// interruption counts merged from racing additions.
pub async fn checkpoint_store(store: Arc<dyn CheckpointStore>) {
    // Prepare creates what is missing; a second call is harmless.
    store.prepare().await.expect("prepare");
    store.prepare().await.expect("prepare is idempotent");
    writes_are_fenced_by_etags(store.as_ref()).await;
    stamps_are_kept_with_the_checkpoint_and_replaced_by_every_write(store.as_ref()).await;
    completed_checkpoints_read_back_as_completed(store.as_ref()).await;
    delete_removes_and_is_idempotent(store.as_ref()).await;
    list_finds_the_keys_under_a_prefix_in_name_order(store.as_ref()).await;
    a_stale_handle_writing_the_same_progress_is_still_fenced_out(Arc::clone(&store)).await;
    fleet_counts_added_at_once_by_many_workers_all_count(store).await;
}

/// [`CheckpointStore::list`]: the keys under a prefix, in name order,
/// keys with slashes included and deleted ones gone; a prefix nothing has
/// lists nothing.
async fn list_finds_the_keys_under_a_prefix_in_name_order(store: &dyn CheckpointStore) {
    let prefix = "contract-list/";
    let checkpoint = Checkpoint::InProgress {
        progress: json!({}),
    };
    for key in ["w2/heard-2", "w1/evicted-3", "w1/heard-1"] {
        store
            .write(
                &format!("{prefix}{key}"),
                &checkpoint,
                WritePrecondition::Create,
                None,
            )
            .await
            .expect("write a record to list");
    }
    store
        .write(
            "contract-lisT",
            &checkpoint,
            WritePrecondition::Create,
            None,
        )
        .await
        .expect("write a record beside the prefix");
    let listed = store.list(prefix).await.expect("list");
    assert_eq!(
        listed,
        [
            format!("{prefix}w1/evicted-3"),
            format!("{prefix}w1/heard-1"),
            format!("{prefix}w2/heard-2"),
        ],
        "the keys under the prefix, in name order, and no other"
    );
    store
        .delete(&format!("{prefix}w1/heard-1"))
        .await
        .expect("delete");
    assert_eq!(
        store.list(prefix).await.expect("list").len(),
        2,
        "a deleted key is not listed"
    );
    assert!(
        store.list("contract-none/").await.expect("list").is_empty(),
        "a prefix nothing has lists nothing"
    );
}

/// The fleet's interruption counts ([`FleetLedger`]) on top of the store's
/// ETag fencing: additions racing from several workers are all kept, none
/// twice.
async fn fleet_counts_added_at_once_by_many_workers_all_count(store: Arc<dyn CheckpointStore>) {
    const WORKERS: u64 = 4;
    let ledger = FleetLedger::for_queue(store, "jobs");
    let mut racing = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let ledger = ledger.clone();
        racing.spawn(async move {
            let mut delta = InterruptionCounts {
                job_seconds: 3600.0,
                ..InterruptionCounts::default()
            };
            delta.count(Interruption::Drained);
            if worker % 2 == 0 {
                delta.count(Interruption::NoOutcome);
            } else {
                delta.count(Interruption::Unsaved);
                delta.count_loss(std::time::Duration::from_millis(2500));
            }
            delta
                .job_lengths
                .add(std::time::Duration::from_secs(8 * 3600));
            ledger.add(&delta).await
        });
    }
    while let Some(added) = racing.join_next().await {
        added
            .expect("an adding task")
            .expect("an addition that lost a race is retried, not refused");
    }
    let total = ledger.read().await.expect("read the fleet's counts");
    assert_eq!(
        (total.drained, total.no_outcome, total.job_hours()),
        (WORKERS, WORKERS / 2, WORKERS as f64),
        "every racing addition counts once: {total:?}"
    );
    // What the losing ones lost, and the finished jobs' lengths, too.
    assert_eq!(
        (total.unsaved, total.losses, total.lost_seconds),
        (WORKERS / 2, WORKERS / 2, 2.5 * (WORKERS / 2) as f64),
        "{total:?}"
    );
    assert_eq!(total.job_lengths.jobs(), WORKERS, "{total:?}");
}

/// Runs the [`ResultStore`] contract against `store`, fresh and empty:
/// results are create-only, an identical rewrite (by `racer`, another
/// worker's handle on the same store) writes nothing and succeeds, a
/// different one conflicts, names may hold slashes, bodies may be empty,
/// and an empty name is refused.
pub async fn result_store(store: &dyn ResultStore, racer: &dyn ResultStore) {
    store.prepare().await.expect("prepare");
    store.prepare().await.expect("prepare is idempotent");
    assert_eq!(
        store.get("j1.json").await.unwrap(),
        None,
        "a missing result"
    );
    let body = br#"{"job_id":"j1","primes":25}"#;
    assert_eq!(
        store.put_new("j1.json", body).await.unwrap(),
        PutOutcome::Created
    );
    // A second worker that computed the same thing: fine, nothing written.
    assert_eq!(
        racer.put_new("j1.json", body).await.unwrap(),
        PutOutcome::AlreadyExistsIdentical
    );
    // A different result never replaces the first one.
    let err = racer
        .put_new("j1.json", br#"{"job_id":"j1","primes":26}"#)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::Conflict {
            key: "j1.json".into()
        }
    );
    assert_eq!(
        store.get("j1.json").await.unwrap().as_deref(),
        Some(&body[..])
    );
    // Names may contain slashes (virtual directories); empty bodies are fine.
    store.put_new("batch/7/empty", b"").await.unwrap();
    assert_eq!(store.get("batch/7/empty").await.unwrap(), Some(Vec::new()));
    assert!(matches!(
        store.put_new("", b"x").await,
        Err(StorageError::InvalidArgument(_))
    ));
}

fn progress(n: u64) -> Checkpoint {
    Checkpoint::InProgress {
        progress: json!({"rows": n}),
    }
}

fn stored(checkpoint: Checkpoint, etag: ETag, stamp: Option<&str>) -> StoredCheckpoint {
    StoredCheckpoint {
        checkpoint,
        etag,
        stamp: stamp.map(str::to_owned),
    }
}

async fn writes_are_fenced_by_etags(store: &dyn CheckpointStore) {
    assert_eq!(store.read("job-1").await.unwrap(), None);
    let created = store
        .write("job-1", &progress(1), WritePrecondition::Create, None)
        .await
        .unwrap();
    // If-None-Match: * refuses a second create.
    let again = store
        .write("job-1", &progress(9), WritePrecondition::Create, None)
        .await
        .unwrap_err();
    assert_eq!(
        again,
        StorageError::Conflict {
            key: "job-1".into()
        }
    );
    let updated = store
        .write(
            "job-1",
            &progress(2),
            WritePrecondition::IfMatch(created.clone()),
            None,
        )
        .await
        .unwrap();
    assert_ne!(updated, created, "every write changes the ETag");
    // A worker still holding the old ETag cannot overwrite newer progress.
    let stale = store
        .write(
            "job-1",
            &progress(1),
            WritePrecondition::IfMatch(created),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(stale, StorageError::Conflict { .. }), "{stale:?}");
    // Resume: the latest progress and its ETag.
    assert_eq!(
        store.read("job-1").await.unwrap(),
        Some(stored(progress(2), updated.clone(), None))
    );
    // If-Match on a checkpoint that does not exist conflicts too.
    let missing = store
        .write(
            "job-2",
            &progress(1),
            WritePrecondition::IfMatch(updated),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(missing, StorageError::Conflict { .. }),
        "{missing:?}"
    );
    // Keys may contain slashes (virtual directories).
    store
        .write(
            "tenant/a/job-3",
            &progress(3),
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .read("tenant/a/job-3")
            .await
            .unwrap()
            .unwrap()
            .checkpoint,
        progress(3)
    );
}

async fn stamps_are_kept_with_the_checkpoint_and_replaced_by_every_write(
    store: &dyn CheckpointStore,
) {
    let first = store
        .write(
            "stamped",
            &progress(1),
            WritePrecondition::Create,
            Some("w:1"),
        )
        .await
        .unwrap();
    assert_eq!(
        store.read("stamped").await.unwrap(),
        Some(stored(progress(1), first.clone(), Some("w:1")))
    );
    // A plain write leaves no stale stamp behind.
    let second = store
        .write(
            "stamped",
            &progress(2),
            WritePrecondition::IfMatch(first),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        store.read("stamped").await.unwrap(),
        Some(stored(progress(2), second, None))
    );
}

async fn completed_checkpoints_read_back_as_completed(store: &dyn CheckpointStore) {
    let done = Checkpoint::Completed {
        result: json!({"total": 7}),
    };
    let etag = store
        .write("done", &done, WritePrecondition::Create, Some("w:3"))
        .await
        .unwrap();
    let read = store
        .read("done")
        .await
        .unwrap()
        .expect("the completed job");
    assert!(read.checkpoint.is_completed());
    assert_eq!(read, stored(done, etag, Some("w:3")));
}

async fn delete_removes_and_is_idempotent(store: &dyn CheckpointStore) {
    store
        .write("gone", &progress(1), WritePrecondition::Create, None)
        .await
        .unwrap();
    store.delete("gone").await.expect("delete");
    assert_eq!(store.read("gone").await.unwrap(), None);
    store
        .delete("gone")
        .await
        .expect("deleting what does not exist succeeds");
    // Gone means gone: a new first write is a create again.
    store
        .write("gone", &progress(2), WritePrecondition::Create, None)
        .await
        .expect("create after delete");
}

async fn a_stale_handle_writing_the_same_progress_is_still_fenced_out(
    store: Arc<dyn CheckpointStore>,
) {
    let mut owner = JobCheckpoint::load(store.clone(), "job").await.unwrap();
    let mut stale = JobCheckpoint::load(store.clone(), "job").await.unwrap();
    owner.save(progress(5)).await.unwrap();
    // Equal payloads prove nothing: the stale handle must not take over the
    // owner's ETag.
    let err = stale.save(progress(5)).await.unwrap_err();
    assert_eq!(err, StorageError::Conflict { key: "job".into() });
    assert_eq!(stale.etag(), None);
    owner.save(progress(6)).await.unwrap();
    let err = stale.save(progress(6)).await.unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
    // The stamp travels with the checkpoint.
    let stored = store.read("job").await.unwrap().unwrap();
    assert_eq!(stored.checkpoint, progress(6));
    assert_eq!(owner.etag(), Some(&stored.etag));
    assert!(stored.stamp.is_some_and(|s| s.ends_with(":2")));
}
