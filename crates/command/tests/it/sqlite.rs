//! A live SQLite database in the checkpoint directory, with a real
//! program (Python's stdlib `sqlite3`, committing a row every 0.25 s) on
//! a real Azurite, in rollback-journal and WAL mode: every version the
//! runner saves while the program writes is one the program committed
//! (integrity ok, its rows a prefix of what it wrote), with no journal or
//! log beside it to roll back or replay.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_storage::files::{CheckpointFiles, Manifest};
use spot_worker_storage::{Checkpoint, CheckpointStore, JobCheckpoint, WritePrecondition};
use spot_worker_testkit::store_layer::{KeepWrites, Layered};
use spot_worker_testkit::worker::{Env, within};

/// The program: opens `rows.db` in the checkpoint directory in `mode`,
/// then commits `rows` rows, 0.25 s apart, each a few pages (a row of
/// 16 KiB and an index entry), row n's content a function of n.
fn program(mode: &str, rows: u32) -> String {
    format!(
        r#"
import os, sqlite3, time
path = os.path.join(os.environ["SPOT_WORKER_CHECKPOINT_DIR"], "rows.db")
db = sqlite3.connect(path, timeout=30)
db.execute("PRAGMA journal_mode={mode}")
db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY, sq INTEGER, pad BLOB)")
db.execute("CREATE INDEX IF NOT EXISTS t_sq ON t (sq)")
db.commit()
n = db.execute("SELECT coalesce(max(n), 0) FROM t").fetchone()[0]
while n < {rows}:
    n += 1
    db.execute("INSERT INTO t VALUES (?, ?, ?)", (n, n * n, bytes([n % 251]) * 16384))
    db.commit()
    time.sleep(0.25)
"#
    )
}

/// What a saved database holds: its rows are 1..=N, each as the program
/// wrote it (none before it made its table), and SQLite finds nothing
/// wrong; N is returned.
pub fn committed_prefix(db: &Path) -> i64 {
    let check = format!(
        r#"
import sqlite3, sys
db = sqlite3.connect({db:?})
assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", "integrity"
# Before its first commit of the table, the program had none.
tables = db.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0]
rows = db.execute("SELECT n, sq, pad FROM t ORDER BY n").fetchall() if tables else []
for i, (n, sq, pad) in enumerate(rows, start=1):
    assert (n, sq, pad) == (i, i * i, bytes([i % 251]) * 16384), ("row", i, n)
print(len(rows))
"#,
        db = db.display().to_string(),
    );
    let output = std::process::Command::new("python3")
        .args(["-c", &check])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{} is not a version the program committed: {}",
        db.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Runs the program to its end with saves every 0.3 s, then restores
