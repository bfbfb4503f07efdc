//! The progress file in the program's contract (`SPOT_WORKER_PROGRESS`):
//! the runner reads it, and with the pace it gives puts off a save the job
//! ends too soon after to need; a malformed one is said once and ignored.
//! Real programs, a real Azurite; alone in its test binary, because it
//! installs the log subscriber (debug and up) for the whole process.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource};
use spot_worker_testkit::worker::{Env, within};

/// The process's log, captured from debug up (once per test binary).
fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| Captured::install_from(tracing::Level::DEBUG))
}

/// One job run by a program that writes `first` as its progress and a
/// first checkpoint file (each a temporary file renamed over it), then on
/// [`Job::step`] writes `second` as its progress and a second checkpoint
/// file, then exits 0 on [`Job::finish`] (each wait bounded).
struct Job {
    _env: Env,
    _dir: tempfile::TempDir,
    step: PathBuf,
    go: PathBuf,
    cadence: Arc<CheckpointCadence>,
    running: Running,
}

impl Job {
    async fn start(source: IntervalSource, first: &str, second: &str) -> Job {
        let env = Env::start().await;
        let dir = tempfile::tempdir().unwrap();
        let (step, go) = (dir.path().join("step"), dir.path().join("go"));
        let program = two_step_program(
            first,
            &step,
            second,
            &format!("wait({go:?})", go = go.display().to_string()),
        );
        env.queue.send("job", Duration::ZERO).await.unwrap();
        let cadence = Arc::new(CheckpointCadence::new(source));
        let consumer = consumer(&env, 1).with_cadence(cadence.clone());
        let handler = CommandHandler::new(
            CommandConfig::new("python3", ["-c", program.as_str()]),
            env.results.clone(),
        );
        let running = Running::start(consumer, handler);
        Job {
            _env: env,
            _dir: dir,
            step,
            go,
            cadence,
            running,
        }
    }

    /// Waits (bounded) until the runner saved the checkpoint file `saves`
    /// times.
    async fn saved(&self, saves: u64) {
        within("the runner's saves", async {
            while self.cadence.view().cost.saves < saves {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    fn step(&self) {
        std::fs::write(&self.step, b"").unwrap();
    }

    /// Lets the program exit 0 and waits for the job to be done.
    async fn finish(self) {
        std::fs::write(&self.go, b"").unwrap();
        let stats = self.running.stop_when(|s| s.succeeded == 1).await;
        assert_eq!(stats.succeeded, 1, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_about_to_end_puts_off_the_runners_next_save() {
    let captured = captured();
    // Many interruptions: Daly's interval is the least, 10 s, and a job
    // longer than two of them would save at once.
    let adaptive = IntervalSource::Adaptive {
        seed_evictions_per_hour: 1000.0,
    };
    let job = Job::start(adaptive, "0", "0.99").await;
    // The first save, as the file appears; the pace's first reading, 0.
    job.saved(1).await;
    job.step();
    // At the next look, 10 s on, the program says it is 99 % done at a
    // pace that ends it well within the interval: the runner keeps the
    // changed file unsaved instead of saving just before the end.
    let put_off = tokio::time::timeout(spot_worker_testkit::worker::PATIENCE, async {
        loop {
            let said = captured.lines().into_iter().find(|line| {
                line.contains("the saves are spread over the rest of the job")
                    && line.contains("due=false")
            });
            if let Some(line) = said {
                break line;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the runner never put off its save; its log:\n{}",
            captured.runners_log()
        )
    });
    assert_eq!(
        job.cadence.view().cost.saves,
        1,
        "{put_off}\nthe runner's log:\n{}",
        captured.runners_log()
    );
    job.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_progress_file_is_said_once_and_ignored() {
    let captured = captured();
    let every = IntervalSource::Explicit(Duration::from_millis(500));
    let job = Job::start(every, "42%", "half").await;
    job.saved(1).await;
    job.step();
    // Saved at the worker's interval as without a progress file, though
    // the runner read the malformed file at every look.
    job.saved(2).await;
    job.finish().await;
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
