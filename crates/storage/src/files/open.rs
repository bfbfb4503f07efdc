//! Opening a path someone else controls (a program's checkpoint file, its
//! result): never following a symbolic link, never blocking on a FIFO or a
//! device, and only ever a regular file. `File::open` does all three wrong:
//! a link at the path reads whatever it points to, a FIFO with no writer
//! blocks the opening thread for ever, and a device reads without end.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a path could not be opened as a regular file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing is there.
    #[error("{path} does not exist")]
    Missing {
        /// The path.
        path: String,
    },
    /// A symbolic link is there: it is not followed.
    #[error("{path} is a symbolic link, which is not followed; write a regular file there")]
    Link {
        /// The path.
        path: String,
    },
    /// Something else than a regular file is there (a FIFO, a socket, a
    /// device, a directory).
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular {
        /// The path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// The system refused (permissions, I/O).
    #[error("opening {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// What the system said.
        source: io::Error,
    },
}

impl OpenError {
    /// True if nothing is at the path.
    pub fn is_missing(&self) -> bool {
        matches!(self, OpenError::Missing { .. })
    }
}

/// Opens `path` for reading if it is a regular file: `O_NOFOLLOW` (a link
/// is refused, not followed), `O_NONBLOCK` (a FIFO opens at once instead of
/// waiting for a writer, and is then refused) and `O_CLOEXEC`, then checked
/// on the open descriptor (`fstat`), so what is checked is what is read.
/// Returns the file and its metadata.
///
/// ```
/// use spot_worker_storage::files::open_regular;
///
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("checkpoint");
/// std::fs::write(&file, b"7").unwrap();
/// let (_, meta) = open_regular(&file).unwrap();
/// assert_eq!(meta.len(), 1);
/// std::os::unix::fs::symlink(&file, dir.path().join("link")).unwrap();
/// assert!(open_regular(&dir.path().join("link")).is_err());
/// assert!(open_regular(&dir.path().join("none")).unwrap_err().is_missing());
/// ```
pub fn open_regular(path: &Path) -> Result<(File, Metadata), OpenError> {
    let shown = || path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ENOENT) => OpenError::Missing { path: shown() },
            Some(libc::ELOOP) => OpenError::Link { path: shown() },
            // A socket cannot be opened at all.
            Some(libc::ENXIO) => OpenError::NotRegular {
                path: shown(),
                kind: "socket",
            },
            _ => OpenError::Io {
                path: shown(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| OpenError::Io {
        path: shown(),
        source,
    })?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let kind = if kind.is_fifo() {
            "FIFO"
        } else if kind.is_dir() {
            "directory"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else {
            "special file"
        };
        return Err(OpenError::NotRegular {
            path: shown(),
            kind,
        });
    }
    Ok((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let error = open_regular(&fifo).unwrap_err();
        assert!(
            matches!(error, OpenError::NotRegular { kind: "FIFO", .. }),
            "{error}"
        );
        let error = open_regular(dir.path()).unwrap_err();
        assert!(error.to_string().contains("directory"), "{error}");
    }
}
