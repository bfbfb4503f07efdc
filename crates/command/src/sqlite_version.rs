//! A live SQLite database in the checkpoint directory, saved as one
//! consistent version while the program writes it: SQLite's own online
//! backup (what `sqlite3 .backup` and Litestream use) copies it into a
//! file of the runner's, and the save reads that copy for the database
//! ([`CheckpointFiles::with_stand_in`]) instead of the file that changes
//! under the reader. Its companions (`-journal`, `-wal`, `-shm`) are not
//! saved: what they hold that counts is in the copy, so a restore opens
//! with no journal to roll back.
//!
//! A database is told by its first 16 bytes ("SQLite format 3\0"), not its
//! name. The backup reads through a connection of the runner's, opened
//! read-only: in WAL mode the program's writes go on meanwhile, and the
//! copy is made in one step; in rollback-journal mode a commit waits while
//! a step reads, so the copy is made [`STEP_PAGES`] pages at a time, begun
//! again by SQLite when the program commits between two steps, and made in
//! one step only after [`STEPWISE_TRIES`] such beginnings (docs/command.md,
//! "A SQLite database"). A database locked by a commit
//! is tried again a few times, a little later each time
//! ([`BUSY_WAITS`]); one that cannot be backed up is an error the save
//! reports, never passed over.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::Metadata;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};
use spot_worker_storage::files::{CheckpointFiles, MAX_ENTRIES};
use spot_worker_untrusted::{Dir, Owners, UntrustedError};

/// The first bytes of every SQLite database file.
pub const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The files beside a database that hold its uncommitted or not yet
/// checkpointed pages, by suffix.
pub const COMPANIONS: [&str; 3] = ["-journal", "-wal", "-shm"];

/// How long a backup waits, after each time it finds the database locked
/// by a commit, before trying again: a commit takes milliseconds, so a
/// few short waits, then an error.
pub const BUSY_WAITS: [Duration; 6] = [
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
];

/// How deep the search for databases goes (as the save's walk).
const MAX_DEPTH: usize = 64;

/// Why a database in the checkpoint directory could not be backed up.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Looking at the directory, or making the copy's file, failed.
    #[error("looking for SQLite databases in the checkpoint directory: {0}")]
    Io(#[from] std::io::Error),
    /// SQLite refused (a damaged file, a hot journal it cannot roll back).
    #[error("backing up the SQLite database {path}: {source}")]
    Sqlite {
        /// The database's manifest path.
        path: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// Locked by the program's commits at every try.
    #[error(
        "backing up the SQLite database {path}: locked by the program's commits at each of {tries} tries"
    )]
    Busy {
        /// The database's manifest path.
        path: String,
        /// How many times it was tried.
        tries: usize,
    },
    /// Replaced by another file while it was backed up.
    #[error("the SQLite database {path} was replaced while it was backed up")]
    Replaced {
        /// The database's manifest path.
        path: String,
    },
}

/// The copies a save reads for the databases it found, deleted when
/// dropped (after the save).
#[derive(Debug)]
pub struct Copies {
    _scratch: Option<tempfile::TempDir>,
    /// The databases backed up: manifest path, and the copy read for it.
    pub databases: Vec<(String, PathBuf)>,
    /// By manifest path: a moment at which the database was exactly as its
    /// copy holds it (inside the copy's read, after its last commit), for
    /// the commit marker's rule (`crate::settle::database_copy_change`).
    pub as_of: BTreeMap<String, SystemTime>,
}

/// `roots`, with every SQLite database under its directory roots standing
/// in as a consistent copy made now (in a directory of its own under
/// `scratch`, the runner's), its companions left out; and the copies, to
/// keep until the save has read them. Blocking: call it off the runtime
/// thread.
pub fn with_consistent_databases(
    roots: &CheckpointFiles,
    scratch: &Path,
) -> Result<(CheckpointFiles, Copies), BackupError> {
    let mut found = Vec::new();
    let mut nascent = Vec::new();
    for (name, path, is_dir) in roots.roots() {
        if is_dir {
            find_databases(path, name, &mut found, &mut nascent)?;
        }
    }
    let mut copies = Copies {
        _scratch: None,
        databases: Vec::new(),
        as_of: BTreeMap::new(),
    };
    // A database being created (its file still shorter than a header) has
    // committed nothing yet: its journal is left out, so the version holds
    // it as it was before its first commit, with nothing to roll back.
    let mut roots = nascent.iter().fold(roots.clone(), |roots, companion| {
        roots.leaving_out(companion)
    });
    if found.is_empty() {
        return Ok((roots, copies));
    }
    let dir = tempfile::Builder::new()
        .prefix("sqlite-copies-")
        .tempdir_in(scratch)?;
    for (number, database) in found.iter().enumerate() {
        let copy = dir.path().join(format!("{number}.db"));
        let as_of = backup(database, &copy)?;
        copies.as_of.insert(database.path.clone(), as_of);
        roots = roots.with_stand_in(&database.path, &copy);
        for suffix in COMPANIONS {
            roots = roots.leaving_out(&format!("{}{suffix}", database.path));
        }
        copies.databases.push((database.path.clone(), copy));
    }
    copies._scratch = Some(dir);
    Ok((roots, copies))
}

