//! What a saved version of the checkpoint cost the job: the time the
//! program spent writing what it writes whole, and never the age of a file
//! it writes in place.
//!
//! The runner sees only the files (their birth and modification times,
//! and whether each is the very file it saved before at that path). A file
//! written whole (a temporary file renamed over the path, the contract for
//! `SPOT_WORKER_CHECKPOINT`, or a shard renamed into
//! `SPOT_WORKER_CHECKPOINT_DIR`) is born when its write began and last
//! modified when it ended, so the span of such files is the version's
//! write. A file written in place (a live database, a log appended to, a
//! file the runner restored and the program kept writing) was born long
//! before this version: its birth-to-last-write is its age, the program's
//! whole life with it, and says nothing of what a version cost. Such a
//! write is as cheap to the job as the program's own commit, which the
//! runner does not see: it costs the job ~0, plus whatever time the runner
//! held the program's writes to read a consistent version (`held`, a
//! database's online backup). [`save_cost`] is the decision, pure; the
//! facts it is given are gathered in `delivery/saving/` (`one_save.rs`).

use std::time::{Duration, SystemTime};

use crate::write_time::Unmeasured;

/// One file of the version being saved, as the runner found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionFile {
    /// Its birth time (`statx`'s `btime`), `None` where the file system
    /// records none.
    pub born: Option<SystemTime>,
    /// Its last modification.
    pub modified: Option<SystemTime>,
    /// Whether it is the very file (device, inode, birth) the runner saved
    /// at this path before in this delivery: a file kept and written
    /// again, not a new one renamed over it.
    pub saved_before: bool,
    /// Whether it is a database (SQLite's header): always written in place.
    pub database: bool,
}

/// How one file of a version was written, which says what it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// As a new file, from its birth to its last write.
    Whole,
    /// Into a file that was there already: no write of it is seen.
    InPlace,
}

/// How `file` was written, for a program started at `program_started`
/// (the wall clock). First match wins:
///
/// | the file | written |
/// |---|---|
/// | a database | in place |
/// | the file saved before at its path | in place |
/// | born before the program started (restored, or left before) | in place |
/// | otherwise | whole |
pub fn written(file: &VersionFile, program_started: SystemTime) -> Written {
    let before_the_program = file.born.is_some_and(|born| born < program_started);
    if file.database || file.saved_before || before_the_program {
        Written::InPlace
    } else {
        Written::Whole
    }
}

