//! What a set of checkpoint files is at one moment: every regular file
//! under its roots, stat'ed, in path order, and what was passed over.
//!
//! The roots are the program's to fill, so they are walked as
//! `spot-worker-untrusted` walks what someone else controls: a directory
//! root is opened without following a link ([`Dir`]), and everything
//! below it is reached from the directory already open, never by a path
//! again, so no subdirectory swapped for a link to elsewhere is ever
//! entered, and no link, FIFO or device is ever opened. Files are opened
//! one at a time as a save reads them ([`SnapFile::open`]), each checked to
//! be the very version looked at; afterwards the roots are walked again,
//! and only if nothing appeared, went, or changed meanwhile is what was
//! read one version of them all.

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use spot_worker_untrusted::{Dir, Owners, UntrustedError, escape_bytes, escape_line, file_kind};

use super::manifest::MAX_PATH_LEN;
use super::{CheckpointFiles, SaveFilesError};

/// How deep a checkpoint directory may nest.
const MAX_DEPTH: usize = 64;

/// The most entries (files, directories, links, ...) the roots may hold,
/// every directory below a root counted as one: what a save keeps in
/// memory about them stays well under a megabyte a thousand, and a look
/// at them stops reading at the first entry past it, so a program cannot
/// make a look take long or hold much (docs/command.md, "Limits of a
/// checkpoint directory").
pub const MAX_ENTRIES: usize = 10_000;

/// One file of a snapshot, not yet opened.
#[derive(Clone, Debug)]
pub(crate) struct SnapFile {
    /// Its manifest path (`root` or `root/relative`).
    pub(crate) path: String,
    pub(crate) meta: Metadata,
    at: Location,
}

/// Where a file is: a file root (whose directory is the runner's), or
/// names below a directory root.
#[derive(Clone, Debug)]
enum Location {
    Root(PathBuf),
    Below {
        root: Arc<Dir>,
        names: Vec<OsString>,
    },
}

impl SnapFile {
    /// Opens it, if it is still the version looked at (same identity,
    /// size and modification time): else it changed, and what is read
    /// would not be the snapshot's.
    pub(crate) fn open(&self) -> Result<File, SaveFilesError> {
        let opened = match &self.at {
            Location::Root(path) => spot_worker_untrusted::open(path, &Owners::Any),
            Location::Below { root, names } => open_below(root, names),
        };
        let file = match opened {
            Ok(file) => file,
            Err(UntrustedError::Io { source, .. }) if !is_gone(&source) => {
                return Err(SaveFilesError::Io(source));
            }
            // Gone or replaced by something else since the look.
            Err(_) => return Err(SaveFilesError::Unstable),
        };
        if stamp(&self.path, &file.metadata()?) != stamp(&self.path, &self.meta) {
            return Err(SaveFilesError::Unstable);
        }
        Ok(file)
    }
}

fn open_below(root: &Dir, names: &[OsString]) -> Result<File, UntrustedError> {
    let Some((file, dirs)) = names.split_last() else {
        return Err(UntrustedError::Io {
            path: String::new(),
            source: std::io::Error::other("an empty path below a directory root"),
        });
    };
    let mut walked: Option<Dir> = None;
    for name in dirs {
        let next = walked.as_ref().unwrap_or(root).dir(name)?;
        walked = Some(next);
    }
    walked.as_ref().unwrap_or(root).file(file, &Owners::Any)
}

fn is_gone(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
    )
}

/// The files of all roots, and what was passed over (links, FIFOs,
/// devices), each with the reason.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) files: Vec<SnapFile>,
    pub(crate) skipped: Vec<String>,
    /// What was at the roots as they were walked.
    pub(crate) stamps: Vec<Stamp>,
    /// Entries counted against [`MAX_ENTRIES`], directories included.
    entries: usize,
}

/// What identifies a version of one file without reading it.
pub(crate) type Stamp = (String, u64, u64, u64, i64, i64);

