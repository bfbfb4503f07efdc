//! A directory someone else controls, walked without a link being followed
//! anywhere on the way: not at its own path, not at any directory below
//! it, not at a file in it. [`open`](crate::open) guards the last
//! component of a path only; a directory the program can write to may have
//! any of its subdirectories swapped for a link to `/etc` between a look
//! and an open, so below a [`Dir`] every step is taken from the directory
//! already open (`openat` with `O_NOFOLLOW`), never by a path again.

use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::escape::escape_line;
use crate::open::{Owners, UntrustedError, checked};

/// An open directory, reached without following a link.
#[derive(Debug)]
pub struct Dir {
    file: File,
    /// Its path, for messages (escaped).
    shown: String,
}

impl Dir {
    /// Opens the directory at `path`; a link there (or anything but a
    /// directory) is refused. The directories above `path` are trusted.
    pub fn open(path: &Path) -> Result<Dir, UntrustedError> {
        let shown = escape_line(&path.to_string_lossy()).into_owned();
        let name =
            CString::new(path.as_os_str().as_bytes()).map_err(|_| io_error(&shown, nul()))?;
        Self::open_at(libc::AT_FDCWD, &name, shown)
    }

    /// Opens the directory `name` in this one (one path component).
    pub fn dir(&self, name: &OsStr) -> Result<Dir, UntrustedError> {
        let shown = self.child(name);
        Self::open_at(self.file.as_raw_fd(), &component(name, &shown)?, shown)
    }

    /// Opens the file `name` in this one (one path component) for reading:
    /// a link, a FIFO (without blocking), a device or a directory is
    /// refused, and so is a file of an owner not in `owners`.
    pub fn file(&self, name: &OsStr, owners: &Owners) -> Result<File, UntrustedError> {
        let shown = self.child(name);
        let fd = openat(
            self.file.as_raw_fd(),
            &component(name, &shown)?,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
            &shown,
        )?;
        // SAFETY: `fd` was just opened and is owned by nothing else.
        checked(unsafe { File::from_raw_fd(fd) }, owners, || shown.clone())
    }

    /// Its entries (not `.` or `..`), by name, with what each is (a link's
    /// own metadata: nothing is followed), read from this open directory.
    pub fn entries(&self) -> Result<Vec<(OsString, Metadata)>, UntrustedError> {
        Ok(self.entries_at_most(usize::MAX)?.unwrap_or_default())
    }

    /// Its entries as [`Dir::entries`], if it holds at most `most`; `None`
    /// if it holds more. Reading stops at the first name past `most`, and
    /// nothing is looked at before every name is read, so a directory of
    /// millions costs no more than one of `most + 1` to refuse.
    ///
    /// ```
    /// use spot_worker_untrusted::Dir;
    ///
    /// let tree = tempfile::tempdir()?;
    /// for name in ["a", "b", "c"] {
    ///     std::fs::write(tree.path().join(name), name)?;
    /// }
    /// let dir = Dir::open(tree.path())?;
    /// assert_eq!(dir.entries_at_most(3)?.map(|e| e.len()), Some(3));
    /// assert!(dir.entries_at_most(2)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn entries_at_most(
        &self,
        most: usize,
    ) -> Result<Option<Vec<(OsString, Metadata)>>, UntrustedError> {
        // The magic link names this very open directory, whatever is at
        // its path now; each entry's metadata is `fstatat` on that stream,
        // without following links.
        let io = |source| io_error(&self.shown, source);
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            if names.len() == most {
                return Ok(None);
            }
            names.push(entry.map_err(io)?);
        }
        names.sort_by_key(std::fs::DirEntry::file_name);
        let mut entries = Vec::with_capacity(names.len());
        for entry in names {
            entries.push((entry.file_name(), entry.metadata().map_err(io)?));
        }
        Ok(Some(entries))
    }

    /// Its own metadata.
    pub fn metadata(&self) -> Result<Metadata, UntrustedError> {
        self.file.metadata().map_err(|e| io_error(&self.shown, e))
    }

    fn open_at(at: libc::c_int, name: &CString, shown: String) -> Result<Dir, UntrustedError> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = openat(at, name, flags, &shown).map_err(|error| match error {
            // O_NOFOLLOW with O_DIRECTORY refuses a link as not a directory.
            UntrustedError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOTDIR) => {
                match kind_at(at, name) {
                    Some("a symbolic link") => UntrustedError::Symlink {
                        path: shown.clone(),
                    },
                    what => UntrustedError::NotADirectory {
                        path: shown.clone(),
                        what: what.unwrap_or("of an unknown type"),
                    },
                }
            }
            other => other,
        })?;
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(Dir { file, shown })
    }

    fn child(&self, name: &OsStr) -> String {
        format!("{}/{}", self.shown, escape_line(&name.to_string_lossy()))
    }
}