/// What writing a version made of `files` cost the job, for a program
/// started at `program_started` (the wall clock), with `held` the time
/// the runner held the program's writes to read the version (zero unless
/// it did): the span of the files written whole, from the earliest birth
/// to the latest modification among them (a directory of shards: the span
/// of this version's writes, never the oldest shard's age), plus `held`.
/// Files written in place ([`written`]) add nothing. A file written whole
/// whose times cannot be read or are out of order makes the write
/// unmeasured ([`Unmeasured`]): the caller then decides what stands for it.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use spot_worker_command::{VersionFile, save_cost};
///
/// let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
/// // A database written in place for 500 s: its age is not its cost.
/// let database = VersionFile { born: Some(at(0)), modified: Some(at(500)), saved_before: true, database: true };
/// assert_eq!(save_cost(&[database], at(0), Duration::ZERO), Ok(Duration::ZERO));
/// ```
pub fn save_cost(
    files: &[VersionFile],
    program_started: SystemTime,
    held: Duration,
) -> Result<Duration, Unmeasured> {
    let mut span: Option<(SystemTime, SystemTime)> = None;
    for file in files {
        if written(file, program_started) == Written::InPlace {
            continue;
        }
        let born = file.born.ok_or(Unmeasured::NoBirthTime)?;
        let modified = file.modified.ok_or(Unmeasured::NoBirthTime)?;
        if modified < born {
            return Err(Unmeasured::TimesOutOfOrder);
        }
        span = Some(match span {
            None => (born, modified),
            Some((first, last)) => (first.min(born), last.max(modified)),
        });
    }
    let writing = span.map_or(Duration::ZERO, |(first, last)| {
        last.duration_since(first).unwrap_or_default()
    });
    Ok(writing.saturating_add(held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
    }

    fn file(born: u64, modified: u64) -> VersionFile {
        VersionFile {
            born: Some(at(born)),
            modified: Some(at(modified)),
            saved_before: false,
            database: false,
        }
    }

    fn saved(file: VersionFile) -> VersionFile {
        VersionFile {
            saved_before: true,
            ..file
        }
    }

    fn database(file: VersionFile) -> VersionFile {
        VersionFile {
            database: true,
            ..file
        }
    }

    /// A table row: what, the version's files, ms held, the cost.
    type Row = (
        &'static str,
        Vec<VersionFile>,
        u64,
        Result<Duration, Unmeasured>,
    );

    #[test]
    fn a_save_costs_the_writes_of_what_was_written_whole_and_what_the_runner_held() {
        let ms = Duration::from_millis;
        let started = at(1_000);
        // (what, the version's files, held, the cost)
        let rows: Vec<Row> = vec![
            // A file rewritten whole (temp + rename): its birth to its write.
            (
                "file rewritten whole",
                vec![file(5_000, 5_700)],
                0,
                Ok(ms(700)),
            ),
            (
                "file written whole in one tick",
                vec![file(5_000, 5_000)],
                0,
                Ok(ms(0)),
            ),
            // The same file, written again in place: not its age.
            (
                "file written in place",
                vec![saved(file(2_000, 60_000))],
                0,
                Ok(ms(0)),
            ),
            // Restored by the runner (born before the program), then
            // appended to by the program.
            (
                "file restored, then written in place",
                vec![file(900, 60_000)],
                0,
                Ok(ms(0)),
            ),
            // A directory of shards renamed in one by one: the span of
            // this version's writes, not the oldest shard's age.
            (
                "directory of new shards",
                vec![
                    file(50_000, 50_300),
                    file(50_300, 50_900),
                    file(50_900, 51_200),
                ],
                0,
                Ok(ms(1_200)),
            ),
            (
                "directory: old shards kept, one rewritten whole",
                vec![
                    saved(file(2_000, 2_400)),
                    saved(file(2_400, 2_800)),
                    file(50_000, 50_250),
                ],
                0,
                Ok(ms(250)),
            ),
            (
                "directory of shards written before the program",
                vec![file(100, 400), file(400, 800)],
                0,
                Ok(ms(0)),
            ),
            // A live database (first seen, or saved before), with or
            // without the runner holding its writes for a backup.
            (
                "database first seen",
                vec![database(file(1_200, 30_000))],
                0,
                Ok(ms(0)),
            ),
            (
                "database saved before",
                vec![database(saved(file(1_200, 30_000)))],
                0,
                Ok(ms(0)),
            ),
            (
                "database held for its backup",
                vec![database(file(1_200, 30_000))],
                40,
                Ok(ms(40)),
            ),
            // A database beside a checkpoint file written whole.
            (
                "database and a file written whole",
                vec![database(file(1_200, 30_000)), file(29_000, 29_100)],
                0,
                Ok(ms(100)),
            ),
            ("nothing", vec![], 0, Ok(ms(0))),
            ("nothing, held", vec![], 15, Ok(ms(15))),
            // What cannot be measured, for a file written whole.
            (
                "no birth time",
                vec![VersionFile {
                    born: None,
                    ..file(5_000, 5_700)
                }],
                0,
                Err(Unmeasured::NoBirthTime),
            ),
            (
                "modified before born",
                vec![file(5_700, 5_000)],
                0,
                Err(Unmeasured::TimesOutOfOrder),
            ),
            // ... but a file written in place needs no birth time.
            (
                "in place without a birth time",
                vec![saved(VersionFile {
                    born: None,
                    ..file(5_000, 5_700)
                })],
                0,
                Ok(ms(0)),
            ),
        ];
        for (what, files, held, expected) in rows {
            assert_eq!(save_cost(&files, started, ms(held)), expected, "{what}");
        }
    }

    #[test]
    fn a_file_is_written_in_place_if_it_is_a_database_was_saved_or_predates_the_program() {
        let started = at(1_000);
        // (the file, how it was written)
        let rows = [
            (file(5_000, 5_700), Written::Whole),
            (file(1_000, 5_700), Written::Whole),
            (file(999, 5_700), Written::InPlace),
            (saved(file(5_000, 5_700)), Written::InPlace),
            (database(file(5_000, 5_700)), Written::InPlace),
            (
                VersionFile {
                    born: None,
                    ..file(5_000, 5_700)
                },
                Written::Whole,
            ),
        ];
        for (file, expected) in rows {
            assert_eq!(written(&file, started), expected, "{file:?}");
        }
    }
}
