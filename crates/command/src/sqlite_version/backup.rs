//! One database's online backup into the runner's copy: in one step (WAL
//! mode) or [`STEP_PAGES`] pages at a time (a rollback journal), a locked
//! database tried again after each of [`BUSY_WAITS`], and the copy dated
//! by the last commit it holds.

use std::path::Path;
use std::time::SystemTime;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use super::find::Found;
use super::{BUSY_WAITS, BackupError};

/// Backs `database` up into `copy` in one step: one consistent version,
/// read under SQLite's own locks. Read-only first; a database that needs
/// its hot journal rolled back first (its program died mid-commit), or a
/// WAL-mode one whose shared-memory file is gone (its program closed it),
/// is opened for writing, as the program itself would open it next.
/// Returns a moment at which the database was as the copy holds it.
pub(super) fn backup(database: &Found, copy: &Path) -> Result<SystemTime, BackupError> {
    if !database.still_there() {
        return Err(BackupError::Replaced {
            path: database.path.clone(),
        });
    }
    let source = database.on_disk();
    // Before a connection of the runner's may roll a hot journal back
    // (which writes the file): the time of the program's last write.
    let before = last_commit(&source);
    let read_only = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let done = match backup_from(&source, read_only, copy, &database.path) {
        Err(BackupError::Sqlite { .. }) => {
            let read_write = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NOFOLLOW
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            // A copy a failed try left is written over.
            let _ = std::fs::remove_file(copy);
            // Opened for writing, the runner's connection may have
            // written the file itself: the time before it stands.
            backup_from(&source, read_write, copy, &database.path)
                .map(|(under_lock, as_of)| (earliest(before, under_lock), as_of))
        }
        done => done,
    };
    let (committed, as_of) = done?;
    // The copy is dated by the last commit it holds, not by the backup:
    // what saving it keeps of the program's work is its work up to that
    // commit (`write_time.rs`), and the work since is lost if the program
    // dies now.
    if let Some(committed) = committed {
        std::fs::File::options()
            .write(true)
            .open(copy)?
            .set_modified(committed)?;
    }
    // The file read must be the one found: a link swapped in meanwhile
    // would have had the runner read what is not the program's.
    if !database.still_there() {
        return Err(BackupError::Replaced {
            path: database.path.clone(),
        });
    }
    Ok(as_of)
}

/// The time of the last commit to the database at `source`: the latest
/// modification of the file and of its write-ahead log (a commit in WAL
/// mode writes only the log). `None` if neither can be read.
fn last_commit(source: &Path) -> Option<SystemTime> {
    let mut wal = source.as_os_str().to_owned();
    wal.push("-wal");
    [source, Path::new(&wal)]
        .into_iter()
        .filter_map(|path| std::fs::symlink_metadata(path).ok()?.modified().ok())
        .max()
}

