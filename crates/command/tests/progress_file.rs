//! The progress file in the program's contract (`SPOT_WORKER_PROGRESS`):
//! the runner reads it, and with the pace it gives puts off a save the job
//! ends too soon after to need; a malformed one is said once and ignored.
//! Real programs, a real Azurite; alone in its test binary, because it
//! installs the log subscriber (debug and up) for the whole process.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::*;
use spot_worker_storage::{CheckpointCadence, IntervalSource};
use spot_worker_testkit::worker::{Env, within};

/// The process's log, captured from debug up (once per test binary).
fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .init();
        captured
    })
}

/// A program that writes `first` as its progress and a first checkpoint
/// file (each a temporary file renamed over it), then once `step` exists
/// writes `second` as its progress and a second checkpoint file, then
/// exits 0 once `go` exists (each wait bounded).
fn program(first: &str, second: &str, step: &std::path::Path, go: &std::path::Path) -> String {
    format!(
        r#"
import os, sys, time
def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)
def wait(path):
    for _ in range(2400):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit(3)
progress, checkpoint = os.environ["SPOT_WORKER_PROGRESS"], os.environ["SPOT_WORKER_CHECKPOINT"]
put(progress, {first:?})
put(checkpoint, "first")
wait({step:?})
put(progress, {second:?})
put(checkpoint, "second")
wait({go:?})
"#,
        step = step.display().to_string(),
        go = go.display().to_string(),
    )
}

async fn saves_reach(cadence: &CheckpointCadence, saves: u64) {
    within("the runner's saves", async {
        while cadence.view().cost.saves < saves {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_about_to_end_puts_off_the_runners_next_save() {
    let captured = captured();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (step, go) = (dir.path().join("step"), dir.path().join("go"));
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // Many interruptions: Daly's interval is the least, 10 s, and a job
    // longer than two of them would save at once.
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
        seed_evictions_per_hour: 1000.0,
    }));
    let consumer = consumer(&env, 1).with_cadence(cadence.clone());
    let script = program("0", "0.99", &step, &go);
    let handler = spot_worker_command::CommandHandler::new(
        spot_worker_command::CommandConfig::new("python3", ["-c", script.as_str()]),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    // The first save, as the file appears; the pace's first reading, 0.
    saves_reach(&cadence, 1).await;
    std::fs::write(&step, b"").unwrap();
    // At the next look, 10 s on, the program says it is 99 % done at a
    // pace that ends it well within the interval: the runner keeps the
    // changed file unsaved instead of saving just before the end.
    let put_off = within("the runner putting off its save", async {
        loop {
            let said = captured.lines().into_iter().find(|line| {
                line.contains("the program's progress spreads the saves")
                    && line.contains("due=false")
            });
            if let Some(line) = said {
                break line;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(cadence.view().cost.saves, 1, "{put_off}");
    std::fs::write(&go, b"").unwrap();
    let stats = running.stop_when(|s| s.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_progress_file_is_said_once_and_ignored() {
    let captured = captured();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (step, go) = (dir.path().join("step"), dir.path().join("go"));
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_millis(500),
    )));
    let consumer = consumer(&env, 1).with_cadence(cadence.clone());
    let script = program("42%", "half", &step, &go);
    let handler = spot_worker_command::CommandHandler::new(
        spot_worker_command::CommandConfig::new("python3", ["-c", script.as_str()]),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    saves_reach(&cadence, 1).await;
    std::fs::write(&step, b"").unwrap();
    // Saved at the worker's interval as without a progress file, though
    // the runner read the malformed file at every look.
    saves_reach(&cadence, 2).await;
    std::fs::write(&go, b"").unwrap();
    let stats = running.stop_when(|s| s.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    let said: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|line| line.contains("the progress file (SPOT_WORKER_PROGRESS) is ignored"))
        .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(said[0].contains("WARN"), "{said:#?}");
    assert!(
        said[0].contains(r#"holds "42%", not a number"#),
        "{said:#?}"
    );
}
