//! Opening a file someone else may have put in place: never through a
//! symbolic link, never blocking, and only a regular file of an expected
//! owner.
//!
//! A path in a directory another user (or the program) can write to may be
//! anything by the time it is opened: a symbolic link to `/dev/zero` or to a
//! file only the worker may read, a FIFO that blocks `open(2)` until someone
//! writes to it, a device, a directory. `O_NOFOLLOW` refuses the link (the
//! last component only: the directories above must be trusted),
//! `O_NONBLOCK` makes opening a FIFO return at once, and the type and owner
//! are then checked on the open file itself (`fstat`), so nothing can be
//! swapped in between the check and the read.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::escape::escape_line;

/// Who may own a file opened with [`open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Anyone: only the type is checked.
    Any,
    /// Only these uids.
    Only(Vec<u32>),
}

impl Owners {
    fn allow(&self, uid: u32) -> bool {
        match self {
            Owners::Any => true,
            Owners::Only(uids) => uids.contains(&uid),
        }
    }
}

/// Why a file someone else controls was not opened or read. Paths are
/// shown escaped ([`escape_line`]): they may hold any byte.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedError {
    /// The system call failed (not found, permission denied, ...).
    #[error("{path}: {source}")]
    Io {
        /// The path, escaped.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The path is a symbolic link, which is never followed.
    #[error("{path} is a symbolic link (not followed)")]
    Symlink {
        /// The path, escaped.
        path: String,
    },
    /// Not a regular file.
    #[error("{path} is {what}, not a regular file")]
    NotRegular {
        /// The path, escaped.
        path: String,
        /// What it is instead ("a FIFO", "a directory", ...).
        what: &'static str,
    },
    /// A regular file of an owner not expected.
    #[error("{path} belongs to uid {uid}, not to {expected}")]
    Owner {
        /// The path, escaped.
        path: String,
        /// Its owner.
        uid: u32,
        /// Who was expected, for a person.
        expected: String,
    },
    /// Longer than the cap.
    #[error("{path} is over {limit} bytes")]
    TooBig {
        /// The path, escaped.
        path: String,
        /// The cap.
        limit: usize,
    },
}

impl UntrustedError {
    /// Whether nothing was there at all (the one error a caller may take
    /// for "absent" rather than "unknown").
    pub fn is_not_found(&self) -> bool {
        matches!(self, UntrustedError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Opens `path` for reading if it is a regular file owned by one of
/// `owners`: a symbolic link is refused rather than followed, and a FIFO,
/// a device or a directory is refused without blocking.
///
/// ```
/// use spot_worker_untrusted::{Owners, UntrustedError, open};
///
/// let dir = tempfile::tempdir()?;
/// let fifo = dir.path().join("fifo");
/// assert!(std::process::Command::new("mkfifo").arg(&fifo).status()?.success());
/// // Returns at once, though no one writes to the FIFO.
/// assert!(matches!(open(&fifo, &Owners::Any), Err(UntrustedError::NotRegular { what: "a FIFO", .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open(path: &Path, owners: &Owners) -> Result<File, UntrustedError> {
    let shown = || escape_line(&path.to_string_lossy()).into_owned();
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => UntrustedError::Symlink { path: shown() },
            _ => UntrustedError::Io {
                path: shown(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| UntrustedError::Io {
        path: shown(),
        source,
    })?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            "of an unknown type"
        };
        return Err(UntrustedError::NotRegular {
            path: shown(),
            what,
        });
    }
    if !owners.allow(meta.uid()) {
        let expected = match owners {
            Owners::Any => "anyone".to_owned(),
            Owners::Only(uids) => {
                let uids: Vec<String> = uids.iter().map(u32::to_string).collect();
                format!("uid {}", uids.join(" or "))
            }
        };
        return Err(UntrustedError::Owner {
            path: shown(),
            uid: meta.uid(),
            expected,
        });
    }
    Ok(file)
}

/// Reads at most `max` bytes from `reader`; with them, whether more were
/// there.
///
/// ```
/// let (bytes, more) = spot_worker_untrusted::read_at_most(&mut &b"abcdef"[..], 4)?;
/// assert_eq!((bytes.as_slice(), more), (&b"abcd"[..], true));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read_at_most(reader: &mut impl Read, max: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut bytes = Vec::new();
    reader
        .take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)?;
    let more = bytes.len() > max;
    bytes.truncate(max);
    Ok((bytes, more))
}

