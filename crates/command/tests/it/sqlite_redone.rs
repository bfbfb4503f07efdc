//! Redone time for a program that keeps its state in a live SQLite
//! database (Python's stdlib `sqlite3`, committing a row every 0.25 s, then
//! a longer step it commits nothing in): crashed (SIGKILL to the program
//! alone, its runner alive) or evicted (a real, emulated, IMDS notice) in
//! that step, under `spot-worker run` with default settings on a real
//! Azurite. The work lost is the program's since its last commit in the
//! version restored next; the completion record's redone time is within
//! 0.5 s of what the program's own log says. A database's version is dated
//! by that last commit, not by when the runner backed it up: dated by the
//! backup (after the crash), the lost step was reported as about 0 s.

use crate::common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_consumer::CompletionRecord;
use spot_worker_imds_emulator::EventSpec;
use spot_worker_testkit::worker::{Env, VM_A, VM_B, within};

/// The row after which the first delivery works a long step, committing
/// nothing, noting `working I T` every 0.25 s of it.
const LONG_STEP_AFTER: u64 = 8;

/// The program: 24 rows, one committed every 0.25 s, with the long step
/// after row [`LONG_STEP_AFTER`] on its first delivery (a resumed one has
/// rows already). Its log: `start N T` (rows it resumed with), `pid P T`,
/// `commit N T` (after the commit), `working I T`, `term T` (the stop
/// signal, on which it exits at once, saving nothing), `end N T`.
fn program(log: &Path) -> String {
    format!(
        r#"
import os, signal, sqlite3, time
def note(*words):
    with open({log:?}, "a") as f:
        f.write(" ".join(str(w) for w in words) + " " + repr(time.time()) + "\n")
path = os.path.join(os.environ["SPOT_WORKER_CHECKPOINT_DIR"], "rows.db")
db = sqlite3.connect(path, timeout=30)
db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY)")
db.commit()
n = db.execute("SELECT coalesce(max(n), 0) FROM t").fetchone()[0]
note("start", n)
note("pid", os.getpid())
def on_term(*_):
    note("term")
    os._exit(1)
signal.signal(signal.SIGTERM, on_term)
resumed = n > 0
while n < 24:
    time.sleep(0.25)
    n += 1
    db.execute("INSERT INTO t VALUES (?)", (n,))
    db.commit()
    note("commit", n)
    if n == {long_after} and not resumed:
        for i in range(60):
            time.sleep(0.25)
            note("working", i)
note("end", n)
"#,
        log = log.display().to_string(),
        long_after = LONG_STEP_AFTER,
    )
}

/// One line of the program's log: what, its number (if any), and when.
struct Entry {
    what: String,
    number: Option<u64>,
    at: f64,
}

fn entries(log: &Path) -> Vec<Entry> {
    lines(log)
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            // A line still being written is read at the next look.
            let at = words.last()?.parse().ok()?;
            let number = if words.len() == 3 {
                Some(words[1].parse().ok()?)
            } else {
                None
            };
            Some(Entry {
                what: words[0].to_owned(),
                number,
                at,
            })
        })
        .collect()
}

fn find<'a>(log: &'a [Entry], what: &str, number: Option<u64>) -> Vec<&'a Entry> {
    log.iter()
        .filter(|e| e.what == what && (number.is_none() || e.number == number))
        .collect()
}

/// Waits until the program has worked 1.5 s of its long step (nothing
/// committed since row [`LONG_STEP_AFTER`]); returns its process id.
async fn in_the_long_step(log: &Path) -> i32 {
    within("the program 1.5 s into its long step", async {
        loop {
            let log = entries(log);
            if find(&log, "working", None).len() >= 6 {
                break find(&log, "pid", None)[0].number.unwrap() as i32;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn handler(env: &Env, source: &str) -> CommandHandler {
    // Default settings: the worker's adaptive interval, SIGTERM.
    CommandHandler::new(
        CommandConfig::new("python3", ["-c", source]).with_job_key("job_id"),
        env.results.clone(),
    )
}

/// Within this of what the program's log shows.
const WITHIN: f64 = 0.5;

/// The program's loss, `ended` (its death) less its last commit before
/// it, against the record; the next delivery resumed from that commit.
fn assert_redone(record: &CompletionRecord, log: &[Entry], ended: f64, case: &str) {
    let ledger = record.goodput;
    let last = find(log, "commit", Some(LONG_STEP_AFTER))[0].at;
    let lost = ended - last;
    assert!(lost >= 1.5, "{case}: died {lost} s after its last commit");
    let redone = ledger.redone_ms as f64 / 1000.0;
    eprintln!("{case}: lost {lost:.3} s (the program's log), redone {redone:.3} s reported");
    assert!(
        (redone - lost).abs() <= WITHIN,
        "{case}: redone {redone} s, the program's log says {lost} s lost: {ledger:?}"
    );
    assert_eq!(ledger.deliveries, 2, "{case}: {ledger:?}");
    // The next delivery resumed from that commit, and finished.
    let starts: Vec<_> = find(log, "start", None).iter().map(|e| e.number).collect();
    assert_eq!(starts, [Some(0), Some(LONG_STEP_AFTER)], "{case}");
    assert_eq!(find(log, "end", Some(24)).len(), 1, "{case}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_database_programs_lost_work_is_its_redone_time() {
    let (env, _dir, log) = job_queued(r#"{"job_id":"t1"}"#, "log").await;
    let source = program(&log);
    let a = env.worker(env.config(VM_A));
    let stop = a.shutdown_token();
    let running = tokio::spawn(a.run(handler(&env, &source)));
    let pid = in_the_long_step(&log).await;
    // The program alone dies; its runner goes on, saves what is there
    // and retries the job (the same worker, after the retry's backoff).
    let killed = wall_now();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let record = completion_record(&env, "t1").await;
    stop.cancel();
    let report = within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.stats.retried, 1, "{:?}", report.stats);
    env.assert_queues_empty().await;
    assert!(find(&entries(&log), "term", None).is_empty());
    assert_redone(&record, &entries(&log), killed, "crashed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_database_programs_lost_work_is_its_redone_time() {
    let (env, _dir, log) = job_queued(r#"{"job_id":"t1"}"#, "log").await;
    let source = program(&log);
    let a = env.worker(env.config(VM_A));
    let running = tokio::spawn(a.run(handler(&env, &source)));
    in_the_long_step(&log).await;
    env.emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    let report = within("worker A to drain", running).await.unwrap().unwrap();
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));

    let b = env.worker(env.config(VM_B));
    let stop = b.shutdown_token();
    let running = tokio::spawn(b.run(handler(&env, &source)));
    let record = completion_record(&env, "t1").await;
    stop.cancel();
    within("worker B to stop", running).await.unwrap().unwrap();
    env.assert_queues_empty().await;
    let log = entries(&log);
    let term = find(&log, "term", None)[0].at;
    assert_redone(&record, &log, term, "evicted");
}
