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

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use spot_worker_decisions::cadence::{Interruption, InterruptionCounts};
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::files::{
    AVG_CHUNK, CheckpointFiles, ChunkStore, LISTED_CHUNKS_MAX, MAX_CHUNK, SaveFilesError,
};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, FleetLedger, JobCheckpoint, PutOutcome, ResultStore,
    StorageError, StoredCheckpoint, WritePrecondition,
};

/// Runs the [`CheckpointStore`] contract against `store`, fresh and empty:
/// ETag-fenced reads and writes (If-None-Match and If-Match conflicts),
/// keys with slashes, the write stamp's round trip, completed checkpoints,
/// delete, [`JobCheckpoint`] fencing out a stale handle, and the fleet's
/// interruption counts merged from racing additions.
pub async fn checkpoint_store(store: Arc<dyn CheckpointStore>) {
    // Prepare creates what is missing; a second call is harmless.
    store.prepare().await.expect("prepare");
    store.prepare().await.expect("prepare is idempotent");
    writes_are_fenced_by_etags(store.as_ref()).await;
    stamps_are_kept_with_the_checkpoint_and_replaced_by_every_write(store.as_ref()).await;
    completed_checkpoints_read_back_as_completed(store.as_ref()).await;
    delete_removes_and_is_idempotent(store.as_ref()).await;
    a_stale_handle_writing_the_same_progress_is_still_fenced_out(Arc::clone(&store)).await;
    fleet_counts_added_at_once_by_many_workers_all_count(store).await;
}

/// The fleet's interruption counts ([`FleetLedger`]) on top of the store's
/// ETag fencing: additions racing from several workers are all kept, none
/// twice.
async fn fleet_counts_added_at_once_by_many_workers_all_count(store: Arc<dyn CheckpointStore>) {
    const WORKERS: u64 = 4;
    let ledger = FleetLedger::new(store);
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
            }
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

/// Runs the [`ChunkStore`] contract against `store`, fresh and empty: a
/// chunk reads back exactly, a missing one is `None`, one of another
/// length than asked is refused, overwriting a name is allowed, and
/// deleting is idempotent.
pub async fn chunk_store(store: &dyn ChunkStore) {
    let name = "0123abcd/chunk-00000001";
    assert_eq!(store.get(name, 3).await.unwrap(), None, "a missing chunk");
    store.put(name, Bytes::from_static(b"abc")).await.unwrap();
    assert_eq!(
        store.get(name, 3).await.unwrap().as_deref(),
        Some(&b"abc"[..])
    );
    for wrong in [2, 4] {
        let error = store.get(name, wrong).await.unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidData { .. }),
            "a chunk of another length than asked: {error:?}"
        );
    }
    store.put(name, Bytes::from_static(b"abc")).await.unwrap();
    store.put("0123abcd/empty", Bytes::new()).await.unwrap();
    assert_eq!(
        store.get("0123abcd/empty", 0).await.unwrap(),
        Some(Bytes::new())
    );
    store.delete(name).await.unwrap();
    assert_eq!(store.get(name, 3).await.unwrap(), None);
    store
        .delete(name)
        .await
        .expect("deleting what does not exist succeeds");
}