/// A database found: its manifest path, where it is, and which file it is.
#[derive(Debug)]
struct Found {
    path: String,
    root: PathBuf,
    names: Vec<OsString>,
    dev: u64,
    ino: u64,
}

impl Found {
    fn on_disk(&self) -> PathBuf {
        self.names
            .iter()
            .fold(self.root.clone(), |path, name| path.join(name))
    }

    /// Whether the very file found is at its place now, reached without
    /// following a link.
    fn still_there(&self) -> bool {
        at(&self.root, &self.names)
            .is_some_and(|meta| (meta.dev(), meta.ino()) == (self.dev, self.ino))
    }
}

/// The metadata of what is at `names` below `root`, reached through
/// directories opened without following links.
fn at(root: &Path, names: &[OsString]) -> Option<Metadata> {
    let (last, dirs) = names.split_last()?;
    let mut dir = Dir::open(root).ok()?;
    for name in dirs {
        dir = dir.dir(name).ok()?;
    }
    dir.file(last, &Owners::Any).ok()?.metadata().ok()
}

/// The SQLite databases under the directory root `name` at `root`,
/// walked as the save walks it (no link followed, bounded).
fn find_databases(
    root: &Path,
    name: &str,
    found: &mut Vec<Found>,
    nascent: &mut Vec<String>,
) -> Result<(), BackupError> {
    let dir = match Dir::open(root) {
        Ok(dir) => dir,
        Err(error) if error.is_not_found() => return Ok(()),
        Err(error) => return Err(untrusted(error)),
    };
    let mut walk = Walk {
        root,
        found,
        nascent,
        entries: 0,
    };
    walk.dir(&dir, &mut Vec::new(), name)
}

struct Walk<'a> {
    root: &'a Path,
    found: &'a mut Vec<Found>,
    /// The companions (`-journal`, `-wal`, `-shm`) of files still shorter
    /// than a SQLite header: databases being created.
    nascent: &'a mut Vec<String>,
    entries: usize,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Dir, names: &mut Vec<OsString>, path: &str) -> Result<(), BackupError> {
        // More than the save takes is its error to say, not this one's.
        let room = MAX_ENTRIES.saturating_sub(self.entries);
        let Some(entries) = dir.entries_at_most(room).map_err(untrusted)? else {
            return Ok(());
        };
        self.entries += entries.len();
        let short: Vec<&str> = entries
            .iter()
            .filter(|(_, meta)| {
                meta.file_type().is_file() && meta.len() < SQLITE_HEADER.len() as u64
            })
            .filter_map(|(entry, _)| entry.to_str())
            .collect();
        for (entry, _) in &entries {
            let Some(text) = entry.to_str() else {
                continue;
            };
            let of_nascent = COMPANIONS.iter().any(|suffix| {
                text.strip_suffix(suffix)
                    .is_some_and(|base| short.contains(&base))
            });
            if of_nascent {
                self.nascent.push(format!("{path}/{text}"));
            }
        }
        for (entry, meta) in entries {
            // A name the save refuses is its error to say.
            let Some(text) = entry.to_str() else {
                continue;
            };
            let child = format!("{path}/{text}");
            names.push(entry.clone());
            if meta.is_dir() && names.len() <= MAX_DEPTH {
                if let Ok(sub) = dir.dir(&entry) {
                    self.dir(&sub, names, &child)?;
                }
            } else if meta.file_type().is_file()
                && meta.len() >= SQLITE_HEADER.len() as u64
                && is_database(dir, &entry)
            {
                self.found.push(Found {
                    path: child,
                    root: self.root.to_owned(),
                    names: names.clone(),
                    dev: meta.dev(),
                    ino: meta.ino(),
                });
            }
            names.pop();
        }
        Ok(())
    }
}