/// What `name` in `at` is, as [`UntrustedError`] says it, without
/// following a link (`None` if it cannot be looked at).
fn kind_at(at: libc::c_int, name: &CString) -> Option<&'static str> {
    // SAFETY: a zeroed `stat` is a valid value for fstatat to fill.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `stat` is writable, `at` is open.
    let done = unsafe { libc::fstatat(at, name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) };
    (done == 0).then(|| crate::open::file_kind(stat.st_mode))
}

/// `name` as one path component: no `/`, not `.` or `..`, no NUL.
fn component(name: &OsStr, shown: &str) -> Result<CString, UntrustedError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || bytes == b"." || bytes == b".." {
        return Err(io_error(
            shown,
            io::Error::new(io::ErrorKind::InvalidInput, "not one path component"),
        ));
    }
    CString::new(bytes).map_err(|_| io_error(shown, nul()))
}

fn openat(
    at: libc::c_int,
    name: &CString,
    flags: libc::c_int,
    shown: &str,
) -> Result<libc::c_int, UntrustedError> {
    // SAFETY: `name` is a valid NUL-terminated string; `at` is an open
    // directory or AT_FDCWD.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd >= 0 {
        return Ok(fd);
    }
    let source = io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::ELOOP) => UntrustedError::Symlink {
            path: shown.to_owned(),
        },
        _ => io_error(shown, source),
    })
}

fn io_error(shown: &str, source: io::Error) -> UntrustedError {
    UntrustedError::Io {
        path: shown.to_owned(),
        source,
    }
}

fn nul() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_walk_never_follows_a_link_anywhere() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"root's").unwrap();
        let tree = tempfile::tempdir().unwrap();
        let root = tree.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/file"), b"mine").unwrap();
        symlink(outside.path(), root.join("away")).unwrap();
        symlink(outside.path().join("secret"), root.join("sub/secret")).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(root.join("fifo"))
                .status()
                .unwrap()
                .success()
        );

        let dir = Dir::open(&root).unwrap();
        let names: Vec<String> = dir
            .entries()
            .unwrap()
            .into_iter()
            .map(|(name, meta)| {
                format!(
                    "{} {}",
                    name.to_string_lossy(),
                    meta.file_type().is_symlink()
                )
            })
            .collect();
        assert_eq!(names, ["away true", "fifo false", "sub false"]);
        let sub = dir.dir(OsStr::new("sub")).unwrap();
        let mut file = sub.file(OsStr::new("file"), &Owners::Any).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text).unwrap();
        assert_eq!(text, "mine");
        let refused = [
            dir.dir(OsStr::new("away")).unwrap_err(),
            sub.file(OsStr::new("secret"), &Owners::Any).unwrap_err(),
            dir.file(OsStr::new("fifo"), &Owners::Any).unwrap_err(),
            dir.file(OsStr::new("sub"), &Owners::Any).unwrap_err(),
            dir.dir(OsStr::new("fifo")).unwrap_err(),
            dir.dir(OsStr::new("..")).unwrap_err(),
            Dir::open(&root.join("away")).unwrap_err(),
        ];
        let texts: Vec<String> = refused.iter().map(ToString::to_string).collect();
        for (text, expected) in texts.iter().zip([
            "symbolic link",
            "symbolic link",
            "a FIFO",
            "a directory",
            "is a FIFO, not a directory",
            "not one path component",
            "symbolic link",
        ]) {
            assert!(text.contains(expected), "{text}: expected {expected}");
        }

        // Swapped after it was opened: the open directory is still the
        // one walked, not what is at its path now.
        std::fs::rename(&root, tree.path().join("moved")).unwrap();
        symlink(outside.path(), &root).unwrap();
        let names: Vec<OsString> = dir.entries().unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }
}
