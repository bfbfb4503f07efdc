//! The facts [`save_cost`](crate::save_cost::save_cost) decides on, read
//! from the files of a version the runner is saving: which of them it
//! saved before at the same path (the very file, kept and written again in
//! place), and which are databases (SQLite's header, or a SQLite journal
//! beside one), which a program always writes in place.

use std::collections::HashMap;
use std::fs::Metadata;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::save_cost::VersionFile;

/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The suffixes of the files SQLite keeps beside a database.
const SQLITE_COMPANIONS: [&str; 3] = ["-journal", "-wal", "-shm"];

/// At most this many files of one version have their first bytes read to
/// tell a database: a directory of many shards is told by the others'
/// times alone (a shard is not a database).
const MAX_HEADERS_READ: usize = 64;

/// The files of the version saved last in this delivery, by manifest path
/// (`file`, or `dir/relative`).
#[derive(Clone, Debug, Default)]
pub(crate) struct SavedFiles(HashMap<String, FileVersion>);

impl SavedFiles {
    /// The files of a version just saved.
    pub(crate) fn of(versions: &[(String, Metadata)]) -> Self {
        SavedFiles(
            versions
                .iter()
                .map(|(path, meta)| (path.clone(), FileVersion::of(meta)))
                .collect(),
        )
    }

    /// Whether `meta` is the very file saved at `path` before.
    fn holds(&self, path: &str, meta: &Metadata) -> bool {
        self.0.get(path) == Some(&FileVersion::of(meta))
    }
}

/// Where a version's manifest paths are on disk: `file` is the checkpoint
/// file, `dir/…` under the checkpoint directory.
#[derive(Clone, Debug)]
pub(crate) struct Roots {
    pub(crate) file: PathBuf,
    pub(crate) dir: PathBuf,
}

impl Roots {
    fn path(&self, manifest_path: &str) -> Option<PathBuf> {
        if manifest_path == "file" {
            return Some(self.file.clone());
        }
        manifest_path
            .strip_prefix("dir/")
            .map(|relative| self.dir.join(relative))
    }
}

/// The facts about each file of `versions` (as staged: manifest path and
/// the metadata of the version read), against the files `saved` before.
/// Reads the first bytes of at most [`MAX_HEADERS_READ`] files not saved
/// before, each opened without following links or blocking; a file that
/// cannot be read is not taken for a database. Blocking: call it off the
/// runtime's threads.
pub(crate) fn version_files(
    versions: &[(String, Metadata)],
    saved: &SavedFiles,
    roots: &Roots,
) -> Vec<VersionFile> {
    let mut headers_left = MAX_HEADERS_READ;
    versions
        .iter()
        .map(|(path, meta)| {
            let saved_before = saved.holds(path, meta);
            let database = is_companion(path)
                || (!saved_before
                    && headers_left > 0
                    && roots.path(path).is_some_and(|on_disk| {
                        headers_left -= 1;
                        has_sqlite_header(&on_disk)
                    }));
            VersionFile {
                born: meta.created().ok(),
                modified: meta.modified().ok(),
                saved_before,
                database,
            }
        })
        .collect()
}

/// Whether `path` names a file SQLite keeps beside a database.
fn is_companion(path: &str) -> bool {
    SQLITE_COMPANIONS
        .iter()
        .any(|suffix| path.len() > suffix.len() && path.ends_with(suffix))
}

/// Whether the file at `path` starts as a SQLite database does.
fn has_sqlite_header(path: &Path) -> bool {
    let Ok(file) = spot_worker_untrusted::open(path, &spot_worker_untrusted::Owners::Any) else {
        return false;
    };
    let mut header = [0u8; SQLITE_HEADER.len()];
    file.take(SQLITE_HEADER.len() as u64)
        .read_exact(&mut header)
        .is_ok()
        && &header == SQLITE_HEADER
}

/// A version of the checkpoint file: its device, inode and birth time, so
/// that a new file renamed over the old one (the contract) is told from
/// the old one written again in place, even when the file system reuses
/// the inode number. Kept per save with the modification time it had, for
/// what a save protects (the goodput ledger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileVersion {
    dev: u64,
    ino: u64,
    born: Option<std::time::SystemTime>,
}

impl FileVersion {
    /// The version `meta` describes.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            born: meta.created().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases_are_told_by_their_header_or_their_companions() {
        let dir = tempfile::tempdir().unwrap();
        let roots = Roots {
            file: dir.path().join("checkpoint"),
            dir: dir.path().join("d"),
        };
        std::fs::create_dir(&roots.dir).unwrap();
        let mut database = SQLITE_HEADER.to_vec();
        database.extend_from_slice(&[0; 100]);
        // (manifest path, contents, a database)
        let rows: [(&str, &[u8], bool); 6] = [
            ("dir/study.db", &database, true),
            ("dir/study.db-journal", b"\xd9\xd5\x05\xf9 \xa1c\xd7", true),
            ("dir/study.db-wal", b"", true),
            ("dir/shard-0.npy", b"\x93NUMPY...", false),
            ("dir/short", b"SQLite", false),
            ("file", b"weights", false),
        ];
        let mut versions = Vec::new();
        for (path, contents, _) in rows {
            let on_disk = roots.path(path).unwrap();
            std::fs::write(&on_disk, contents).unwrap();
            versions.push((path.to_owned(), std::fs::metadata(&on_disk).unwrap()));
        }
        let found = version_files(&versions, &SavedFiles::default(), &roots);
        for ((path, _, expected), file) in rows.iter().zip(&found) {
            assert_eq!(file.database, *expected, "{path}");
            assert!(!file.saved_before, "{path}");
        }
        // Saved before: the same files, kept.
        let again = version_files(&versions, &SavedFiles::of(&versions), &roots);
        assert!(again.iter().all(|file| file.saved_before), "{again:?}");
        // A new file renamed over a saved one is not the one saved.
        let shard = roots.path("dir/shard-0.npy").unwrap();
        let fresh = dir.path().join("fresh");
        std::fs::write(&fresh, b"\x93NUMPY 2").unwrap();
        std::fs::rename(&fresh, &shard).unwrap();
        let renamed = vec![(
            "dir/shard-0.npy".to_owned(),
            std::fs::metadata(&shard).unwrap(),
        )];
        let found = version_files(&renamed, &SavedFiles::of(&versions), &roots);
        assert!(!found[0].saved_before, "{found:?}");
    }
}
