//! The contracts of large checkpoints: the [`ChunkStore`] a checkpoint
//! store hands out, and [`JobCheckpoint`]'s files saved through it.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::files::{
    AVG_CHUNK, CheckpointFiles, ChunkStore, LISTED_CHUNKS_MAX, MAX_CHUNK, SaveFilesError,
};
use spot_worker_storage::{CheckpointStore, JobCheckpoint, StorageError};

/// Runs the [`ChunkStore`] contract against `store`, fresh and empty: a
/// chunk reads back exactly, a missing one is `None`, one of another
/// length than asked is refused, overwriting a name is allowed, touching
/// one keeps its bytes (a missing one answers `false`), and deleting is
/// idempotent.
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
    assert!(
        store.touch(name).await.unwrap(),
        "a stored chunk is touched"
    );
    assert_eq!(
        store.get(name, 3).await.unwrap().as_deref(),
        Some(&b"abc"[..]),
        "touching keeps the bytes"
    );
    assert!(!store.touch("0123abcd/never-stored").await.unwrap());
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
/// sends about itself, and the chunks it replaced are deleted; what a save
/// cut short sent is not sent again by the next; a stale
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

    // A save cut short (staged, never committed) leaves what it sent for
    // the next, which sends nothing again and names it.
    weights[..1000].fill(0x11);
    std::fs::write(dir.join("weights.bin"), &weights).unwrap();
    let cut = owner.stage_files(&roots, u64::MAX).await.unwrap();
    assert!(cut.stats.sent_bytes > 0, "{:?}", cut.stats);
    drop(cut);
    let next = owner.save_files(&roots).await.unwrap();
    assert_eq!(next.sent_bytes, 0, "sent again after a save cut short");
    let mut check = JobCheckpoint::load(Arc::clone(&store), "train/files")
        .await
        .unwrap();
    check
        .restore_files(&CheckpointFiles::dir(target.path()))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(target.path().join("weights.bin")).unwrap(),
        weights,
        "what the cut save sent is what the next one names"
    );

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
