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
