//! What a set of checkpoint files is at one moment: every regular file
//! under its roots, opened (see [`open_regular`]) and stat'ed, in path
//! order. A save reads from these open files; afterwards the roots are
//! walked again, and only if nothing appeared, went, or changed meanwhile
//! is what was read one version of them all.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::CheckpointFiles;
use super::open::{OpenError, open_regular};

/// How deep a checkpoint directory may nest.
const MAX_DEPTH: usize = 64;

/// One file of a snapshot.
#[derive(Debug)]
pub(crate) struct SnapFile {
    /// Its manifest path (`root` or `root/relative`).
    pub(crate) path: String,
    pub(crate) file: Arc<File>,
    pub(crate) meta: Metadata,
}

/// The files of all roots, and what was passed over (links, FIFOs,
/// devices), each with the reason.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) files: Vec<SnapFile>,
    pub(crate) skipped: Vec<String>,
    /// What was at the roots just before they were opened.
    pub(crate) before: Vec<Stamp>,
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
    /// Opens every regular file under `roots`.
    pub(crate) fn take(roots: &CheckpointFiles) -> std::io::Result<Snapshot> {
        let mut snapshot = Snapshot {
            before: Self::stamps_now(roots)?,
            ..Snapshot::default()
        };
        for root in &roots.roots {
            if root.is_dir {
                snapshot.walk_dir(&root.path, &root.name, 0)?;
            } else {
                snapshot.add_file(&root.path, root.name.clone())?;
            }
        }
        snapshot.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(snapshot)
    }

    /// Whether every file opened is the one that was at its path just
    /// before (it was not replaced in between).
    pub(crate) fn opened_what_was_there(&self) -> bool {
        self.files
            .iter()
            .all(|f| self.before.binary_search(&stamp(&f.path, &f.meta)).is_ok())
    }

    /// The stamps of what is at the roots now (without opening anything).
    pub(crate) fn stamps_now(roots: &CheckpointFiles) -> std::io::Result<Vec<Stamp>> {
        let mut stamps = Vec::new();
        for root in &roots.roots {
            collect_stamps(&root.path, &root.name, root.is_dir, 0, &mut stamps)?;
        }
        stamps.sort();
        Ok(stamps)
    }

    /// The total size of the files.
    pub(crate) fn size(&self) -> u64 {
        self.files.iter().map(|f| f.meta.len()).sum()
    }

    fn add_file(&mut self, path: &Path, name: String) -> std::io::Result<()> {
        match open_regular(path) {
            Ok((file, meta)) => self.files.push(SnapFile {
                path: name,
                file: Arc::new(file),
                meta,
            }),
            Err(OpenError::Missing { .. }) => {}
            Err(OpenError::Io { source, .. }) => return Err(source),
            Err(skipped) => self.skipped.push(skipped.to_string()),
        }
        Ok(())
    }

    fn walk_dir(&mut self, dir: &Path, name: &str, depth: usize) -> std::io::Result<()> {
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                self.skipped.push(format!(
                    "{} is not a directory (a link is not followed)",
                    dir.display()
                ));
                return Ok(());
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        }
        if depth > MAX_DEPTH {
            self.skipped
                .push(format!("{} nests deeper than {MAX_DEPTH}", dir.display()));
            return Ok(());
        }
        for (entry_name, path, kind) in entries(dir)? {
            let child = format!("{name}/{entry_name}");
            if kind.is_dir() {
                self.walk_dir(&path, &child, depth + 1)?;
            } else {
                self.add_file(&path, child)?;
            }
        }
        Ok(())
    }
}

/// A directory's entries, by name, with their types (links not followed);
/// names that are not UTF-8 are passed over (a manifest path is text).
fn entries(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, std::fs::FileType)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        out.push((name, entry.path(), entry.file_type()?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn collect_stamps(
    path: &Path,
    name: &str,
    is_dir: bool,
    depth: usize,
    out: &mut Vec<Stamp>,
) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if is_dir && meta.is_dir() && depth <= MAX_DEPTH {
        for (entry_name, child, _) in entries(path)? {
            collect_stamps(
                &child,
                &format!("{name}/{entry_name}"),
                true,
                depth + 1,
                out,
            )?;
        }
    } else if !meta.is_dir() {
        // Links and special files too: one appearing is a change (and a
        // save says why it passed it over).
        out.push(stamp(name, &meta));
    }
    Ok(())
}