/// [`open`]s `path` and reads all of it, refusing a file of more than
/// `max` bytes ([`UntrustedError::TooBig`]) without reading further.
pub fn read_whole(path: &Path, owners: &Owners, max: usize) -> Result<Vec<u8>, UntrustedError> {
    let mut file = open(path, owners)?;
    let (bytes, more) = read_at_most(&mut file, max).map_err(|source| UntrustedError::Io {
        path: escape_line(&path.to_string_lossy()).into_owned(),
        source,
    })?;
    if more {
        return Err(UntrustedError::TooBig {
            path: escape_line(&path.to_string_lossy()).into_owned(),
            limit: max,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::process::Command;

    use super::*;

    /// The uid of this process.
    fn me() -> u32 {
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn only_a_regular_file_of_an_expected_owner_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("file"), b"pid 1").unwrap();
        symlink(at("file"), at("link")).unwrap();
        symlink("/dev/zero", at("zero")).unwrap();
        std::fs::create_dir(at("dir")).unwrap();
        let made = Command::new("mkfifo").arg(at("fifo")).status().unwrap();
        assert!(made.success());
        let mine = Owners::Only(vec![me()]);
        let others = Owners::Only(vec![me().wrapping_add(1)]);
        // (case, name, owners, Ok(bytes) or Err(text of the error))
        type Row<'a> = (&'a str, &'a str, &'a Owners, Result<&'a [u8], &'a str>);
        let table: [Row; 8] = [
            ("a file", "file", &Owners::Any, Ok(b"pid 1")),
            ("a file of mine", "file", &mine, Ok(b"pid 1")),
            ("a file of another", "file", &others, Err("belongs to uid")),
            ("a link to it", "link", &Owners::Any, Err("symbolic link")),
            (
                "a link to /dev/zero",
                "zero",
                &Owners::Any,
                Err("symbolic link"),
            ),
            ("a directory", "dir", &Owners::Any, Err("is a directory")),
            ("a FIFO, no writer", "fifo", &Owners::Any, Err("is a FIFO")),
            ("nothing", "none", &Owners::Any, Err("No such file")),
        ];
        for (case, name, owners, expected) in table {
            match (read_whole(&at(name), owners, 64), expected) {
                (Ok(bytes), Ok(expected)) => assert_eq!(bytes, expected, "{case}"),
                (Err(error), Err(text)) => {
                    assert!(error.to_string().contains(text), "{case}: {error}")
                }
                (got, expected) => panic!("{case}: {got:?}, expected {expected:?}"),
            }
        }
        assert!(open(&at("none"), &Owners::Any).unwrap_err().is_not_found());
        assert!(!open(&at("fifo"), &Owners::Any).unwrap_err().is_not_found());
    }

    #[test]
    fn reads_stop_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![b'x'; 1000]).unwrap();
        assert_eq!(read_whole(&path, &Owners::Any, 1000).unwrap().len(), 1000);
        let error = read_whole(&path, &Owners::Any, 999).unwrap_err();
        assert!(
            matches!(error, UntrustedError::TooBig { limit: 999, .. }),
            "{error}"
        );
        let mut file = open(&path, &Owners::Any).unwrap();
        let (bytes, more) = read_at_most(&mut file, 10).unwrap();
        assert_eq!((bytes.len(), more), (10, true));
    }

    #[test]
    fn a_path_with_control_characters_is_shown_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a\x1b[2Jb");
        let error = open(&path, &Owners::Any).unwrap_err().to_string();
        assert!(error.contains("a\\u{1b}[2Jb"), "{error}");
        assert!(!error.contains('\x1b'), "{error}");
    }
}
