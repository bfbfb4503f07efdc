//! When the checkpoint directory is one state of the program, as pure
//! decisions: the commit marker's rule (a version is taken only when the
//! marker file the program writes last has changed, and only as the
//! directory was when it was written), and how promptly a read that found
//! the directory changing is tried again (100 ms, doubling, at most
//! [`LONGEST_RETRY`]), and when a directory that never holds still is
//! reported.
//!
//! The read itself is the storage crate's: every file held still while
//! read, and the directory's listing the same before and after (two passes
//! that agree). What that read cannot tell is whether the program was
//! between two of its own writes; the marker tells it.

use std::path::{Component, Path};
use std::time::Duration;

/// The first retry after a read that found the directory changing.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The longest wait between two tries: a directory written all the time is
/// still tried every few seconds, never an interval later.
pub const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// Tries that found the directory changing before it is reported as never
/// holding still (about 26 s of tries: 0.1 + 0.2 + … + 5 + 5 + 5 s).
pub const REPORT_AFTER: u32 = 10;

/// How long after the `tries`-th read that found the directory changing
/// (1 for the first) it is read again: [`FIRST_RETRY`], doubling, at most
/// [`LONGEST_RETRY`], and never later than `interval` (the worker's save
/// interval: a retry is never slower than the next look would be).
pub fn retry_after(tries: u32, interval: Duration) -> Duration {
    let doublings = tries.saturating_sub(1).min(16);
    FIRST_RETRY
        .saturating_mul(1 << doublings)
        .min(LONGEST_RETRY)
        .min(interval.max(FIRST_RETRY))
}

/// Whether `tries` reads in a row that found the directory changing are
/// said (once, at exactly [`REPORT_AFTER`]): the directory never held still
/// long enough, and the version saved last stands.
pub fn report_now(tries: u32) -> bool {
    tries == REPORT_AFTER
}

/// A file's times as the marker rule compares them: its last change
/// (`ctime`: a write, or a rename over its path) in nanoseconds since the
/// epoch, and what tells one version of the marker from the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkerStamp {
    /// Device, inode, size, and the modification and change times (ns).
    pub version: (u64, u64, u64, i128, i128),
}

impl MarkerStamp {
    /// The stamp of `meta`.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        MarkerStamp {
            version: (
                meta.dev(),
                meta.ino(),
                meta.len(),
                nanos(meta.mtime(), meta.mtime_nsec()),
                changed(meta),
            ),
        }
    }

    /// When the marker was last written or renamed into place (ns).
    pub fn changed(&self) -> i128 {
        self.version.4
    }
}

/// A file's change time (ns since the epoch): later of its modification
/// and its inode change (a rename sets the latter).
pub fn changed(meta: &std::fs::Metadata) -> i128 {
    use std::os::unix::fs::MetadataExt;
    nanos(meta.mtime(), meta.mtime_nsec()).max(nanos(meta.ctime(), meta.ctime_nsec()))
}

fn nanos(seconds: i64, nanos: i64) -> i128 {
    i128::from(seconds) * 1_000_000_000 + i128::from(nanos)
}

/// What the marker rule says of a read of the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtMarker {
    /// No marker yet: the program has committed no state; nothing is saved.
    NoMarker,
    /// The marker is the one saved last: no new state to save.
    Unchanged,
    /// A file was written at or after the marker: what was read is not the
    /// state at the marker (the program is writing its next state). Read
    /// again soon.
    WrittenSince(String),
    /// The read is the state at the marker: save it.
    Take(MarkerStamp),
}

/// The marker rule for one read: `marker` the marker's stamp as read (if
/// there), `saved` the stamp of the marker last saved (or restored),
/// `others` each other file read with its change time ([`changed`]).
///
/// A file changed at or after the marker (the same clock tick counts: a
/// file system's clock ticks every few milliseconds, and a write in the
/// marker's tick may have followed it) means the read is not the state at
/// the marker. Files that held still while read and all changed before the
/// marker are exactly what the directory held when the marker was written.
pub fn at_marker<'a>(
    marker: Option<MarkerStamp>,
    saved: Option<MarkerStamp>,
    others: impl IntoIterator<Item = (&'a str, i128)>,
) -> AtMarker {
    let Some(marker) = marker else {
        return AtMarker::NoMarker;
    };
    if saved == Some(marker) {
        return AtMarker::Unchanged;
    }
    for (path, changed) in others {
        if changed >= marker.changed() {
            return AtMarker::WrittenSince(path.to_owned());
        }
    }
    AtMarker::Take(marker)
}