/// Deterministic bytes (a linear congruential generator).
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// The chunk names a job's checkpoint manifest lists in its document
/// (the chunks of files small enough to list them there).
pub fn listed_chunk_names(checkpoint: &JobCheckpoint) -> Vec<String> {
    let Some(manifest) = checkpoint.manifest().unwrap() else {
        return Vec::new();
    };
    let Files::Listed(files) = &manifest.files else {
        return Vec::new();
    };
    files
        .iter()
        .flat_map(|file| match &file.content {
            Content::Chunks(chunks) => chunks.iter().map(|c| c.name(&manifest.prefix)).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Waits (bounded) until none of `names` is in `chunks`; panics saying
/// `why` if some stay.
pub async fn until_gone(chunks: &dyn ChunkStore, names: &[String], why: &str) {
    for _ in 0..400 {
        let mut any = false;
        for name in names {
            // Asked for 0 bytes: a stored chunk answers with an error.
            if !matches!(chunks.get(name, 0).await, Ok(None)) {
                any = true;
            }
        }
        if !any {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{why}: chunks still stored: {names:?}");
}

/// Runs the checkpoint files contract ([`JobCheckpoint::save_files`] and
/// `restore_files`) against `store`, fresh and empty and handing out a
/// chunk store: a directory (a small file kept inline, a file of a few
/// chunks, a file of pages) restores byte for byte on another handle; an
/// unchanged save sends nothing and writes nothing; a changed region
/// sends about itself, and the chunks it replaced are deleted; a stale
/// handle is fenced out and leaves nothing behind; completing the job
/// deletes its chunks.
pub async fn checkpoint_files(store: Arc<dyn CheckpointStore>) {
    let chunks = store.chunks().expect("the store keeps files");
    let (source, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = source.path();
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    std::fs::write(dir.join("step.json"), br#"{"step":3}"#).unwrap();
    let mut weights = pseudo_random(3 * AVG_CHUNK, 1);
    std::fs::write(dir.join("weights.bin"), &weights).unwrap();
    // More chunks than a document lists: kept in a page.
    let optimizer = pseudo_random((LISTED_CHUNKS_MAX + 8) * AVG_CHUNK, 2);
    std::fs::write(dir.join("sub/deeper/optimizer.bin"), &optimizer).unwrap();
    let roots = CheckpointFiles::dir(dir);

    let mut owner = JobCheckpoint::load(Arc::clone(&store), "train/files")
        .await
        .unwrap();
    let mut stale = JobCheckpoint::load(Arc::clone(&store), "train/files")
        .await
        .unwrap();
    let first = owner.save_files(&roots).await.unwrap();
    assert_eq!(first.files, 3);
    assert_eq!(
        first.bytes,
        10 + weights.len() as u64 + optimizer.len() as u64
    );
    assert!(first.sent_bytes >= first.bytes - 10, "{first:?}");
    let etag = owner.etag().cloned();

    // Another handle restores it, byte for byte.
    let mut resumed = JobCheckpoint::load(Arc::clone(&store), "train/files")
        .await
        .unwrap();
    let restored = resumed
        .restore_files(&CheckpointFiles::dir(target.path()))
        .await
        .unwrap()
        .expect("files to restore");
    assert_eq!((restored.files, restored.bytes), (3, first.bytes));
    assert_eq!(
        std::fs::read(target.path().join("weights.bin")).unwrap(),
        weights
    );
    assert_eq!(
        std::fs::read(target.path().join("sub/deeper/optimizer.bin")).unwrap(),
        optimizer
    );
    assert_eq!(
        std::fs::read(target.path().join("step.json")).unwrap(),
        br#"{"step":3}"#
    );

    // Unchanged: nothing sent, nothing written (the files were rewritten
    // with the same bytes, as a program saving every epoch does).
    std::fs::write(dir.join("weights.bin"), &weights).unwrap();
    let again = owner.save_files(&roots).await.unwrap();
    assert_eq!((again.sent_blobs, again.sent_bytes), (0, 0), "{again:?}");
    assert_eq!(owner.etag().cloned(), etag, "no write for the same files");

    // One region changed: about that region is sent, and the chunks it
    // replaced are deleted once the new manifest is written.
    let before = listed_chunk_names(&owner);
    let region = AVG_CHUNK + AVG_CHUNK / 2;
    weights[region..region + 1000].fill(0xee);
    std::fs::write(dir.join("weights.bin"), &weights).unwrap();
    let changed = owner.save_files(&roots).await.unwrap();
    assert!(
        changed.sent_bytes <= 2 * MAX_CHUNK as u64 && changed.sent_bytes > 0,
        "a 1000-byte change sent {changed:?}"
    );
    let after = listed_chunk_names(&owner);
    let replaced: Vec<String> = before
        .iter()
        .filter(|n| !after.contains(n))
        .cloned()
        .collect();
    assert!(!replaced.is_empty(), "the changed chunk is replaced");
    until_gone(chunks.as_ref(), &replaced, "replaced chunks").await;

    // A stale handle cannot move the checkpoint, and what it sent goes.
    std::fs::write(dir.join("step.json"), br#"{"step":2}"#).unwrap();
    let error = stale.save_files(&roots).await.unwrap_err();
    assert!(
        matches!(
            error,
            SaveFilesError::Storage(StorageError::Conflict { .. })
        ),
        "{error:?}"
    );

    // Completing the job deletes every chunk its files used.
    let kept = listed_chunk_names(&owner);
    assert!(!kept.is_empty());
    owner.complete(json!({"done": true})).await.unwrap();
    until_gone(chunks.as_ref(), &kept, "a completed job's chunks").await;

    // Restoring into a tree with a link in the way writes nothing through it.
    let elsewhere = tempfile::tempdir().unwrap();
    let trap = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), trap.path().join("sub")).unwrap();
    let mut linked = JobCheckpoint::load(Arc::clone(&store), "links")
        .await
        .unwrap();
    linked.save_files(&roots).await.unwrap();
    let mut victim = JobCheckpoint::load(store, "links").await.unwrap();
    assert!(
        victim
            .restore_files(&CheckpointFiles::dir(trap.path()))
            .await
            .is_err()
    );
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}
