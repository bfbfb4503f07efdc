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
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use spot_worker_storage::files::CheckpointFiles;

mod backup;
mod find;

use backup::backup;
pub use backup::{STEP_PAGES, STEPWISE_TRIES};
use find::find_databases;

/// How many times the databases are looked for when a file vanishes between
/// a directory's listing and the look at that file (a program renaming its
/// files into place as it steps): the walk is taken again, at once. Giving
/// up at the first would put the whole save off until the next interval.
const FIND_TRIES: usize = 3;

/// The databases (and the companions of databases being created) under the
/// directory roots, walked again when a file vanished mid-walk.
fn find_in_roots(roots: &CheckpointFiles) -> Result<(Vec<find::Found>, Vec<String>), BackupError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut found = Vec::new();
        let mut nascent = Vec::new();
        let walked = roots
            .roots()
            .filter(|(_, _, is_dir)| *is_dir)
            .try_for_each(|(name, path, _)| find_databases(path, name, &mut found, &mut nascent));
        match walked {
            Ok(()) => return Ok((found, nascent)),
            Err(BackupError::Io(error))
                if error.kind() == std::io::ErrorKind::NotFound && tries < FIND_TRIES =>
            {
                continue;
            }
            Err(error) => return Err(error),
        }
    }
}

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
    let (found, nascent) = find_in_roots(roots)?;
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

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

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