fn stamp(path: &str, meta: &Metadata) -> Stamp {
    (
        path.to_owned(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
    )
}

impl Snapshot {
    /// Looks at every file under `roots` (nothing is opened).
    pub(crate) fn take(roots: &CheckpointFiles) -> Result<Snapshot, SaveFilesError> {
        let mut snapshot = Snapshot::default();
        for root in &roots.roots {
            if root.is_dir {
                snapshot.walk_root(&root.path, &root.name, roots)?;
            } else {
                snapshot.add_file_root(&root.path, &root.name)?;
            }
        }
        snapshot.files.sort_by(|a, b| a.path.cmp(&b.path));
        snapshot.stamps.sort();
        Ok(snapshot)
    }

    /// The stamps of what is at the roots now.
    pub(crate) fn stamps_now(roots: &CheckpointFiles) -> Result<Vec<Stamp>, SaveFilesError> {
        Ok(Self::take(roots)?.stamps)
    }

    /// The total size of the files.
    pub(crate) fn size(&self) -> u64 {
        self.files.iter().map(|f| f.meta.len()).sum()
    }

    fn count(&mut self, path: &str, meta: &Metadata) -> Result<(), SaveFilesError> {
        self.count_only()?;
        // Links and special files too: one appearing is a change (and a
        // save says why it passed it over).
        if !meta.is_dir() {
            self.stamps.push(stamp(path, meta));
        }
        Ok(())
    }

    /// Counts an entry against [`MAX_ENTRIES`] without a stamp: its
    /// changes are no change of the checkpoint's.
    fn count_only(&mut self) -> Result<(), SaveFilesError> {
        if self.entries >= MAX_ENTRIES {
            return Err(SaveFilesError::TooMany { limit: MAX_ENTRIES });
        }
        self.entries += 1;
        Ok(())
    }

    fn add_file_root(&mut self, path: &std::path::Path, name: &str) -> Result<(), SaveFilesError> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        self.count(name, &meta)?;
        if meta.file_type().is_file() {
            self.files.push(SnapFile {
                path: name.to_owned(),
                meta,
                at: Location::Root(path.to_owned()),
            });
        } else {
            self.skipped
                .push(passed_over(&path.to_string_lossy(), &meta));
        }
        Ok(())
    }

    fn walk_root(
        &mut self,
        path: &std::path::Path,
        name: &str,
        roots: &CheckpointFiles,
    ) -> Result<(), SaveFilesError> {
        let root = match Dir::open(path) {
            Ok(root) => Arc::new(root),
            Err(UntrustedError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(());
            }
            Err(UntrustedError::Io { source, .. }) => return Err(source.into()),
            Err(refused) => {
                self.skipped.push(refused.to_string());
                return Ok(());
            }
        };
        let shown = path.to_string_lossy().into_owned();
        self.walk(&root, &root, &mut Vec::new(), name, &shown, roots)
    }

    /// Walks `dir`, which is `names` below `root`.
    fn walk(
        &mut self,
        root: &Arc<Dir>,
        dir: &Dir,
        names: &mut Vec<OsString>,
        path: &str,
        shown: &str,
        roots: &CheckpointFiles,
    ) -> Result<(), SaveFilesError> {
        // Never more names read than the cap leaves room for.
        let room = MAX_ENTRIES.saturating_sub(self.entries);
        let Some(entries) = dir.entries_at_most(room).map_err(untrusted_io)? else {
            return Err(SaveFilesError::TooMany { limit: MAX_ENTRIES });
        };
        for (entry, meta) in entries {
            // A manifest path is text, and no longer than a restore
            // accepts: anything else is refused now, not lost later.
            let Some(text) = entry.to_str() else {
                return Err(SaveFilesError::BadPath {
                    path: format!("{}/{}", escape_line(shown), escape_bytes(entry.as_bytes())),
                    why: "is not UTF-8 text",
                });
            };
            let (child, child_shown) = (format!("{path}/{text}"), format!("{shown}/{text}"));
            if child.len() > MAX_PATH_LEN {
                return Err(SaveFilesError::BadPath {
                    path: escape_line(&child_shown).into_owned(),
                    why: "is longer than the 4096 bytes a checkpoint path may have (counted from the directory's name, `dir/...`)",
                });
            }
            if !meta.is_dir() && roots.is_left_out(&child) {
                self.count_only()?;
                continue;
            }
            // A stand-in (the caller's consistent copy) is read for it.
            let stand_in = match roots.stand_in(&child) {
                Some(copy) if meta.file_type().is_file() => {
                    Some((std::fs::symlink_metadata(copy)?, copy.to_owned()))
                }
                _ => None,
            };
            if let Some((copy_meta, copy)) = stand_in {
                self.count(&child, &copy_meta)?;
                self.files.push(SnapFile {
                    path: child,
                    meta: copy_meta,
                    at: Location::Root(copy),
                });
                continue;
            }
            self.count(&child, &meta)?;
            names.push(entry.clone());
            if meta.is_dir() && names.len() > MAX_DEPTH {
                self.skipped.push(format!(
                    "{} nests deeper than {MAX_DEPTH}",
                    escape_line(&child_shown)
                ));
            } else if meta.is_dir() {
                match dir.dir(&entry) {
                    Ok(sub) => self.walk(root, &sub, names, &child, &child_shown, roots)?,
                    // Swapped since the look: the second look sees it.
                    Err(UntrustedError::Io { source, .. }) if !is_gone(&source) => {
                        return Err(source.into());
                    }
                    Err(_) => {}
                }
            } else if meta.file_type().is_file() {
                self.files.push(SnapFile {
                    path: child,
                    meta,
                    at: Location::Below {
                        root: Arc::clone(root),
                        names: names.clone(),
                    },
                });
            } else {
                self.skipped.push(passed_over(&child_shown, &meta));
            }
            names.pop();
        }
        Ok(())
    }
}

/// Why `meta` at `shown` is not saved.
fn passed_over(shown: &str, meta: &Metadata) -> String {
    let shown = escape_line(shown);
    if meta.file_type().is_symlink() {
        UntrustedError::Symlink {
            path: shown.into_owned(),
        }
        .to_string()
    } else {
        UntrustedError::NotRegular {
            path: shown.into_owned(),
            what: file_kind(meta.mode()),
        }
        .to_string()
    }
}

fn untrusted_io(error: UntrustedError) -> SaveFilesError {
    match error {
        UntrustedError::Io { source, .. } => SaveFilesError::Io(source),
        other => SaveFilesError::Io(std::io::Error::other(other.to_string())),
    }
}
