//! Large checkpoints under the faults a fleet sees every day: a manifest
//! write that lands but whose answer is lost, a second holder of the job,
//! a lease lost in the middle of a save, a restore racing the holder's
//! clean-up, and the container's retention rule over weeks (a clock the
//! test moves). Whatever happens, every chunk a stored manifest names is
//! there to restore from.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::save_dir;
use spot_worker_storage::files::{CheckpointFiles, SaveFilesError};
use spot_worker_storage::{
    CancellationToken, CheckpointStore, InMemoryCheckpointStore, JobCheckpoint, StorageError,
};
use spot_worker_testkit::lost_answers::{Fault, LostAnswerStore, StoreCall};

const KEY: &str = "train-7";

/// A megabyte that differs for every `seed`: several chunks.
fn content(seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..1_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn put(dir: &Path, name: &str, seed: u32) {
    std::fs::write(dir.join(name), content(seed)).unwrap();
}

fn stores() -> (
    InMemoryCheckpointStore,
    LostAnswerStore,
    Arc<dyn CheckpointStore>,
) {
    let inner = InMemoryCheckpointStore::new();
    let faults = LostAnswerStore::new(Arc::new(inner.clone()));
    let shared: Arc<dyn CheckpointStore> = Arc::new(faults.clone());
    (inner, faults, shared)
}

/// A fresh holder restores the stored checkpoint into a new directory,
/// which must then hold exactly `expected` (name, seed).
async fn restores(store: &Arc<dyn CheckpointStore>, expected: &[(&str, u32)]) {
    let into = tempfile::tempdir().unwrap();
    let mut holder = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
    let restored = holder
        .restore_files(&CheckpointFiles::dir(into.path()))
        .await
        .expect("every chunk the stored manifest names is there")
        .expect("a manifest is stored");
    assert_eq!(restored.files, expected.len());
    for (name, seed) in expected {
        assert_eq!(
            std::fs::read(into.path().join(name)).unwrap(),
            content(*seed)
        );
    }
}

/// Holder A saves `a`, then `a` and `b`: that second manifest write lands
/// and its answer is lost. Returns A's handle and directory.
async fn a_save_whose_answer_is_lost(
    store: &Arc<dyn CheckpointStore>,
    faults: &LostAnswerStore,
    fenced: CancellationToken,
) -> (JobCheckpoint, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut a = JobCheckpoint::load(store.clone(), KEY)
        .await
        .unwrap()
        .fenced_by(fenced);
    put(dir.path(), "a", 1);
    save_dir(&mut a, dir.path()).await.unwrap();
    put(dir.path(), "b", 2);
    faults.plan(StoreCall::CheckpointWrite, Fault::AnswerLost);
    let lost = save_dir(&mut a, dir.path()).await.unwrap_err();
    assert!(
        matches!(&lost, SaveFilesError::Storage(e) if e.is_transient()),
        "{lost}"
    );
    (a, dir)
}

/// B, a duplicate delivery, restores the manifest that landed and saves
/// `c` on top of it, reusing its chunks by name.
async fn another_holder_builds_on_it(store: &Arc<dyn CheckpointStore>) {
    let b_dir = tempfile::tempdir().unwrap();
    let mut b = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
    b.restore_files(&CheckpointFiles::dir(b_dir.path()))
        .await
        .unwrap()
        .unwrap();
    put(b_dir.path(), "c", 3);
    save_dir(&mut b, b_dir.path()).await.unwrap();
}

#[tokio::test]
async fn a_conflict_after_a_lost_answer_deletes_no_chunk_the_other_holder_uses() {
    let (_inner, faults, store) = stores();
    let (mut a, a_dir) =
        a_save_whose_answer_is_lost(&store, &faults, CancellationToken::new()).await;
    another_holder_builds_on_it(&store).await;
    // A saves again and loses to B.
    put(a_dir.path(), "d", 4);
    let lost = save_dir(&mut a, a_dir.path()).await.unwrap_err();
    assert!(
        matches!(lost, SaveFilesError::Storage(StorageError::Conflict { .. })),
        "{lost}"
    );
    a.removals_done().await;
    restores(&store, &[("a", 1), ("b", 2), ("c", 3)]).await;
}

#[tokio::test]
async fn a_save_cancelled_after_a_lost_answer_deletes_no_chunk_the_next_holder_uses() {
    let (_inner, faults, store) = stores();
    let lease = CancellationToken::new();
    let (mut a, a_dir) = a_save_whose_answer_is_lost(&store, &faults, lease.clone()).await;
    // A's lease is lost; its save task runs on and ends in JobCancelled.
    lease.cancel();
    put(a_dir.path(), "d", 4);
    let cancelled = save_dir(&mut a, a_dir.path()).await.unwrap_err();
    assert!(
        matches!(
            cancelled,
            SaveFilesError::Storage(StorageError::JobCancelled { .. })
        ),
        "{cancelled}"
    );
    a.removals_done().await;
    // The next holder resumes from the manifest that landed.
    restores(&store, &[("a", 1), ("b", 2)]).await;
}

#[tokio::test]
async fn a_clean_up_that_cannot_read_the_stored_manifest_deletes_nothing() {
    let (inner, faults, store) = stores();
    let (mut a, a_dir) =
        a_save_whose_answer_is_lost(&store, &faults, CancellationToken::new()).await;
    another_holder_builds_on_it(&store).await;
    let before = inner.chunk_store().names();
    put(a_dir.path(), "d", 4);
    // A's conflict read succeeds; the clean-up's read of what is stored
    // does not.
    faults.plan_clean(StoreCall::CheckpointRead);
    faults.plan(StoreCall::CheckpointRead, Fault::Before);
    save_dir(&mut a, a_dir.path()).await.unwrap_err();
    a.removals_done().await;
    let after = inner.chunk_store().names();
    assert!(
        before.iter().all(|name| after.contains(name)),
        "nothing that was there is deleted"
    );
    restores(&store, &[("a", 1), ("b", 2), ("c", 3)]).await;
}

#[tokio::test]
async fn a_restore_racing_the_holders_clean_up_resumes_from_the_newer_manifest() {
    let (inner, _faults, store) = stores();
    let dir = tempfile::tempdir().unwrap();
    let mut holder = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
    put(dir.path(), "a", 1);
    save_dir(&mut holder, dir.path()).await.unwrap();
    // A duplicate delivery reads the manifest naming `a` ...
    let mut reader = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
    // ... and before it restores, the holder replaces `a` and deletes
    // what only the older manifest named.
    std::fs::remove_file(dir.path().join("a")).unwrap();
    put(dir.path(), "b", 2);
    save_dir(&mut holder, dir.path()).await.unwrap();
    holder.removals_done().await;
    assert!(
        inner.chunk_store().names().len() < 10,
        "the older manifest's chunks are gone"
    );
    let into = tempfile::tempdir().unwrap();
    let restored = reader
        .restore_files(&CheckpointFiles::dir(into.path()))
        .await
        .expect("a race with the clean-up is not a failure")
        .unwrap();
    assert_eq!(restored.files, 1);
    assert_eq!(std::fs::read(into.path().join("b")).unwrap(), content(2));
    assert!(!into.path().join("a").exists());
}
#[tokio::test]
async fn a_job_whose_chunks_outlive_the_retention_period_still_restores() {
    let (inner, _faults, store) = stores();
    let chunks = inner.chunk_store();
    let retention = Duration::from_secs(7 * 24 * 3600);
    let day = Duration::from_secs(24 * 3600);
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "weights", 1);
    // A job that runs for five weeks, saving once a day, its weights never
    // changing; the retention rule runs every day.
    for step in 0..35u32 {
        if step > 0 {
            std::fs::remove_file(dir.path().join("step")).unwrap();
        }
        put(dir.path(), "step", 100 + step);
        let mut holder = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
        save_dir(&mut holder, dir.path()).await.unwrap();
        holder.removals_done().await;
        chunks.advance_clock(day);
        chunks.expire_older_than(retention);
        restores(&store, &[("weights", 1), ("step", 100 + step)]).await;
    }
}

