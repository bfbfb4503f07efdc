//! How long a program was blocked writing its checkpoint file, read from
//! the file itself: the contract has it write a temporary file and rename
//! it over `SPOT_WORKER_CHECKPOINT`, so each version the runner finds is a
//! file of its own, born when the program created it (its birth time,
//! `statx`'s `btime`, which [`std::fs::Metadata::created`] reads on Linux)
//! and last modified by the program's last write to it. The difference is
//! the write's duration: the checkpoint's cost in job time, which the
//! runner's upload (beside the program) is not. [`write_duration`] is the
//! decision, pure; what the runner does when it says
//! [`Unmeasured`] is in `saving.rs`.
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
    /// The file is the one saved last, written again in place (not a
    /// temporary file renamed over it): its birth is an older version's.
    #[error(
        "the program rewrote its checkpoint file in place instead of renaming a new file over it"
    )]
    RewrittenInPlace,
    /// Modified before it was born (its times were set by hand, or the
    /// wall clock stepped back).
    #[error("the checkpoint file's modification time is before its birth time")]
    TimesOutOfOrder,
    /// Written over longer than the program has run: not one write of
    /// this program's.
    #[error("the checkpoint file's birth is older than the program")]
    LongerThanTheRun,
}

/// How long writing one version of the checkpoint file took: from its
/// birth (`born`, `None` where the file system records none) to its
/// modification (`modified`). `same_file` says whether it is the very file
/// (device, inode and birth) saved last, and `ran_for` how long the
/// program has run. First match wins:
///
/// | the version | result |
/// |---|---|
/// | no birth time | [`Unmeasured::NoBirthTime`] |
/// | the file saved last, rewritten | [`Unmeasured::RewrittenInPlace`] |
/// | modified before born | [`Unmeasured::TimesOutOfOrder`] |
/// | born longer ago than the program ran | [`Unmeasured::LongerThanTheRun`] |
/// | otherwise | `modified − born` |
pub fn write_duration(
    born: Option<SystemTime>,
    modified: SystemTime,
    same_file: bool,
    ran_for: Duration,
) -> Result<Duration, Unmeasured> {
    let born = born.ok_or(Unmeasured::NoBirthTime)?;
    if same_file {
        return Err(Unmeasured::RewrittenInPlace);
    }
    let took = modified
        .duration_since(born)
        .map_err(|_| Unmeasured::TimesOutOfOrder)?;
    if took > ran_for {
        return Err(Unmeasured::LongerThanTheRun);
    }
    Ok(took)
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

    #[test]
    fn the_write_is_from_birth_to_modification() {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms);
        let ms = Duration::from_millis;
        // (born, modified, same file, program ran for, result)
        let rows = [
            (Some(at(100)), at(600), false, ms(5000), Ok(ms(500))),
            // Written in one go: within the file system's tick.
            (Some(at(100)), at(100), false, ms(5000), Ok(ms(0))),
            // Exactly as long as the program ran.
            (Some(at(0)), at(5000), false, ms(5000), Ok(ms(5000))),
            (None, at(600), false, ms(5000), Err(Unmeasured::NoBirthTime)),
            (None, at(600), true, ms(5000), Err(Unmeasured::NoBirthTime)),
            (
                Some(at(100)),
                at(600),
                true,
                ms(5000),
                Err(Unmeasured::RewrittenInPlace),
            ),
            (
                Some(at(600)),
                at(100),
                false,
                ms(5000),
                Err(Unmeasured::TimesOutOfOrder),
            ),
            (
                Some(at(0)),
                at(5001),
                false,
                ms(5000),
                Err(Unmeasured::LongerThanTheRun),
            ),
        ];
        for (born, modified, same_file, ran_for, expected) in rows {
            assert_eq!(
                write_duration(born, modified, same_file, ran_for),
                expected,
                "born {born:?}, modified {modified:?}, same file {same_file}, ran {ran_for:?}"
            );
        }
    }
}
