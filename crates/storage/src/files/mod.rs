//! Checkpoints of any size: files and directories saved to a
//! [`ChunkStore`] in content-defined chunks, streamed from disk with a
//! bounded number of uploads and bytes in flight, and named by a
//! [`Manifest`] that is the job's (small, ETag-fenced) checkpoint
//! document. Use it through [`JobCheckpoint::save_files`] and
//! [`JobCheckpoint::restore_files`](crate::JobCheckpoint::restore_files).
//!
//! A save sends only the chunks the job's last manifest does not name
//! already, so an unchanged file costs no upload, and a changed region
//! about its own size. After a manifest is written, the chunks only the
//! one before it named are deleted; so are all of a job's chunks when it
//! succeeds; whatever a save cut short left behind goes with the
//! container's retention rule (docs/storage.md).
//!
//! [`JobCheckpoint::save_files`]: crate::JobCheckpoint::save_files

use std::path::{Path, PathBuf};

mod chunk_store;
mod chunker;
mod index;
pub mod manifest;
mod restore;
mod snapshot;
mod stage;

pub use chunk_store::ChunkStore;
pub use chunker::{AVG_CHUNK, MAX_CHUNK, MIN_CHUNK};
pub use manifest::Manifest;
pub use restore::Restored;
pub use snapshot::MAX_ENTRIES;
pub use stage::{SaveStats, Staged};

pub(crate) use index::ChunkIndex;
pub(crate) use restore::{fetch_page, fetch_table, restore};
pub(crate) use stage::Stager;

/// Files at most this big are kept in the manifest document itself (up to
/// [`INLINE_TOTAL`] in all), which costs no request of their own.
pub const INLINE_MAX: u64 = 48 * 1024;

/// The most bytes kept inline in one manifest.
pub const INLINE_TOTAL: u64 = 48 * 1024;

/// How many chunk references a file lists in the document; more go to
/// pages of [`PAGE_ENTRIES`].
pub const LISTED_CHUNKS_MAX: usize = 32;

/// Chunk references per page blob (40 bytes each: 320 KiB a page, about
/// 8 GiB of file).
pub const PAGE_ENTRIES: usize = 8192;

/// The largest file table kept in the document (as JSON: room for the
/// inline files in base64, and a few hundred listed ones); a larger one
/// goes to a blob of its own.
pub const LISTED_TABLE_MAX: usize = 96 * 1024;

/// How many transfers a save or restore keeps going at once, and how many
/// bytes of chunks it holds in memory at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferLimits {
    /// Uploads or downloads at once.
    pub concurrency: usize,
    /// Chunk bytes held at once (cut and waiting, or in flight); at least
    /// [`MAX_CHUNK`].
    pub in_flight_bytes: usize,
}

impl TransferLimits {
    /// 8 transfers at once, 16 MiB in flight.
    pub const DEFAULT: TransferLimits = TransferLimits {
        concurrency: 8,
        in_flight_bytes: 16 * 1024 * 1024,
    };

    /// `concurrency` transfers at once (at least one), with the default
    /// byte budget.
    pub fn with_concurrency(concurrency: usize) -> Self {
        TransferLimits {
            concurrency: concurrency.max(1),
            ..Self::DEFAULT
        }
    }

    pub(crate) fn budget(&self) -> usize {
        self.in_flight_bytes.max(2 * MAX_CHUNK)
    }
}

impl Default for TransferLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a checkpoint is made of on disk: named roots, each a single file or
/// a directory (all regular files under it, at any depth; links and other
/// special files are passed over, with the reason in the save's report).
///
/// ```
/// use spot_worker_storage::files::CheckpointFiles;
///
/// let files = CheckpointFiles::dir("/tmp/model")
///     .with_file("state", "/tmp/state.json");
/// assert_eq!(files.roots().count(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointFiles {
    roots: Vec<Root>,
    /// Files under a directory root saved from a copy instead (manifest
    /// path, the copy).
    stand_ins: Vec<(String, PathBuf)>,
    /// Files under a directory root not saved (manifest paths).
    left_out: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Root {
    name: String,
    path: PathBuf,
    is_dir: bool,
}

impl CheckpointFiles {
    /// One directory, under the root name `dir`.
    pub fn dir(path: impl Into<PathBuf>) -> Self {
        CheckpointFiles::default().with_dir("dir", path)
    }