/// every version saved and checks it.
async fn every_version_is_one_the_program_committed(mode: &str) {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let source = program(mode, 24);
    let config = CommandConfig::new("python3", ["-c", source.as_str()])
        .with_checkpoint_every(Duration::from_millis(300));
    let handler = Observed::new(CommandHandler::new(config, env.results.clone()));
    // Keeps every checkpoint written, and every chunk (deletes are let
    // through to nothing), so each version saved can be restored
    // afterwards.
    let keeping = Arc::new(Layered::wrap(
        env.checkpoints.clone(),
        KeepWrites::keeping_chunks(),
    ));
    one_job_saving_to(&env, &handler, keeping.clone()).await;

    let written = keeping.policy().written();
    let saved: Vec<Checkpoint> = written
        .into_iter()
        .filter(|checkpoint| match checkpoint {
            Checkpoint::InProgress { progress } => Manifest::from_progress(progress).is_some(),
            Checkpoint::Completed { .. } => false,
        })
        .collect();
    // 6 s of commits, a look every 0.3 s: many versions, not one or two.
    assert!(saved.len() >= 5, "only {} versions saved", saved.len());
    let mut last = 0;
    for (number, checkpoint) in saved.iter().enumerate() {
        // Each version, as the next delivery would restore it.
        let key = format!("version-{number}");
        keeping
            .inner()
            .write(&key, checkpoint, WritePrecondition::Create, None)
            .await
            .unwrap();
        let store: Arc<dyn CheckpointStore> = keeping.clone();
        let mut handle = JobCheckpoint::load(store, key).await.unwrap();
        let into = tempfile::tempdir().unwrap();
        handle
            .restore_files(&CheckpointFiles::dir(into.path()))
            .await
            .unwrap()
            .unwrap();
        let names: Vec<String> = std::fs::read_dir(into.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        // No journal to roll back, no log to replay: the database alone.
        assert_eq!(names, ["rows.db"], "version {number} ({mode})");
        let rows = committed_prefix(&into.path().join("rows.db"));
        assert!(rows >= last, "version {number} ({mode}) went back");
        last = rows;
    }
    assert!(last > 0, "no version held a row ({mode})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_of_a_live_rollback_journal_database_is_one_it_committed() {
    within(
        "the rollback-journal job",
        every_version_is_one_the_program_committed("delete"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_of_a_live_wal_database_is_one_it_committed() {
    within(
        "the WAL job",
        every_version_is_one_the_program_committed("wal"),
    )
    .await;
}

/// Makes a database of `pages` pages of 4 KiB in rollback-journal mode.
fn filled(db: &Path, pages: u32) -> rusqlite::Connection {
    let connection = rusqlite::Connection::open(db).unwrap();
    connection
        .execute_batch(
            "PRAGMA journal_mode = delete; PRAGMA synchronous = off;
             CREATE TABLE t (n INTEGER PRIMARY KEY, pad BLOB);",
        )
        .unwrap();
    connection
        .execute(
            "WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < ?1)
             INSERT INTO t (pad) SELECT randomblob(3000) FROM k",
            (pages,),
        )
        .unwrap();
    connection
}

/// How long SQLite's backup takes to copy `db` in one step (the hold the
/// program's commits saw before copies were made in steps): the median
/// of three, on this machine, now.
fn one_step_copy(db: &Path) -> Duration {
    let mut times: Vec<Duration> = (0..3)
        .map(|_| {
            let into = tempfile::tempdir().unwrap();
            let from = rusqlite::Connection::open(db).unwrap();
            let mut to = rusqlite::Connection::open(into.path().join("copy")).unwrap();
            // As the runner makes its copies: not synced, not journaled.
            to.execute_batch("PRAGMA synchronous = off; PRAGMA journal_mode = off;")
                .unwrap();
            let started = std::time::Instant::now();
            let backup = rusqlite::backup::Backup::new(&from, &mut to).unwrap();
            assert_eq!(backup.step(-1).unwrap(), rusqlite::backup::StepResult::Done);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[1]
}

/// In rollback-journal mode a copy made in one step holds every commit
/// that comes meanwhile for the whole copy; made in steps, a commit waits
/// for one step. The program here commits a row every 50 ms (or every
/// three one-step copies' time, on a machine slow enough that 50 ms would
/// not leave room for a copy between commits) while its database of
/// 8192 pages is saved again and again: no commit waits half as long as a
/// one-step copy takes (measured here, now; a step is 1/128 of it), and
/// every copy holds rows the program committed, in order.
#[test]
fn a_rollback_journal_database_holds_a_commit_for_a_step_not_a_copy() {
    let checkpoint = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let db = checkpoint.path().join("state.db");
    drop(filled(&db, 8192));
    let copy = one_step_copy(&db);
    let period = (copy * 3).max(Duration::from_millis(50));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let connection = rusqlite::Connection::open(db).unwrap();
            connection
                .pragma_update(None, "synchronous", "off")
                .unwrap();
            // Tries again every millisecond: what it waits is the hold.
            connection
                .busy_handler(Some(|_tries| {
                    std::thread::sleep(Duration::from_millis(1));
                    true
                }))
                .unwrap();
            let mut times = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = std::time::Instant::now();
                connection
                    .execute("INSERT INTO t (pad) VALUES (randomblob(1000))", ())
                    .unwrap();
                times.push(started.elapsed());
                std::thread::sleep(period);
            }
            times
        })
    };
    let roots = CheckpointFiles::dir(checkpoint.path());
    let mut rows = Vec::new();
    // Saves back to back for 24 of the program's commits.
    let saving = std::time::Instant::now();
    while saving.elapsed() < period * 24 {
        let (_, copies) =
            spot_worker_command::with_consistent_databases(&roots, scratch.path()).unwrap();
        let copied = rusqlite::Connection::open(&copies.databases[0].1).unwrap();
        let (count, max): (i64, i64) = copied
            .query_row("SELECT count(*), max(n) FROM t", (), |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .unwrap();
        assert_eq!(count, max, "a copy whose rows are not all committed ones");
        rows.push(count);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let times = writer.join().unwrap();
    assert!(rows.windows(2).all(|pair| pair[0] <= pair[1]), "{rows:?}");
    assert!(
        rows.last() > rows.first(),
        "no copy saw a new commit: {rows:?}"
    );
    let longest = times.iter().max().unwrap();
    assert!(
        *longest < copy / 2,
        "a commit waited {longest:?}; a one-step copy takes {copy:?} ({} commits, {} copies)",
        times.len(),
        rows.len()
    );
}
