//! Finding the SQLite databases under the checkpoint's directory roots: by
//! their header, walked through the untrusted directory (bounded depth and
//! entries), with the companions of a database being created.

use std::ffi::OsString;
use std::fs::Metadata;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use spot_worker_storage::files::MAX_ENTRIES;
use spot_worker_untrusted::{Dir, Owners, UntrustedError};

use super::{BackupError, COMPANIONS, MAX_DEPTH, SQLITE_HEADER};

/// A database found: its manifest path, where it is, and which file it is.
#[derive(Debug)]
pub(super) struct Found {
    pub(super) path: String,
    pub(super) root: PathBuf,
    pub(super) names: Vec<OsString>,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl Found {
    pub(super) fn on_disk(&self) -> PathBuf {
        self.names
            .iter()
            .fold(self.root.clone(), |path, name| path.join(name))
    }

    /// Whether the very file found is at its place now, reached without
    /// following a link.
    pub(super) fn still_there(&self) -> bool {
        at(&self.root, &self.names)
            .is_some_and(|meta| (meta.dev(), meta.ino()) == (self.dev, self.ino))
    }
}

/// The metadata of what is at `names` below `root`, reached through
/// directories opened without following links.
fn at(root: &Path, names: &[OsString]) -> Option<Metadata> {
    let (last, dirs) = names.split_last()?;
    let mut dir = Dir::open(root).ok()?;
    for name in dirs {
        dir = dir.dir(name).ok()?;
    }
    dir.file(last, &Owners::Any).ok()?.metadata().ok()
}

/// The SQLite databases under the directory root `name` at `root`,
/// walked as the save walks it (no link followed, bounded).
pub(super) fn find_databases(
    root: &Path,
    name: &str,
    found: &mut Vec<Found>,
    nascent: &mut Vec<String>,
) -> Result<(), BackupError> {
    let dir = match Dir::open(root) {
        Ok(dir) => dir,
        Err(error) if error.is_not_found() => return Ok(()),
        Err(error) => return Err(untrusted(error)),
    };
    let mut walk = Walk {
        root,
        found,
        nascent,
        entries: 0,
    };
    walk.dir(&dir, &mut Vec::new(), name)
}

struct Walk<'a> {
    root: &'a Path,
    found: &'a mut Vec<Found>,
    /// The companions (`-journal`, `-wal`, `-shm`) of files still shorter
    /// than a SQLite header: databases being created.
    nascent: &'a mut Vec<String>,
    entries: usize,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Dir, names: &mut Vec<OsString>, path: &str) -> Result<(), BackupError> {
        // More than the save takes is its error to say, not this one's.
        let room = MAX_ENTRIES.saturating_sub(self.entries);
        let Some(entries) = dir.entries_at_most(room).map_err(untrusted)? else {
            return Ok(());
        };
        self.entries += entries.len();
        let short: Vec<&str> = entries
            .iter()
            .filter(|(_, meta)| {
                meta.file_type().is_file() && meta.len() < SQLITE_HEADER.len() as u64
            })
            .filter_map(|(entry, _)| entry.to_str())
            .collect();
        for (entry, _) in &entries {
            let Some(text) = entry.to_str() else {
                continue;
            };
            let of_nascent = COMPANIONS.iter().any(|suffix| {
                text.strip_suffix(suffix)
                    .is_some_and(|base| short.contains(&base))
            });
            if of_nascent {
                self.nascent.push(format!("{path}/{text}"));
            }
        }
        for (entry, meta) in entries {
            // A name the save refuses is its error to say.
            let Some(text) = entry.to_str() else {
                continue;
            };
            let child = format!("{path}/{text}");
            names.push(entry.clone());
            if meta.is_dir() && names.len() <= MAX_DEPTH {
                if let Ok(sub) = dir.dir(&entry) {
                    self.dir(&sub, names, &child)?;
                }
            } else if meta.file_type().is_file()
                && meta.len() >= SQLITE_HEADER.len() as u64
                && is_database(dir, &entry)
            {
                self.found.push(Found {
                    path: child,
                    root: self.root.to_owned(),
                    names: names.clone(),
                    dev: meta.dev(),
                    ino: meta.ino(),
                });
            }
            names.pop();
        }
        Ok(())
    }
}

/// Whether the file `name` in `dir` starts as a SQLite database does.
fn is_database(dir: &Dir, name: &OsString) -> bool {
    let Ok(file) = dir.file(name, &Owners::Any) else {
        return false;
    };
    let mut header = [0u8; 16];
    (&file).read_exact(&mut header).is_ok() && &header == SQLITE_HEADER
}

fn untrusted(error: UntrustedError) -> BackupError {
    match error {
        UntrustedError::Io { source, .. } => BackupError::Io(source),
        other => BackupError::Io(std::io::Error::other(other.to_string())),
    }
}
