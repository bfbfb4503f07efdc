//! The checkpoint interval in the program's contract: the program sees
//! `SPOT_WORKER_CHECKPOINT_INTERVAL`, the runner's own saves follow it, and
//! `--checkpoint-every` wins over the worker's interval; the cost of a save
//! is how long the program took to write its file. Real programs, a real
//! Azurite.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource};
use spot_worker_decisions::goodput::Ledger;
use spot_worker_testkit::worker::{Env, within};

/// Runs one message through `config` on a consumer following `cadence`
/// (`None`: the consumer's own, adaptive) and returns what the program saw
/// as its interval.
async fn interval_seen(
    config: impl Fn(&str) -> CommandConfig,
    cadence: Option<Duration>,
) -> String {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("interval");
    let script = format!(
        "echo \"$SPOT_WORKER_CHECKPOINT_INTERVAL\" >> {}",
        quoted(&log)
    );
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let mut consumer = consumer(&env, 1);
    if let Some(every) = cadence {
        consumer = consumer.with_cadence(Arc::new(CheckpointCadence::new(
            IntervalSource::Explicit(every),
        )));
    }
    let handler = CommandHandler::new(config(&script), env.results.clone());
    let stats = Running::start(consumer, handler)
        .stop_when(|s| s.succeeded == 1)
        .await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    lines(&log).join(",")
}

fn plain(script: &str) -> CommandConfig {
    CommandConfig::new("sh", ["-c", script])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_sees_the_workers_interval_unless_checkpoint_every_fixes_it() {
    // The worker's interval, in whole seconds.
    assert_eq!(
        interval_seen(plain, Some(Duration::from_secs(7))).await,
        "7"
    );
    // Rounded up, so the program never saves more often than the runner looks.
    assert_eq!(
        interval_seen(plain, Some(Duration::from_millis(7200))).await,
        "8"
    );
    // The adaptive interval before any save was measured: the least, 10 s.
    assert_eq!(interval_seen(plain, None).await, "10");
    // --checkpoint-every wins over the worker's interval.
    let fixed = |script: &str| plain(script).with_checkpoint_every(Duration::from_secs(3));
    assert_eq!(
        interval_seen(fixed, Some(Duration::from_secs(7))).await,
        "3"
    );
}

/// How long the program below pauses in the middle of writing its
/// checkpoint file: the least its write can be measured to take.
const WRITE_PAUSE: Duration = Duration::from_millis(700);
/// How far below the program's pause its measured write may read: one
/// tick of the kernel's coarse clock that stamps file times (10 ms at
/// HZ=100), and f32 rounding.
const TIMESTAMP_SLACK: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_programs_slow_checkpoint_write_is_the_cost_of_its_save_and_checkpointing_time() {
    assert_birth_times_recorded();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    // Writes 512 KiB into a temporary file with a pause in the middle,
    // renames it over the checkpoint file (the contract), then works on
    // until the test has seen the runner save it.
    let program = format!(
        r#"
import os, sys, time
path = os.environ["SPOT_WORKER_CHECKPOINT"]
with open(path + ".tmp", "wb") as f:
    f.write(os.urandom(256 * 1024))
    f.flush()
    time.sleep({pause})
    f.write(os.urandom(256 * 1024))
os.rename(path + ".tmp", path)
for _ in range(1200):
    if os.path.exists({go:?}):
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
"#,
        pause = WRITE_PAUSE.as_secs_f64(),
        go = go.display().to_string(),
    );
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // A long fixed interval: the runner saves the file once, as it appears.
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(3600),
    )));
    let ledgers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let consumer = consumer(&env, 1)
        .with_cadence(cadence.clone())
        .with_goodput_observer({
            let ledgers = ledgers.clone();
            Arc::new(move |ledger: &Ledger| ledgers.lock().unwrap().push(*ledger))
        });
    let started = std::time::Instant::now();
    let handler = CommandHandler::new(
        CommandConfig::new("python3", ["-c", program.as_str()]),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    within("the runner's save of the file", async {
        while cadence.view().cost.saves == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The save's cost is the program's write, not the upload beside it.
    let cost = cadence.view().cost;
    let bound = started.elapsed();
    assert_eq!(cost.saves, 1, "{cost:?}");
    // File times come from the kernel's coarse clock (a tick apart) and the
    // cost is kept as an f32 of seconds: a pause of exactly 0.7 s between
    // two ticks reads back as 0.69999997 s.
    assert!(
        cost.blocked_total + TIMESTAMP_SLACK >= WRITE_PAUSE && cost.blocked_total < bound,
        "{cost:?}, within {bound:?}"
    );
    assert!(cost.bytes > 512 * 1024, "{cost:?}");
    std::fs::write(&go, b"").unwrap();
    let stats = running.stop_when(|s| s.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    // The job's ledger counts the write as checkpointing, not work.
    let ledgers = ledgers.lock().unwrap();
    let [ledger] = ledgers.as_slice() else {
        panic!("one finished job: {ledgers:?}");
    };
    let pause_ms = millis(WRITE_PAUSE - TIMESTAMP_SLACK);
    assert!(
        ledger.checkpointing_ms >= pause_ms && ledger.total_ms() <= millis(started.elapsed()),
        "{ledger:?}"
    );
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap()
}
