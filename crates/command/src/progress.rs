//! The checkpoint file: read it whole and only when it holds still, and
//! keep its bytes, exactly, in the job's checkpoint.

use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use spot_worker_untrusted::{Owners, UntrustedError};

/// The checkpoint field that holds the file's bytes, base64-encoded.
const FILE_FIELD: &str = "file_base64";

/// How often a read is tried again while the file keeps changing under it.
const STABLE_TRIES: usize = 8;

/// Why the checkpoint file could not be read, or a checkpoint not decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    /// The file is bigger than the limit.
    #[error(
        "the checkpoint file is {size} bytes, over the limit of {limit} bytes \
         (SPOT_WORKER_CHECKPOINT_MAX_BYTES); keep less progress in it"
    )]
    TooBig {
        /// Its size when it was read.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// It changed during every read.
    #[error("the checkpoint file changed during each of {STABLE_TRIES} reads")]
    Unstable,
    /// Reading it failed.
    #[error("reading the checkpoint file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The job's checkpoint was not written by this runner.
    #[error(
        "the job's checkpoint holds {found}, not a saved checkpoint file ({{\"{FILE_FIELD}\": …}})"
    )]
    NotAFile {
        /// What it holds (shortened).
        found: String,
    },
}

/// Reads the whole file at `path` as one version of it: the bytes read from
/// one open file, whose size and modification time did not change while it
/// was read, and which is still the file at `path` afterwards. A program
/// that replaces the file (write a temporary file, rename) while it is read
/// makes the read start again on the new file, so a half-written file is
/// never returned. `None` if there is no file.
pub fn read_stable(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, ProgressError> {
    read_stable_version(path, limit).map(|read| read.map(|(bytes, _)| bytes))
}

/// [`read_stable`], with the metadata of the version read (its identity
/// and times, for how long the program took to write it).
pub fn read_stable_version(
    path: &Path,
    limit: u64,
) -> Result<Option<(Vec<u8>, fs::Metadata)>, ProgressError> {
    let io = |source| ProgressError::Io {
        path: path.display().to_string(),
        source,
    };
    for _ in 0..STABLE_TRIES {
        // The program's to put anything at: never through a link, never
        // blocking on a FIFO, a regular file only.
        let mut file = match spot_worker_untrusted::open(path, &Owners::Any) {
            Ok(file) => file,
            Err(error) if error.is_not_found() => return Ok(None),
            Err(UntrustedError::Io { source, .. }) => return Err(io(source)),
            Err(refused) => {
                return Err(io(std::io::Error::new(
                    ErrorKind::InvalidInput,
                    refused.to_string(),
                )));
            }
        };
        let before = file.metadata().map_err(io)?;
        if before.len() > limit {
            return Err(ProgressError::TooBig {
                size: before.len(),
                limit,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(before.len()).unwrap_or(0));
        (&mut file)
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > limit {
            return Err(ProgressError::TooBig {
                size: bytes.len() as u64,
                limit,
            });
        }
        let after = file.metadata().map_err(io)?;
        let at_path = match fs::metadata(path) {
            Ok(meta) => Some(meta),
            Err(error) if error.kind() == ErrorKind::NotFound => None,
            Err(error) => return Err(io(error)),
        };
        let held_still = before.len() == after.len()
            && after.len() == bytes.len() as u64
            && (before.mtime(), before.mtime_nsec()) == (after.mtime(), after.mtime_nsec())
            && at_path.is_some_and(|now| (now.dev(), now.ino()) == (after.dev(), after.ino()));
        if held_still {
            return Ok(Some((bytes, after)));
        }
    }
    Err(ProgressError::Unstable)
}

/// The checkpoint progress that keeps `bytes`.
pub fn to_progress(bytes: &[u8]) -> Value {
    json!({ FILE_FIELD: STANDARD.encode(bytes), "bytes": bytes.len() })
}

/// The file bytes a progress value keeps.
pub fn from_progress(progress: &Value) -> Result<Vec<u8>, ProgressError> {
    let not_a_file = || {
        let mut found = progress.to_string();
        if found.len() > 200 {
            let cut = (0..=200)
                .rev()
                .find(|&at| found.is_char_boundary(at))
                .unwrap_or(0);
            found.truncate(cut);
            found.push('…');
        }
        ProgressError::NotAFile { found }
    };
    let text = progress
        .get(FILE_FIELD)
        .and_then(Value::as_str)
        .ok_or_else(not_a_file)?;
    STANDARD.decode(text).map_err(|_| not_a_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_or_a_fifo_at_the_files_path_is_refused_without_following_or_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("only-the-runners");
        std::fs::write(&secret, b"key").unwrap();
        let link = dir.path().join("checkpoint");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let error = read_stable(&link, 100).unwrap_err().to_string();
        assert!(error.contains("symbolic link"), "{error}");
        let fifo = dir.path().join("progress");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let error = read_stable(&fifo, 100).unwrap_err().to_string();
        assert!(error.contains("a FIFO, not a regular file"), "{error}");
    }

    #[test]
    fn bytes_round_trip_exactly() {
        for bytes in [&b""[..], b"cursor=10\n", &[0, 255, 10, 13, 0x80]] {
            assert_eq!(from_progress(&to_progress(bytes)).unwrap(), bytes);
        }
        let err = from_progress(&json!({"cursor": 1})).unwrap_err();
        assert!(
            err.to_string().contains("not a saved checkpoint file"),
            "{err}"
        );
    }

    #[test]
    fn reads_whole_files_and_refuses_big_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        assert!(read_stable(&path, 10).unwrap().is_none());
        fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_stable(&path, 10).unwrap().unwrap(), b"0123456789");
        let err = read_stable(&path, 9).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the checkpoint file is 10 bytes, over the limit of 9 bytes"),
            "{err}"
        );
    }
}