/// Issue 37, item 3: a job that waits unrun for five weeks under a 7-day
/// rule, its message given a fresh life every 6 days (a lane move, a
/// requeue: each first calls `date_anew`, as `Lanes`' mover does), still
/// restores; its manifest is dated anew only when its blobs near the
/// rule (before: nothing dated them, and the rule removed its chunks on
/// day 8).
#[tokio::test]
async fn a_job_that_waits_five_weeks_moved_every_six_days_still_restores() {
    use spot_worker_storage::{DatedAnew, date_anew};

    let (inner, _faults, store) = stores();
    let chunks = inner.chunk_store();
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "weights", 1);
    put(dir.path(), "step", 2);
    let mut holder = JobCheckpoint::load(store.clone(), KEY).await.unwrap();
    save_dir(&mut holder, dir.path()).await.unwrap();
    let mut touched = 0;
    for day_number in 1..=35u32 {
        // A day passes; the 7-day rule runs.
        chunks.advance_clock(Duration::from_secs(24 * 3600));
        chunks.expire_older_than(Duration::from_secs(7 * 24 * 3600));
        if day_number % 6 == 0 {
            match date_anew(&store, KEY).await.unwrap() {
                DatedAnew::Touched { blobs } => {
                    assert!(blobs >= 2, "{blobs}");
                    touched += 1;
                }
                other => panic!("day {day_number}: {other:?}"),
            }
        }
        restores(&store, &[("weights", 1), ("step", 2)]).await;
    }
    assert_eq!(touched, 5);
    // Five days since: dated anew once, then a move touches nothing.
    assert!(matches!(
        date_anew(&store, KEY).await.unwrap(),
        DatedAnew::Touched { .. }
    ));
    assert_eq!(date_anew(&store, KEY).await.unwrap(), DatedAnew::Recent);
}
