//! A checkpoint directory at its limits is refused at the save, loudly,
//! never saved half or stored where it could not be restored: more
//! entries than [`MAX_ENTRIES`] (directories counted), a name that is not
//! UTF-8, a path longer than a restore accepts. And a manifest, however
//! corrupt, never makes a save ask the store for a blob larger than any a
//! checkpoint may hold, on the path that reads it without a restore.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::common::save_dir;
use spot_worker_storage::files::manifest::{
    ChunkRef, Content, FileEntry, Files, MAX_PATH_LEN, job_prefix,
};
use spot_worker_storage::files::{MAX_ENTRIES, Manifest, SaveFilesError};
use spot_worker_storage::{CheckpointStore, InMemoryCheckpointStore, JobCheckpoint, StorageError};
use spot_worker_testkit::counting::CountingStore;

async fn save(dir: &std::path::Path) -> Result<(), SaveFilesError> {
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let mut checkpoint = JobCheckpoint::load(store, "limits").await.unwrap();
    save_dir(&mut checkpoint, dir).await.map(drop)
}

#[tokio::test]
async fn directories_count_against_the_entry_cap() {
    let root = tempfile::tempdir().unwrap();
    // As many empty directories as the cap, and one file: one entry over.
    for i in 0..MAX_ENTRIES {
        std::fs::create_dir(root.path().join(format!("d{i}"))).unwrap();
    }
    std::fs::write(root.path().join("state"), b"x").unwrap();
    let error = save(root.path()).await.unwrap_err();
    assert!(
        matches!(error, SaveFilesError::TooMany { limit: MAX_ENTRIES }),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("10000 files and directories") && text.contains("docs/command.md"),
        "{text}"
    );
}

#[tokio::test]
async fn the_cap_holds_for_one_directory_of_many_entries() {
    let root = tempfile::tempdir().unwrap();
    let big = root.path().join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..=MAX_ENTRIES {
        std::fs::write(big.join(format!("f{i}")), b"").unwrap();
    }
    let error = save(root.path()).await.unwrap_err();
    assert!(matches!(error, SaveFilesError::TooMany { .. }), "{error}");
}

#[tokio::test]
async fn a_name_that_is_not_utf8_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("kept"), b"x").unwrap();
    let sub = root.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join(OsStr::from_bytes(b"caf\xe9\x1b[31m")), b"y").unwrap();
    let error = save(root.path()).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, SaveFilesError::BadPath { .. }), "{text}");
    // Named, escaped: the byte that is not UTF-8 and the control both.
    assert!(
        text.contains(r"/sub/caf\xe9\u{1b}[31m is not UTF-8 text"),
        "{text}"
    );
}

#[tokio::test]
async fn a_path_too_long_to_restore_is_refused_at_the_save() {
    let root = tempfile::tempdir().unwrap();
    let part = "p".repeat(250);
    let depth = MAX_PATH_LEN / (part.len() + 1) + 1;
    make_deep(root.path(), &part, depth);
    let error = save(root.path()).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, SaveFilesError::BadPath { .. }), "{text}");
    assert!(text.contains("longer than the 4096 bytes"), "{text}");
    assert!(text.contains(&format!("/{part}/{part}")), "{text}");
}

/// Makes `depth` directories named `part`, each in the one before, and a
/// file in the last: one directory at a time from the one above, as a
/// program would, since the whole path is longer than a system call takes.
fn make_deep(root: &std::path::Path, part: &str, depth: usize) {
    use std::ffi::CString;
    let name = CString::new(part).unwrap();
    let root = CString::new(root.as_os_str().as_bytes()).unwrap();
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: NUL-terminated names; every descriptor opened is closed.
    unsafe {
        let mut at = libc::open(root.as_ptr(), flags);
        assert!(at >= 0);
        for _ in 0..depth {
            assert_eq!(libc::mkdirat(at, name.as_ptr(), 0o700), 0);
            let next = libc::openat(at, name.as_ptr(), flags);
            assert!(next >= 0);
            libc::close(at);
            at = next;
        }
        let file = c"f";
        let fd = libc::openat(
            at,
            file.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        assert!(fd >= 0);
        libc::close(fd);
        libc::close(at);
    }
}

#[tokio::test]
async fn a_corrupt_manifest_never_makes_a_save_ask_for_a_huge_blob() {
    let huge = ChunkRef {
        hash: [7; 32],
        len: u32::MAX,
        generation: 1,
    };
    let key = "corrupt";
    let table = Files::Table(huge);
    let pages = Files::Listed(vec![FileEntry {
        path: "dir/weights".to_owned(),
        size: 1,
        content: Content::Pages(vec![spot_worker_storage::files::manifest::PageRef {
            chunk: huge,
            count: 3,
        }]),
    }]);
    for files in [table, pages] {
        let counting = CountingStore::new(InMemoryCheckpointStore::new());
        let calls = Arc::clone(counting.calls());
        let store: Arc<dyn CheckpointStore> = Arc::new(counting);
        let manifest = Manifest {
            prefix: job_prefix(key),
            files,
        };
        let mut writer = JobCheckpoint::load(Arc::clone(&store), key).await.unwrap();
        writer.save_progress(manifest.to_progress()).await.unwrap();

        // A save (not a restore) reads the manifest's chunk list first.
        let source = tempfile::tempdir().unwrap();
        std::fs::write(source.path().join("weights"), b"new").unwrap();
        let mut saver = JobCheckpoint::load(store, key).await.unwrap();
        let error = save_dir(&mut saver, source.path()).await.unwrap_err();
        assert!(
            matches!(
                error,
                SaveFilesError::Storage(StorageError::InvalidData { .. })
            ),
            "{error}"
        );
        let asked = calls.chunk_get_largest();
        assert!(
            asked <= 64 * 1024 * 1024,
            "asked the store for {asked} bytes"
        );
    }
}
