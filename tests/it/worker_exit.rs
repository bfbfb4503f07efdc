//! The process exits even when a handler will not (issue 16, item 4): a
//! REAL worker process (`examples/stubborn`, a plain `#[tokio::main]`
//! binary) whose handler ignores its cancellation is stopped by SIGTERM or a
//! Preempt notice, against Azurite and the IMDS emulator. It exits within
//! the drain budget plus a second with status 0, its message is visible
//! again at once, and the result the handler writes later never appears.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use spot_worker_imds_emulator::EventSpec;
use spot_worker_testkit::chaos::example_binary;
use spot_worker_testkit::worker::{Env, PATIENCE, VM_A, within};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tokio::time::Instant;

use crate::common::start_worker;

/// The drain budget the worker runs with: release after 2 s, hard deadline
/// at 4 s.
const BUDGET: Duration = Duration::from_secs(4);
/// What the issue allows on top of the budget.
const EXIT_SLACK: Duration = Duration::from_secs(1);
/// When the blocking handler writes its result, counted from its start:
/// after the release, and after the process should be gone.
const WRITE_AFTER: Duration = Duration::from_secs(7);

/// A stubborn worker running as a child process, and its stderr.
struct Stubborn {
    child: Child,
    stderr: Lines<BufReader<ChildStderr>>,
    seen: String,
}

impl Stubborn {
    async fn start(env: &Env, mode: &str) -> Stubborn {
        let binary = tokio::task::spawn_blocking(|| example_binary("stubborn"))
            .await
            .unwrap()
            .expect("the stubborn worker binary (built if missing)");
        let mut child = start_worker(
            Command::new(binary)
                .env_clear()
                .env(
                    "AZURE_STORAGE_CONNECTION_STRING",
                    env.azurite.connection_string(),
                )
                .env("SPOT_WORKER_QUEUE", &env.queue_name)
                .env("SPOT_WORKER_RESULTS_CONTAINER", env.results.name())
                .env("SPOT_WORKER_IMDS_ENDPOINT", env.emulator.url())
                .env("SPOT_WORKER_VM_NAME", VM_A)
                .env("SPOT_WORKER_IMDS_POLL_INTERVAL", "250ms")
                .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
                .env("SPOT_WORKER_CONCURRENCY", "1")
                .env("SPOT_WORKER_DRAIN_BUDGET", "4s")
                .env("STUBBORN_HANDLER", mode)
                .env(
                    "STUBBORN_WRITE_AFTER_MS",
                    WRITE_AFTER.as_millis().to_string(),
                )
                .env("RUST_LOG", "info"),
            Stdio::null(),
        );
        let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        Stubborn {
            child,
            stderr,
            seen: String::new(),
        }
    }

    /// Reads stderr until a line contains `wanted`.
    async fn wait_for_line(&mut self, wanted: &str) {
        let found = tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = self.stderr.next_line().await {
                self.seen.push_str(&line);
                self.seen.push('\n');
                if line.contains(wanted) {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "no line with {wanted:?}:\n{}",
            self.seen
        );
    }

    fn sigterm(&self) {
        let pid = self.child.id().expect("the worker is running") as libc::pid_t;
        // SAFETY: signalling the child we started and still own.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    }

    /// Waits for the exit (bounded), keeping the rest of stderr.
    async fn exit(mut self) -> (ExitStatus, String) {
        let status = within("the worker to exit", self.child.wait())
            .await
            .unwrap();
        while let Ok(Some(line)) = self.stderr.next_line().await {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        (status, self.seen)
    }
}

/// The message is visible again now, not after a visibility timeout.
async fn assert_visible_at_once(env: &Env, logs: &str) {
    let back = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(back.len(), 1, "the message is back on the queue:\n{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_worker_whose_blocking_handler_ignores_it() {
    let env = Env::start().await;
    let id = env.queue.send("stubborn", Duration::ZERO).await.unwrap();
    let mut worker = Stubborn::start(&env, "blocking").await;
    worker.wait_for_line("stubborn handler started").await;
    let handler_started = Instant::now();

    worker.sigterm();
    let signalled = Instant::now();
    let (status, logs) = worker.exit().await;
    let took = signalled.elapsed();
    eprintln!("exited {took:?} after SIGTERM ({status})");

    assert!(
        took <= BUDGET + EXIT_SLACK,
        "exited {took:?} after SIGTERM:\n{logs}"
    );
    assert_eq!(status.code(), Some(0), "{status}:\n{logs}");
    assert_visible_at_once(&env, &logs).await;
    // Past the handler's own write time: nothing was written.
    tokio::time::sleep_until(handler_started + WRITE_AFTER + Duration::from_secs(2)).await;
    let result = env.results.get(&format!("{id}.json")).await.unwrap();
    assert_eq!(result, None, "the abandoned handler wrote:\n{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempt_notice_ends_a_worker_whose_handler_never_yields() {
    let env = Env::start().await;
    env.queue.send("stubborn", Duration::ZERO).await.unwrap();
    let mut worker = Stubborn::start(&env, "never_yields").await;
    worker.wait_for_line("stubborn handler started").await;

    env.emulator.schedule(EventSpec::preempt()).unwrap();
    let scheduled = Instant::now();
    let (status, logs) = worker.exit().await;
    let took = scheduled.elapsed();
    eprintln!("exited {took:?} after the notice was scheduled ({status})");

    // The worker sees the notice at its next poll (every 250 ms).
    let poll = Duration::from_millis(250);
    assert!(
        took <= BUDGET + EXIT_SLACK + poll,
        "exited {took:?} after the notice:\n{logs}"
    );
    assert_eq!(status.code(), Some(0), "{status}:\n{logs}");
    assert_visible_at_once(&env, &logs).await;
}