/// Whether the file `name` in `dir` starts as a SQLite database does.
fn is_database(dir: &Dir, name: &OsString) -> bool {
    let Ok(file) = dir.file(name, &Owners::Any) else {
        return false;
    };
    let mut header = [0u8; 16];
    (&file).read_exact(&mut header).is_ok() && &header == SQLITE_HEADER
}

fn untrusted(error: UntrustedError) -> BackupError {
    match error {
        UntrustedError::Io { source, .. } => BackupError::Io(source),
        other => BackupError::Io(std::io::Error::other(other.to_string())),
    }
}

/// Backs `database` up into `copy` in one step: one consistent version,
/// read under SQLite's own locks. Read-only first; a database that needs
/// its hot journal rolled back first (its program died mid-commit), or a
/// WAL-mode one whose shared-memory file is gone (its program closed it),
/// is opened for writing, as the program itself would open it next.
/// Returns a moment at which the database was as the copy holds it.
fn backup(database: &Found, copy: &Path) -> Result<SystemTime, BackupError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn database(path: &Path, wal: bool) -> Connection {
        let connection = Connection::open(path).unwrap();
        if wal {
            connection
                .pragma_update(None, "journal_mode", "wal")
                .unwrap();
        }
        connection
            .execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2);")
            .unwrap();
        connection
    }

    fn rows(path: &Path) -> Vec<i64> {
        let connection = Connection::open(path).unwrap();
        let mut statement = connection.prepare("SELECT n FROM t ORDER BY n").unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Told by its header, not its name; its companions left out; a file
    /// named like a database but not one is saved as it is.
    #[test]
    fn databases_are_found_by_their_header_and_copied_with_what_is_committed() {
        for wal in [false, true] {
            let checkpoint = tempfile::tempdir().unwrap();
            let scratch = tempfile::tempdir().unwrap();
            std::fs::create_dir(checkpoint.path().join("sub")).unwrap();
            let live = database(&checkpoint.path().join("sub/state"), wal);
            // An open transaction: not in the copy.
            live.execute_batch("BEGIN; INSERT INTO t VALUES (3);")
                .unwrap();
            std::fs::write(checkpoint.path().join("fake.db"), b"not a database at all").unwrap();
            let roots = CheckpointFiles::dir(checkpoint.path());
            let (with, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
            let [(path, copy)] = copies.databases.as_slice() else {
                panic!("wal {wal}: {:?}", copies.databases);
            };
            assert_eq!(path, "dir/sub/state");
            let expected = roots
                .clone()
                .with_stand_in("dir/sub/state", copy)
                .leaving_out("dir/sub/state-journal")
                .leaving_out("dir/sub/state-wal")
                .leaving_out("dir/sub/state-shm");
            assert_eq!(with, expected, "wal {wal}");
            // The copy alone: no journal or log of its own beside it.
            let names: Vec<_> = std::fs::read_dir(copy.parent().unwrap())
                .unwrap()
                .map(|entry| entry.unwrap().file_name())
                .collect();
            assert_eq!(names, [copy.file_name().unwrap()], "wal {wal}");
            assert_eq!(rows(copy), [1, 2], "wal {wal}");
            let copy = copy.clone();
            drop(copies);
            assert!(!copy.exists());
            drop(live);
        }
    }

    /// The copy is dated by the last commit it holds (the database's, or
    /// in WAL mode its log's, last write), not by the backup: saving it
    /// keeps the program's work up to that commit, no later.
    #[test]
    fn a_copy_is_dated_by_the_last_commit_it_holds() {
        let old = std::time::SystemTime::now() - Duration::from_secs(100);
        for wal in [false, true] {
            let checkpoint = tempfile::tempdir().unwrap();
            let scratch = tempfile::tempdir().unwrap();
            let path = checkpoint.path().join("db");
            let live = database(&path, wal);
            let mut last = old;
            for file in ["db", "db-wal"] {
                let Ok(file) = std::fs::File::options()
                    .write(true)
                    .open(checkpoint.path().join(file))
                else {
                    continue;
                };
                file.set_modified(last).unwrap();
                last += Duration::from_secs(10);
            }
            let committed = last - Duration::from_secs(10);
            let roots = CheckpointFiles::dir(checkpoint.path());
            let (_, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
            let copy = &copies.databases[0].1;
            let modified = std::fs::metadata(copy).unwrap().modified().unwrap();
            assert_eq!(modified, committed, "wal {wal}");
            assert_eq!(rows(copy), [1, 2], "wal {wal}");
            drop(live);
        }
    }

    #[test]
    fn the_journal_of_a_database_being_created_is_left_out() {
        // What the first look after a program's `sqlite3.connect` may
        // see: the file created empty, its first transaction's journal
        // beside it, nothing committed.
        let checkpoint = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::write(checkpoint.path().join("rows.db"), b"").unwrap();
        std::fs::write(checkpoint.path().join("rows.db-journal"), b"pages").unwrap();
        std::fs::write(checkpoint.path().join("notes-journal"), b"kept").unwrap();
        let roots = CheckpointFiles::dir(checkpoint.path());
        let (with, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
        assert_eq!(with, roots.clone().leaving_out("dir/rows.db-journal"));
        assert!(copies.databases.is_empty());
    }

    #[test]
    fn a_directory_without_databases_is_left_as_it_is() {
        let checkpoint = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::write(checkpoint.path().join("a"), &SQLITE_HEADER.as_slice()[..8]).unwrap();
        let roots = CheckpointFiles::dir(checkpoint.path());
        let (with, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
        assert_eq!(with, roots);
        assert!(copies.databases.is_empty());
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }

    /// A database whose header is right but whose pages are not is an
    /// error that names it, never passed over.
    #[test]
    fn a_damaged_database_is_an_error_that_names_it() {
        let checkpoint = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let mut bytes = SQLITE_HEADER.to_vec();
        bytes.resize(4096, 0xff);
        std::fs::write(checkpoint.path().join("broken"), bytes).unwrap();
        let roots = CheckpointFiles::dir(checkpoint.path());
        let error = with_consistent_databases(&roots, scratch.path()).unwrap_err();
        assert!(error.to_string().contains("dir/broken"), "{error}");
    }

    /// A commit holding the lock past every wait: an error, not a hang.
    #[test]
    fn a_database_locked_at_every_try_is_an_error() {
        let checkpoint = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let live = database(&checkpoint.path().join("db"), false);
        live.execute_batch("BEGIN EXCLUSIVE; INSERT INTO t VALUES (3);")
            .unwrap();
        let roots = CheckpointFiles::dir(checkpoint.path());
        let error = with_consistent_databases(&roots, scratch.path()).unwrap_err();
        assert!(matches!(error, BackupError::Busy { .. }), "{error}");
        live.execute_batch("COMMIT").unwrap();
        let (_, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
        assert_eq!(rows(&copies.databases[0].1), [1, 2, 3]);
    }

    /// A program that commits faster than its database can be stepped
    /// through (every 2 ms): the stepwise copy is given up after [`STEPWISE_TRIES`]
    /// beginnings and the copy made in one step, whole (a copy given up
    /// halfway, unjournaled, is not read).
    #[test]
    fn a_database_committed_to_faster_than_it_can_be_stepped_through_is_copied_in_one_step() {
        let checkpoint = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = checkpoint.path().join("db");
        let live = database(&db, false);
        // Many more pages than a step.
        live.execute(
            "WITH RECURSIVE k(n) AS (SELECT 3 UNION ALL SELECT n + 1 FROM k WHERE n < 2000)
             INSERT INTO t SELECT n FROM k",
            (),
        )
        .unwrap();
        live.execute_batch(
            "CREATE TABLE pad (b BLOB); INSERT INTO pad SELECT randomblob(3000) FROM t;",
        )
        .unwrap();
        drop(live);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (db, stop) = (db.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let connection = Connection::open(db).unwrap();
                connection.busy_timeout(Duration::from_secs(60)).unwrap();
                // Short commits (no fsync): the database is free between.
                connection
                    .pragma_update(None, "synchronous", "off")
                    .unwrap();
                let mut n = 2000;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    connection
                        .execute("INSERT INTO t VALUES (?1)", (n,))
                        .unwrap();
                }
            })
        };
        let roots = CheckpointFiles::dir(checkpoint.path());
        let copied = (0..3).map(|_| {
            let (_, copies) = with_consistent_databases(&roots, scratch.path()).unwrap();
            let copy = Connection::open(&copies.databases[0].1).unwrap();
            let check: String = copy
                .query_row("PRAGMA integrity_check", (), |row| row.get(0))
                .unwrap();
            assert_eq!(check, "ok");
            let (count, max): (i64, i64) = copy
                .query_row("SELECT count(*), max(n) FROM t", (), |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .unwrap();
            assert_eq!(count, max, "rows 1..=N, as committed");
            count
        });
        let counts: Vec<i64> = copied.collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(counts.iter().all(|count| *count >= 2000), "{counts:?}");
    }
}
