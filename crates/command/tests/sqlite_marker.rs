//! A live SQLite database and other files under one commit marker
//! (`SPOT_WORKER_CHECKPOINT_MARKER`), under the command handler on a real
//! Azurite: each step the program (Python's stdlib `sqlite3`) commits row N
//! to `rows.db`, rewrites `notes.txt` in place to N, then writes the marker
//! `COMMIT` = N last, without pause but a few milliseconds. Its program is
//! SIGKILLed mid-run; the next delivery restores a version whose database
//! holds exactly the rows up to the marker's step and whose notes say that
//! step (the database copy pairs with the files of the same program state),
//! and the version is dated by that marker: the redone time is within
//! 0.5 s of what the program's own log says it lost.
//!
//! Before the database's copy was weighed by its last commit, the copy
//! (made at the read, after the marker) counted as written after the
//! marker at every read, and no version with a database was ever saved.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_consumer::CompletionRecord;
use spot_worker_testkit::worker::{Env, VM_A, within};

/// The step the program ends at.
const STEPS: u64 = 400;

/// The program. Its log: `start N NOTES MARKER` (what it resumed with: the
/// database's last row, the notes and the marker), `pid P`, `marker N T`
/// (after writing the marker of step N), `end N`.
fn program(log: &Path) -> String {
    format!(
        r#"
import os, sqlite3, time
def note(*words):
    with open({log:?}, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")
d = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
def read(name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read() or "empty"
    except FileNotFoundError:
        return "-"
def write(name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)
notes, marker = read("notes.txt"), read("COMMIT")
db = sqlite3.connect(os.path.join(d, "rows.db"), timeout=30)
db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY)")
db.commit()
n = db.execute("SELECT coalesce(max(n), 0) FROM t").fetchone()[0]
note("start", n, notes, marker)
note("pid", os.getpid())
while n < {steps}:
    n += 1
    db.execute("INSERT INTO t VALUES (?)", (n,))
    db.commit()
    time.sleep(0.005)
    write("notes.txt", str(n))
    time.sleep(0.005)
    write("COMMIT", str(n))
    note("marker", n, repr(time.time()))
    time.sleep(0.02)
note("end", n)
"#,
        log = log.display().to_string(),
        steps = STEPS,
    )
}

fn words(log: &Path) -> Vec<Vec<String>> {
    lines(log)
        .iter()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn said<'a>(log: &'a [Vec<String>], what: &str) -> Vec<&'a Vec<String>> {
    log.iter()
        .filter(|words| words.first().is_some_and(|w| w == what))
        .collect()
}

fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_and_files_under_one_marker_are_restored_as_one_state_dated_by_the_marker() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let source = program(&log);
    env.queue
        .send(r#"{"job_id":"t1"}"#, Duration::ZERO)
        .await
        .unwrap();
    let config = CommandConfig::new("python3", ["-c", &source])
        .with_job_key("job_id")
        .with_checkpoint_every(Duration::from_millis(300))
        .with_checkpoint_marker("COMMIT")
        .unwrap();
    let a = env.worker(env.config(VM_A));
    let stop = a.shutdown_token();
    let running = tokio::spawn(a.run(CommandHandler::new(config, env.results.clone())));
    // A version saved while the program steps (not only at its end).
    let pid = within("a version saved while the program steps", async {
        loop {
            let saved = env.checkpoints.read("t1").await.unwrap().is_some();
            let log = words(&log);
            let steps = said(&log, "marker").len();
            if saved && steps >= 40 {
                break said(&log, "pid")[0][1].parse::<i32>().unwrap();
            }
            assert!(said(&log, "end").is_empty(), "ended before a save");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The program alone dies; its runner retries the job.
    let killed = wall_now();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let key = CompletionRecord::key("t1");
    let stored = within("the completion record", async {
        loop {
            if let Some(stored) = env.checkpoints.read(&key).await.unwrap() {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let record = CompletionRecord::from_checkpoint(&stored.checkpoint, &key).unwrap();
    stop.cancel();
    within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
    let log = words(&log);
    let starts = said(&log, "start");
    assert_eq!(starts.len(), 2, "{log:?}");
    assert_eq!(starts[0][1..], ["0", "-", "-"], "{log:?}");
    // The database's rows, the notes and the marker: one step.
    let resumed = &starts[1][1..];
    assert!(
        resumed[0] != "0" && resumed[0] == resumed[1] && resumed[1] == resumed[2],
        "restored rows up to {}, notes {}, marker {}: not one state of the program",
        resumed[0],
        resumed[1],
        resumed[2]
    );
    // Dated by its marker: the work lost is from that marker to the kill.
    let step = &resumed[0];
    let marked: f64 = said(&log, "marker")
        .iter()
        .find(|words| &words[1] == step)
        .expect("the restored step's marker in the log")[2]
        .parse()
        .unwrap();
    let lost = killed - marked;
    let redone = record.goodput.redone_ms as f64 / 1000.0;
    eprintln!("restored step {step}; lost {lost:.3} s (the program's log), redone {redone:.3} s");
    assert!(
        (redone - lost).abs() <= 0.5,
        "redone {redone} s, the program's log says {lost} s lost: {:?}",
        record.goodput
    );
    assert_eq!(said(&log, "end").len(), 1, "{log:?}");
}