/// Checks a marker's path (`SPOT_WORKER_CHECKPOINT_MARKER`): relative to
/// the checkpoint directory, naming a file inside it.
pub fn check_marker_path(path: &str) -> Result<(), String> {
    let parsed = Path::new(path);
    if path.trim().is_empty() {
        return Err("empty".to_owned());
    }
    if !parsed
        .components()
        .all(|part| matches!(part, Component::Normal(_)))
    {
        return Err(format!(
            "{path:?} is not a path inside the checkpoint directory (relative, no `..` or `.`)"
        ));
    }
    if path.ends_with('/') {
        return Err(format!("{path:?} names a directory, not a file"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_start_prompt_and_double_to_a_bound() {
        let interval = Duration::from_secs(600);
        let table = [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1600),
            (6, 3200),
            (7, 5000),
            (8, 5000),
            (100, 5000),
            (u32::MAX, 5000),
        ];
        for (tries, millis) in table {
            assert_eq!(
                retry_after(tries, interval),
                Duration::from_millis(millis),
                "try {tries}"
            );
        }
    }

    #[test]
    fn a_retry_is_never_later_than_the_interval() {
        let table = [
            (7, Duration::from_secs(2), 2000),
            (1, Duration::from_secs(2), 100),
            (7, Duration::ZERO, 100),
            (3, Duration::from_millis(250), 250),
        ];
        for (tries, interval, millis) in table {
            assert_eq!(
                retry_after(tries, interval),
                Duration::from_millis(millis),
                "try {tries} at {interval:?}"
            );
        }
    }

    #[test]
    fn a_directory_that_never_holds_still_is_reported_once() {
        let reported: Vec<u32> = (0..50).filter(|&tries| report_now(tries)).collect();
        assert_eq!(reported, vec![REPORT_AFTER]);
        let waited: Duration = (1..REPORT_AFTER)
            .map(|tries| retry_after(tries, Duration::from_secs(600)))
            .sum();
        // Reported within half a minute of the first try, not an interval.
        assert!(waited < Duration::from_secs(30), "{waited:?}");
    }

    fn marker(changed: i128, ino: u64) -> MarkerStamp {
        MarkerStamp {
            version: (1, ino, 2, changed, changed),
        }
    }

    #[test]
    fn the_marker_rule() {
        let now = marker(1_000, 7);
        // (case, marker read, marker saved last, other files, rule)
        type Case<'a> = (
            &'a str,
            Option<MarkerStamp>,
            Option<MarkerStamp>,
            Vec<(&'a str, i128)>,
            AtMarker,
        );
        let table: Vec<Case> = vec![
            (
                "no marker yet",
                None,
                None,
                vec![("dir/a", 5)],
                AtMarker::NoMarker,
            ),
            (
                "no marker, one saved before",
                None,
                Some(now),
                vec![],
                AtMarker::NoMarker,
            ),
            (
                "first marker, files before it",
                Some(now),
                None,
                vec![("dir/a", 990), ("dir/b", 999)],
                AtMarker::Take(now),
            ),
            (
                "the marker saved last",
                Some(now),
                Some(now),
                vec![("dir/a", 990)],
                AtMarker::Unchanged,
            ),
            (
                "the marker saved last, files written since",
                Some(now),
                Some(now),
                vec![("dir/a", 2_000)],
                AtMarker::Unchanged,
            ),
            (
                "a new marker",
                Some(now),
                Some(marker(500, 6)),
                vec![("dir/a", 990)],
                AtMarker::Take(now),
            ),
            (
                "a file written after the marker",
                Some(now),
                Some(marker(500, 6)),
                vec![("dir/a", 1_001), ("dir/b", 990)],
                AtMarker::WrittenSince("dir/a".into()),
            ),
            (
                "a file in the marker's tick",
                Some(now),
                None,
                vec![("dir/b", 1_000)],
                AtMarker::WrittenSince("dir/b".into()),
            ),
            (
                "the same inode rewritten",
                Some(now),
                Some(marker(500, 7)),
                vec![],
                AtMarker::Take(now),
            ),
            (
                "only the marker",
                Some(now),
                None,
                vec![],
                AtMarker::Take(now),
            ),
        ];
        for (case, read, saved, others, want) in table {
            assert_eq!(at_marker(read, saved, others), want, "{case}");
        }
    }

    #[test]
    fn marker_paths() {
        for ok in ["COMMIT", "state/COMMIT", ".commit", "a..b"] {
            assert_eq!(check_marker_path(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            " ",
            "/abs/COMMIT",
            "../COMMIT",
            "a/../b",
            "./COMMIT",
            "dir/",
        ] {
            assert!(check_marker_path(bad).is_err(), "{bad:?}");
        }
    }
}
