//! The cost of a save is what it costs the job (issue 38): for a live
//! SQLite database written in place, a file written whole (a temporary
//! file renamed over the checkpoint, as `np.save` + rename does) and a
//! directory of shards, the cost Daly's interval uses and the job's
//! checkpointing time are within 2× of what the program's own log says
//! its writes took. Real programs (python3, stdlib only), the real runner,
//! a real Azurite.

use crate::common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_decisions::cadence::{CheckpointCadence, CheckpointCost, IntervalSource};
use spot_worker_decisions::goodput::Ledger;
use spot_worker_testkit::worker::{Env, within};

/// How often the runner looks at the checkpoint: often, so that it saves
/// each version the program writes.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The python3 prelude every program below shares: its log of its own
/// writes (one `start end` line of wall-clock seconds per version), and
/// the wait for the test's go-ahead once the runner has saved a version.
fn prelude(log: &Path, go: &Path) -> String {
    format!(
        r#"
import os, sys, time
log = open({log:?}, "a")
def wrote(start, end):
    log.write(f"{{start}} {{end}}\n")
    log.flush()
def wait_for_save(k):
    for _ in range(2400):
        if os.path.exists({go:?} + str(k)):
            return
        time.sleep(0.05)
    sys.exit(3)
"#,
        log = log.display().to_string(),
        go = go.display().to_string(),
    )
}

/// What one run of a program reported and logged.
struct Measured {
    /// The cost the worker's interval took in (Daly's interval uses it).
    cost: CheckpointCost,
    /// The finished job's goodput ledger.
    ledger: Ledger,
    /// The program's log: how long each of its writes took.
    writes: Vec<Duration>,
}

