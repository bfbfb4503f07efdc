//! When a version of the checkpoint was written, read from its files'
//! times, and why a write cannot be measured from them ([`Unmeasured`]:
//! what a version's write cost is decided in `save_cost.rs`).
//!
//! The modification time is also when the version's data was written, so
//! what saving it keeps: the program's work up to then. [`written_at`]
//! puts it on the monotonic clock the job's goodput is measured on (the
//! file and the runner are on the same machine).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// When a version of the checkpoint file modified at `modified` (the wall
/// clock, as the file says) was written, on the monotonic clock, with
/// `wall_now` and `now` the two clocks read together: `now` less the
/// version's age. A modification time ahead of `wall_now` (the wall clock
/// stepped back since) is `now`; `None` if it is older than the monotonic
/// clock can tell (before the machine started).
pub fn written_at(modified: SystemTime, wall_now: SystemTime, now: Instant) -> Option<Instant> {
    let age = wall_now.duration_since(modified).unwrap_or(Duration::ZERO);
    now.checked_sub(age)
}

/// The modification time that dates a version of the checkpoint, from
/// the files read (`(manifest path, modification time)`): the checkpoint
/// file's (`file`) if it is among them, the contract's mark of a complete
/// version; else, for a checkpoint directory alone, the newest among its
/// files, since nothing marks when a directory's version was complete and
/// none of its data is younger. `None` if the time that counts is unknown.
pub fn version_modified<'a>(
    versions: impl IntoIterator<Item = (&'a str, Option<SystemTime>)>,
) -> Option<SystemTime> {
    let mut newest = None;
    for (path, modified) in versions {
        if path == "file" {
            return modified;
        }
        newest = newest.max(modified);
    }
    newest
}

/// Why a version's write could not be measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unmeasured {
    /// The file system records no birth times.
    #[error("the file system of the delivery directory records no birth time (statx btime)")]
    NoBirthTime,
    /// Modified before it was born (its times were set by hand, or the
    /// wall clock stepped back).
    #[error("the checkpoint file's modification time is before its birth time")]
    TimesOutOfOrder,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_versions_modification_is_put_on_the_monotonic_clock() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = Instant::now();
        let s = Duration::from_millis;
        // (modified, relative to the wall clock now, in ms; expected ms before now)
        let rows = [
            (-2500_i64, Some(s(2500))),
            (0, Some(s(0))),
            // Modified "in the future": the wall clock stepped back.
            (700, Some(s(0))),
        ];
        for (modified, before) in rows {
            let modified = if modified < 0 {
                wall - s(modified.unsigned_abs())
            } else {
                wall + s(modified as u64)
            };
            assert_eq!(
                written_at(modified, wall, now),
                before.map(|before| now - before),
                "{modified:?}"
            );
        }
        // Older than the machine: long before now, or not on the clock.
        assert!(written_at(SystemTime::UNIX_EPOCH, wall, now).is_none_or(|at| at < now));
    }

    #[test]
    fn a_version_is_dated_by_its_file_else_by_its_newest_file() {
        type Read<'a> = &'a [(&'a str, Option<SystemTime>)];
        let at = |s: u64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s));
        // (the files read, the time that dates the version)
        let rows: [(Read, Option<SystemTime>); 6] = [
            // The file's, even when a directory's file is newer.
            (
                &[("dir/a", at(9)), ("file", at(3)), ("dir/b", at(1))],
                at(3),
            ),
            (&[("file", at(3))], at(3)),
            // A directory alone: its newest file.
            (
                &[("dir/a", at(2)), ("dir/b/c", at(7)), ("dir/d", at(5))],
                at(7),
            ),
            // The newest known, when a file's time is not.
            (&[("dir/a", None), ("dir/b", at(4))], at(4)),
            // The file's time unknown: the version's is.
            (&[("file", None), ("dir/a", at(4))], None),
            (&[], None),
        ];
        for (versions, expected) in rows {
            assert_eq!(
                version_modified(versions.iter().copied()),
                expected,
                "{versions:?}"
            );
        }
    }
}
