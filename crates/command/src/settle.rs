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

/// How far a file system's time stamps may lag the system's clock (they
/// are taken from a clock updated once a tick: 10 ms at the slowest, a
/// kernel at 100 Hz).
pub const FILE_CLOCK_TICK: Duration = Duration::from_millis(10);

/// When a live SQLite database's consistent copy (made by the save's read,
/// `crate::sqlite_version`) counts as changed, as the marker rule weighs
/// it against the marker's change `marker`: `as_of`, a moment at which the
/// database was as the copy holds it (`Copies::as_of`), and `committed`,
/// the last commit it holds (the copy's modification time, which the
/// backup sets), all in ns.
///
/// The copy is the database as it was at the marker only if the database
/// was still as the copy holds it after the marker was written, and the
/// copy holds no commit from the marker on: then it counts as changed at
/// its last commit. A copy of the database as it was at or before the
/// marker (the program wrote a new marker while the save read) may lack
/// commits the program made before that marker: it counts as changed at
/// the marker, so the read is tried again.
pub fn database_copy_change(as_of: i128, committed: i128, marker: i128) -> i128 {
    // `as_of` is read from the system's clock, the marker's time from the
    // file system's, which may lag it by a tick: within a tick of the
    // marker is not after it.
    if as_of <= marker.saturating_add(FILE_CLOCK_TICK.as_nanos() as i128) {
        marker
    } else {
        committed
    }
}

/// [`database_copy_change`] of a copy's metadata and the moment it was
/// the database (`None`: not known, so not taken as after the marker).
pub fn database_copy_changed(
    meta: &std::fs::Metadata,
    as_of: Option<std::time::SystemTime>,
    marker: i128,
) -> i128 {
    use std::os::unix::fs::MetadataExt;
    let as_of = as_of
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(i128::MIN, |since| since.as_nanos() as i128);
    database_copy_change(as_of, nanos(meta.mtime(), meta.mtime_nsec()), marker)
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
    fn a_database_copy_is_the_state_at_the_marker_only_if_read_after_it_with_no_commit_since() {
        // Milliseconds, in ns.
        let ms = |ms: i128| ms * 1_000_000;
        let marker = ms(1_000);
        // (case, the database as the copy holds it at, its last commit) →
        // its change as weighed
        let table = [
            ("read after, committed before", 1_050, 990, 990),
            (
                "read after, committed in the marker's tick",
                1_050,
                1_000,
                1_000,
            ),
            ("read after, committed after", 1_050, 1_020, 1_020),
            ("read before the marker", 980, 970, 1_000),
            ("read at the marker", 1_000, 970, 1_000),
            (
                "read within a file clock's tick after it",
                1_009,
                970,
                1_000,
            ),
            ("read just over a tick after it", 1_011, 970, 970),
        ]
        .map(|(case, as_of, committed, want)| (case, ms(as_of), ms(committed), ms(want)));
        for (case, as_of, committed, want) in table {
            assert_eq!(
                database_copy_change(as_of, committed, marker),
                want,
                "{case}"
            );
            // What the marker rule then says of it.
            let stamp = marker_at(marker);
            let rule = at_marker(Some(stamp), None, [("dir/db", want)]);
            let taken = matches!(rule, AtMarker::Take(_));
            assert_eq!(
                taken,
                as_of > marker + ms(10) && committed < marker,
                "{case}: {rule:?}"
            );
        }
    }

    fn marker_at(changed: i128) -> MarkerStamp {
        MarkerStamp {
            version: (1, 7, 2, changed, changed),
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
