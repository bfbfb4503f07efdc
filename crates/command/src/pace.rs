//! The progress file (`SPOT_WORKER_PROGRESS`): how far the program says it
//! is, as a fraction of its job, and the time the rest of the job takes at
//! this delivery's pace, so the runner's saves of the checkpoint file are
//! spread over the rest of the job ("Jobs that end" in
//! docs/checkpoint-interval.md). The file is optional; a malformed one is
//! said once in the log and ignored, never a fault of the program's.

use std::path::Path;
use std::time::{Duration, Instant};

use spot_worker_decisions::cadence::time_left;

use crate::progress::{ProgressError, read_stable};

/// The most bytes a progress file holds (a number and a line end).
const MAX_PROGRESS_BYTES: u64 = 64;

/// Why the progress file is not a fraction of the job.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProgressFileError {
    /// Not text, or not a number.
    #[error("it holds {found:?}, not a number such as 0.42")]
    NotANumber {
        /// What it holds (lossily decoded).
        found: String,
    },
    /// A number outside 0..=1.
    #[error("it holds {value}, not a fraction between 0 and 1")]
    OutOfRange {
        /// The number.
        value: f64,
    },
    /// Reading it failed (too big, changing during every read, unreadable).
    #[error("{0}")]
    Unreadable(String),
}

/// The fraction of its job a progress file's `bytes` say is done: one
/// decimal number in 0..=1, blanks around it allowed.
///
/// ```
/// use spot_worker_command::parse_progress;
///
/// assert_eq!(parse_progress(b"0.42\n"), Ok(0.42));
/// assert!(parse_progress(b"42%").is_err());
/// ```
pub fn parse_progress(bytes: &[u8]) -> Result<f64, ProgressFileError> {
    let not_a_number = || ProgressFileError::NotANumber {
        found: String::from_utf8_lossy(bytes).into_owned(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| not_a_number())?;
    let value: f64 = text.trim().parse().map_err(|_| not_a_number())?;
    // `parse` takes "NaN" and "inf"; neither is a fraction.
    if !(0.0..=1.0).contains(&value) {
        return Err(ProgressFileError::OutOfRange { value });
    }
    Ok(value)
}

/// Reads the progress file at `path`: `None` if there is none.
pub(crate) fn read_progress(path: &Path) -> Result<Option<f64>, ProgressFileError> {
    match read_stable(path, MAX_PROGRESS_BYTES) {
        Ok(Some(bytes)) => parse_progress(&bytes).map(Some),
        Ok(None) => Ok(None),
        Err(ProgressError::TooBig { size, limit }) => Err(ProgressFileError::Unreadable(format!(
            "the progress file is {size} bytes, over the {limit} bytes one number needs"
        ))),
        Err(error) => Err(ProgressFileError::Unreadable(
            error
                .to_string()
                .replace("checkpoint file", "progress file"),
        )),
    }
}

/// The share of its job the program says is done as a save of its
/// checkpoint starts: the progress file read now, so that the save stamps
/// the program's progress as of the version it keeps (the lane rule, the
/// keeper and `status` read that stamp), never a reading from a look
/// minutes old or none at all. `None` without a readable file (a
/// malformed one is said in the log at the looks).
pub(crate) fn progress_at_save(path: &Path) -> Option<f64> {
    read_progress(path).ok().flatten()
}

/// One delivery's pace: its first reading of the progress file, against
/// which later ones measure how fast the program goes.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    first: Option<(Instant, f64)>,
}

impl Pace {
    /// Whether a first reading was taken.
    pub(crate) fn started(&self) -> bool {
        self.first.is_some()
    }

    /// Takes a reading of `done` (a fraction of the job) at `at`: the
    /// time the rest of the job takes at the pace since the first
    /// reading; `None` while there is no pace (the first reading, no
    /// progress since, or progress gone back).
    pub(crate) fn left(&mut self, done: f64, at: Instant) -> Option<Duration> {
        let (since, first) = *self.first.get_or_insert((at, done));
        time_left(
            done - first,
            at.saturating_duration_since(since),
            1.0 - done,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_file_is_one_fraction_of_the_job() {
        let not_a_number = |found: &str| {
            Err(ProgressFileError::NotANumber {
                found: found.to_owned(),
            })
        };
        let cases: [(&[u8], Result<f64, ProgressFileError>); 12] = [
            (b"0", Ok(0.0)),
            (b"1", Ok(1.0)),
            (b"0.42", Ok(0.42)),
            (b"  0.5\n", Ok(0.5)),
            (b"1e-1\r\n", Ok(0.1)),
            (b"", not_a_number("")),
            (b"42%", not_a_number("42%")),
            (b"0.1 0.2", not_a_number("0.1 0.2")),
            (b"\xff", not_a_number("\u{fffd}")),
            (b"1.5", Err(ProgressFileError::OutOfRange { value: 1.5 })),
            (b"-0.1", Err(ProgressFileError::OutOfRange { value: -0.1 })),
            (
                b"inf",
                Err(ProgressFileError::OutOfRange {
                    value: f64::INFINITY,
                }),
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(
                parse_progress(bytes),
                expected,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        assert!(matches!(
            parse_progress(b"NaN"),
            Err(ProgressFileError::OutOfRange { value }) if value.is_nan()
        ));
    }

    #[test]
    fn the_rest_of_the_job_goes_at_the_pace_since_the_first_reading() {
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let mut pace = Pace::default();
        // Whole milliseconds: the fractions are not exact in binary.
        let mut left = |done, seconds| {
            pace.left(done, at(seconds))
                .map(|left: Duration| (left.as_secs_f64() * 1000.0).round() as u64)
        };
        assert_eq!(left(0.25, 0), None, "no pace yet");
        assert_eq!(left(0.25, 5), None, "no progress since");
        assert_eq!(left(0.5, 10), Some(20_000));
        assert_eq!(left(0.75, 20), Some(10_000));
        assert_eq!(left(0.1, 30), None, "progress gone back");
        assert_eq!(left(1.0, 40), Some(0));
        assert!(pace.started());
    }

    /// What a save stamps comes first from the progress file as the save
    /// starts; without a readable one, from what the job reported before
    /// (the clock keeps it: an earlier look, a handler's report); and
    /// without any report the lane rule takes the useful time
    /// (`progress_of`'s own table test).
    #[test]
    fn a_save_takes_the_progress_file_as_it_is_then_or_leaves_the_earlier_report() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress");
        // (file content, None: no file) → the share the save reports
        let rows: [(Option<&str>, Option<f64>); 6] = [
            (Some("0.5\n"), Some(0.5)),
            (Some("0.375"), Some(0.375)),
            (Some("1"), Some(1.0)),
            (Some("37.5%"), None),
            (Some("1.5"), None),
            (None, None),
        ];
        for (content, expected) in rows {
            match content {
                Some(content) => std::fs::write(&path, content).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&path);
                }
            }
            assert_eq!(progress_at_save(&path), expected, "{content:?}");
        }
    }

    #[test]
    fn a_missing_file_is_no_reading_and_a_big_one_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress");
        assert_eq!(read_progress(&path), Ok(None));
        std::fs::write(&path, "0.25\n").unwrap();
        assert_eq!(read_progress(&path), Ok(Some(0.25)));
        std::fs::write(&path, "0".repeat(100)).unwrap();
        let error = read_progress(&path).unwrap_err().to_string();
        assert!(
            error.starts_with("the progress file is 100 bytes"),
            "{error}"
        );
    }
}