/// The earlier of two times, either of which may be unknown.
fn earliest(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether SQLite said the database is locked by another connection.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Backs the database at `source` up into `copy` under one read
/// transaction of the runner's, and returns the time of the last commit
/// that version holds, read under that transaction ([`last_commit`]): in
/// rollback-journal mode no commit can land while it is held, in WAL mode
/// one landing meanwhile dates the version at most that late. With it, a
/// moment inside that read transaction: the database was as the copy
/// holds it then.
fn backup_from(
    source: &Path,
    flags: OpenFlags,
    copy: &Path,
    path: &str,
) -> Result<(Option<SystemTime>, SystemTime), BackupError> {
    let sqlite = |source| BackupError::Sqlite {
        path: path.to_owned(),
        source,
    };
    let from = Connection::open_with_flags(source, flags).map_err(sqlite)?;
    // In WAL mode a reader holds no writer: one step, one version, at no
    // cost to the program. In rollback-journal mode a step holds the
    // program's commits while it reads, so the copy is made in steps.
    // A database locked by a commit cannot say (only rollback-journal mode
    // locks out readers): it is stepped through, locks waited for there.
    let wal = from
        .pragma_query_value(None, "journal_mode", |row| row.get::<_, String>(0))
        .is_ok_and(|mode| mode.eq_ignore_ascii_case("wal"));
    if !wal {
        let mut to = scratch_copy(copy).map_err(sqlite)?;
        if let Stepwise::Copied { committed, as_of } = stepwise(&from, &mut to, source, path)? {
            return Ok((committed, as_of));
        }
        // Unjournaled, a copy given up halfway is no database: begun anew.
        drop(to);
        std::fs::remove_file(copy)?;
    }
    let mut waits = BUSY_WAITS.iter();
    let busy = || BackupError::Busy {
        path: path.to_owned(),
        tries: BUSY_WAITS.len() + 1,
    };
    // The read transaction the backup then copies in (it uses one that
    // its source connection holds), taken by a first read.
    from.execute_batch("BEGIN").map_err(sqlite)?;
    loop {
        match from.query_row("SELECT count(*) FROM sqlite_master", [], |row| {
            row.get::<_, i64>(0)
        }) {
            Ok(_) => break,
            Err(error) if is_busy(&error) => match waits.next() {
                Some(wait) => std::thread::sleep(*wait),
                None => return Err(busy()),
            },
            Err(error) => return Err(sqlite(error)),
        }
    }
    let committed = last_commit(source);
    let as_of = SystemTime::now();
    let mut to = scratch_copy(copy).map_err(sqlite)?;
    let backup = Backup::new(&from, &mut to).map_err(sqlite)?;
    loop {
        // All pages in one step: one read transaction, one version.
        match backup.step(-1).map_err(sqlite)? {
            StepResult::Done => return Ok((committed, as_of)),
            StepResult::More => {}
            _busy_or_locked => match waits.next() {
                Some(wait) => std::thread::sleep(*wait),
                None => return Err(busy()),
            },
        }
    }
}

/// Opens the copy, made anew at `copy`. It is the runner's scratch, read
/// once and deleted: neither synced nor journaled, since the last step of a
/// backup (which commits the copy) holds the program's commits for as long
/// as that takes.
fn scratch_copy(copy: &Path) -> rusqlite::Result<Connection> {
    let to = Connection::open(copy)?;
    to.execute_batch("PRAGMA synchronous = off; PRAGMA journal_mode = off;")?;
    Ok(to)
}

/// How many pages a step of a stepwise copy reads (256 KiB of 4 KiB
/// pages): the longest a commit of the program's waits for it.
pub const STEP_PAGES: i32 = 64;

/// How many times a stepwise copy is begun, each begun again by SQLite
/// when the program commits meanwhile, before the copy is made in one
/// step instead (a database committed to faster than it can be stepped
/// through).
pub const STEPWISE_TRIES: usize = 4;

/// How a stepwise copy ended.
#[derive(Debug, PartialEq, Eq)]
enum Stepwise {
    /// Every page copied, with no commit between the first step and the
    /// last: one version, whose last commit was at `committed`, and which
    /// the database still was at `as_of` (as the last step began).
    Copied {
        committed: Option<SystemTime>,
        as_of: SystemTime,
    },
    /// Begun again [`STEPWISE_TRIES`] times, or locked at every wait: to
    /// be made in one step.
    GaveUp,
}

/// Copies `from` into `to` [`STEP_PAGES`] pages at a time, the read lock
/// let go between steps so that the program's commits wait for one step
/// at most. A commit by the program between two steps makes SQLite begin
/// the copy again from its first page (so what is copied is still one
/// version); that happens at most [`STEPWISE_TRIES`] times.
fn stepwise(
    from: &Connection,
    to: &mut Connection,
    source: &Path,
    path: &str,
) -> Result<Stepwise, BackupError> {
    let sqlite = |source| BackupError::Sqlite {
        path: path.to_owned(),
        source,
    };
    let backup = Backup::new(from, to).map_err(sqlite)?;
    let mut begun = 1;
    let mut copied_before = 0;
    let mut busy = 0;
    loop {
        // Read before each step: a commit landing after this read begins
        // the copy again at the step, so the step that finishes it holds
        // no commit later than this (one landing just before dates the
        // version early, which counts more as redone, never less).
        let committed = last_commit(source);
        let as_of = SystemTime::now();
        match backup.step(STEP_PAGES).map_err(sqlite)? {
            StepResult::Done => return Ok(Stepwise::Copied { committed, as_of }),
            StepResult::More => {
                busy = 0;
                let progress = backup.progress();
                let copied = progress.pagecount - progress.remaining;
                // Fewer pages copied than before: begun again.
                if copied <= copied_before {
                    begun += 1;
                    if begun > STEPWISE_TRIES {
                        return Ok(Stepwise::GaveUp);
                    }
                }
                copied_before = copied;
            }
            // The program is committing: it takes a few milliseconds.
            _busy_or_locked => match BUSY_WAITS.get(busy) {
                Some(wait) => {
                    busy += 1;
                    std::thread::sleep(*wait);
                }
                None => return Ok(Stepwise::GaveUp),
            },
        }
    }
}