    /// One file, under the root name `file`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        CheckpointFiles::default().with_file("file", path)
    }

    /// Adds the directory `path` under the root `name` (one path segment:
    /// no `/`, not `.` or `..`).
    pub fn with_dir(self, name: &str, path: impl Into<PathBuf>) -> Self {
        self.with_root(name, path.into(), true)
    }

    /// Adds the file `path` under the root `name`.
    pub fn with_file(self, name: &str, path: impl Into<PathBuf>) -> Self {
        self.with_root(name, path.into(), false)
    }

    fn with_root(mut self, name: &str, path: PathBuf, is_dir: bool) -> Self {
        self.roots.retain(|root| root.name != name);
        self.roots.push(Root {
            name: name.to_owned(),
            path,
            is_dir,
        });
        self
    }

    /// Saves the file at the manifest path `path` (under a directory root)
    /// from `copy` instead: a consistent copy of it that the caller made
    /// and nothing writes while a save reads it (a live database's online
    /// backup). Saved, and restored, as the file at `path`; its identity,
    /// size and times are the copy's. Only if a regular file is at `path`
    /// when the save looks: one that went is not saved.
    ///
    /// ```
    /// use spot_worker_storage::files::CheckpointFiles;
    ///
    /// let files = CheckpointFiles::dir("/tmp/state")
    ///     .with_stand_in("dir/study.db", "/tmp/backup-of-study.db")
    ///     .leaving_out("dir/study.db-wal");
    /// assert_eq!(files.roots().count(), 1);
    /// ```
    pub fn with_stand_in(mut self, path: &str, copy: impl Into<PathBuf>) -> Self {
        self.stand_ins.retain(|(named, _)| named != path);
        self.stand_ins.push((path.to_owned(), copy.into()));
        self
    }

    /// Passes over the file at the manifest path `path` (under a directory
    /// root) without a word: what it holds is in a stand-in
    /// ([`CheckpointFiles::with_stand_in`]: a database's journal or
    /// write-ahead log, folded into its backup). It counts against
    /// [`MAX_ENTRIES`] all the same.
    pub fn leaving_out(mut self, path: &str) -> Self {
        if !self.left_out.iter().any(|named| named == path) {
            self.left_out.push(path.to_owned());
        }
        self
    }

    /// The copy a file at `path` is saved from, if it has a stand-in.
    pub(crate) fn stand_in(&self, path: &str) -> Option<&Path> {
        self.stand_ins
            .iter()
            .find(|(named, _)| named == path)
            .map(|(_, copy)| copy.as_path())
    }

    /// Whether the file at `path` is left out.
    pub(crate) fn is_left_out(&self, path: &str) -> bool {
        self.left_out.iter().any(|named| named == path)
    }

    /// The roots: name, path, and whether it is a directory.
    pub fn roots(&self) -> impl Iterator<Item = (&str, &Path, bool)> {
        self.roots
            .iter()
            .map(|root| (root.name.as_str(), root.path.as_path(), root.is_dir))
    }

    /// Where the manifest path `path` (`root` or `root/relative`) is
    /// restored: `None` if no root has its name, or the path names a root
    /// of the other kind.
    pub(crate) fn target(&self, path: &str) -> Option<PathBuf> {
        let (name, rest) = match path.split_once('/') {
            Some((name, rest)) => (name, Some(rest)),
            None => (path, None),
        };
        let root = self.roots.iter().find(|root| root.name == name)?;
        match (root.is_dir, rest) {
            (true, Some(rest)) => Some(root.path.join(rest)),
            (false, None) => Some(root.path.clone()),
            _ => None,
        }
    }

    /// What identifies the version of every file under the roots now
    /// (paths, identities, sizes, modification times; links and special
    /// files included), without opening any: equal fingerprints, nothing
    /// to save. `None` if nothing is there.
    pub fn fingerprint(&self) -> Result<Option<[u8; 32]>, SaveFilesError> {
        let stamps = snapshot::Snapshot::stamps_now(self)?;
        if stamps.is_empty() {
            return Ok(None);
        }
        let mut hasher = blake3::Hasher::new();
        for (path, dev, ino, len, secs, nanos) in stamps {
            hasher.update(path.as_bytes());
            hasher.update(&[0]);
            for n in [dev, ino, len, secs as u64, nanos as u64] {
                hasher.update(&n.to_le_bytes());
            }
        }
        Ok(Some(*hasher.finalize().as_bytes()))
    }

    /// The size of the regular files under the roots now.
    pub fn size(&self) -> Result<u64, SaveFilesError> {
        Ok(snapshot::Snapshot::stamps_now(self)?
            .iter()
            .map(|stamp| stamp.3)
            .sum())
    }

    /// Whether the manifest path `path` is under a directory root.
    pub(crate) fn is_in_dir(&self, path: &str) -> bool {
        let name = path.split('/').next().unwrap_or(path);
        self.roots
            .iter()
            .any(|root| root.is_dir && root.name == name)
    }

    pub(crate) fn check_names(&self) -> Result<(), crate::StorageError> {
        for root in &self.roots {
            if root.name.is_empty()
                || root.name.contains('/')
                || matches!(root.name.as_str(), "." | "..")
            {
                return Err(crate::StorageError::InvalidArgument(format!(
                    "{:?} is not a root name: one path segment, not `.` or `..`",
                    root.name
                )));
            }
        }
        Ok(())
    }
}

/// Why a save of checkpoint files did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SaveFilesError {
    /// The files add up to more than the caller allows.
    #[error("the checkpoint is {size} bytes, over the limit of {limit} bytes")]
    TooBig {
        /// Their size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The roots hold more entries (files, directories, links, ...) than
    /// a checkpoint may: [`MAX_ENTRIES`].
    #[error(
        "the checkpoint directory holds more than {limit} files and directories, the most a checkpoint may have (docs/command.md, \"Limits of a checkpoint directory\"); nothing was saved"
    )]
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// A path under a directory root that a checkpoint cannot hold: a
    /// name that is not UTF-8 text, or a path longer than
    /// [`manifest::MAX_PATH_LEN`]. Refused at the save, never stored
    /// where it could not be restored, nor passed over in silence.
    #[error("the checkpoint path {path} {why}; nothing was saved")]
    BadPath {
        /// The path, escaped for a log ([`spot_worker_untrusted::escape_bytes`]).
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A file changed, appeared or went while it was read: what was read
    /// is not one version. Try again.
    #[error("the checkpoint files changed while they were read")]
    Unstable,
    /// Reading a file failed.
    #[error("reading the checkpoint files: {0}")]
    Io(#[from] std::io::Error),
    /// The store failed (or refused) a request.
    #[error(transparent)]
    Storage(#[from] crate::StorageError),
}