/// Runs `body` (python3, after [`prelude`]) as one job; each time the
/// runner has saved one more version, creates the go-ahead file for it
/// (`go1`, `go2`, ...), up to `versions`.
async fn run(body: &str, versions: u64) -> Measured {
    assert_birth_times_recorded();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("writes");
    let go = dir.path().join("go");
    let program = format!("{}\n{body}", prelude(&log, &go));
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // A fixed interval, read back for the cost it measured.
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(3600),
    )));
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let consumer = consumer(&env, 1)
        .with_cadence(cadence.clone())
        .with_goodput_observer({
            let ledgers = ledgers.clone();
            Arc::new(move |ledger: &Ledger| ledgers.lock().unwrap().push(*ledger))
        });
    let handler = CommandHandler::new(
        CommandConfig::new("python3", ["-c", program.as_str()]).with_checkpoint_every(LOOK_EVERY),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    for k in 1..=versions {
        within("the runner's save of the program's version", async {
            while cadence.view().cost.saves < k {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        std::fs::write(format!("{}{k}", go.display()), b"").unwrap();
    }
    let stats = running.stop_when(|s| s.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    let ledger = match ledgers.lock().unwrap().as_slice() {
        [ledger] => *ledger,
        ledgers => panic!("one finished job: {ledgers:?}"),
    };
    let writes = lines(&log)
        .iter()
        .map(|line| {
            let (start, end) = line.split_once(' ').unwrap();
            let (start, end): (f64, f64) = (start.parse().unwrap(), end.parse().unwrap());
            Duration::from_secs_f64(end - start)
        })
        .collect();
    let measured = Measured {
        cost: cadence.view().cost,
        ledger,
        writes,
    };
    eprintln!(
        "saves {}, cost {:?} (recent {:?}), checkpointing {} ms; the program's log: {:?}",
        measured.cost.saves,
        measured.cost.blocked_total,
        measured.cost.estimate(),
        measured.ledger.checkpointing_ms,
        measured.writes.iter().sum::<Duration>()
    );
    measured
}

/// Asserts `reported` is within 2× of `truth`, each way.
fn within_twice(what: &str, reported: Duration, truth: Duration, measured: &Measured) {
    assert!(
        reported * 2 >= truth && reported <= truth * 2,
        "{what}: reported {reported:?}, the program's log says {truth:?}; cost {:?}, ledger {:?}, writes {:?}",
        measured.cost,
        measured.ledger,
        measured.writes
    );
}

/// Asserts the cost the interval uses and the job's checkpointing time
/// are within 2× of the program's writes of whole versions, one per save.
fn assert_cost_is_the_writes(measured: &Measured, versions: u64) {
    let Measured { cost, ledger, .. } = measured;
    assert_eq!(measured.writes.len() as u64, versions, "the program's log");
    assert!(cost.saves >= versions, "{cost:?}");
    let truth: Duration = measured.writes.iter().sum();
    within_twice("total cost", cost.blocked_total, truth, measured);
    within_twice(
        "checkpointing",
        Duration::from_millis(ledger.checkpointing_ms),
        truth,
        measured,
    );
    let mean = truth / u32::try_from(versions).unwrap();
    within_twice(
        "the cost Daly's interval uses",
        cost.estimate().unwrap(),
        mean,
        measured,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sqlite_database_costs_its_commits_not_its_age() {
    // Commits a row every 0.1 s (a trial's work), logging each commit;
    // waits twice for the runner to have saved the database meanwhile.
    let body = r#"
import sqlite3
d = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
os.makedirs(d, exist_ok=True)
db = sqlite3.connect(os.path.join(d, "study.db"))
start = time.time()
db.execute("create table trials (n integer primary key, value real)")
db.commit()
wrote(start, time.time())
for n in range(30):
    time.sleep(0.1)
    start = time.time()
    db.execute("insert into trials values (?, ?)", (n, n * 0.5))
    db.commit()
    wrote(start, time.time())
    if n in (9, 19):
        wait_for_save(1 + n // 10)
db.close()
"#;
    let measured = run(body, 2).await;
    let Measured { cost, ledger, .. } = &measured;
    assert_eq!(measured.writes.len(), 31, "the program's log");
    assert!(cost.saves >= 2, "{cost:?}");
    // The truth is the program's commits at most: a version of a database
    // written in place costs the job no write of its own. The program ran
    // over 3 s; the database's age, which the cost was, is seconds.
    let commits: Duration = measured.writes.iter().sum();
    let bound = commits * 2;
    assert!(cost.blocked_total <= bound, "{cost:?}, commits {commits:?}");
    assert!(
        Duration::from_millis(ledger.checkpointing_ms) <= bound,
        "{ledger:?}, commits {commits:?}"
    );
    assert!(cost.estimate().unwrap() <= bound, "{cost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_whole_and_renamed_costs_its_write() {
    // As `np.save` to a temporary file and `os.rename` over the checkpoint
    // do: 1 MiB in four parts 0.1 s apart, three versions, work between.
    let body = r#"
path = os.environ["SPOT_WORKER_CHECKPOINT"]
for k in range(1, 4):
    time.sleep(0.3)
    start = time.time()
    with open(path + ".tmp", "wb") as f:
        for part in range(4):
            if part:
                time.sleep(0.1)
            f.write(os.urandom(256 * 1024))
            f.flush()
    end = time.time()
    os.rename(path + ".tmp", path)
    wrote(start, end)
    wait_for_save(k)
"#;
    let measured = run(body, 3).await;
    assert_cost_is_the_writes(&measured, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_shards_costs_the_span_of_its_versions_writes() {
    // Three shards written whole beside the directory and renamed into it;
    // each later version rewrites one of them, after work that makes the
    // oldest shard's age far longer than any version's writes.
    let body = r#"
d = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
os.makedirs(d, exist_ok=True)
stage = os.path.join(os.path.dirname(d), "stage")
os.makedirs(stage, exist_ok=True)
def shard(i):
    with open(os.path.join(stage, f"shard-{i}"), "wb") as f:
        f.write(os.urandom(128 * 1024))
        f.flush()
        time.sleep(0.15)
        f.write(os.urandom(128 * 1024))
for k in range(1, 4):
    time.sleep(0.8)
    shards = range(3) if k == 1 else [k - 1]
    start = time.time()
    for i in shards:
        shard(i)
    end = time.time()
    for i in shards:
        os.rename(os.path.join(stage, f"shard-{i}"), os.path.join(d, f"shard-{i}"))
    wrote(start, end)
    wait_for_save(k)
"#;
    let measured = run(body, 3).await;
    let Measured { cost, writes, .. } = &measured;
    assert_eq!(writes.len(), 3, "the program's log");
    assert!(cost.saves >= 3, "{cost:?}");
    let truth: Duration = writes.iter().sum();
    within_twice("total cost", cost.blocked_total, truth, &measured);
    within_twice(
        "checkpointing",
        Duration::from_millis(measured.ledger.checkpointing_ms),
        truth,
        &measured,
    );
    // Daly's interval takes a weighted mean of the saves' costs: within
    // 2× of some version's writes, never the oldest shard's age.
    let estimate = cost.estimate().unwrap();
    let (least, most) = (writes.iter().min().unwrap(), writes.iter().max().unwrap());
    assert!(
        estimate * 2 >= *least && estimate <= *most * 2,
        "the cost Daly's interval uses: {estimate:?}; writes {writes:?}"
    );
}
