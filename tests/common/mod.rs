//! Set-ups the root package's tests share, built once into `tests/it` and
//! into each test binary of its own that needs them (`#[path]`): starting a
//! worker process as the tests watch it, a handler that never stops, and a
//! primes job sent as an operator sends one, and a second worker resuming
//! the job a first one left.

#![allow(dead_code)] // Not every binary uses every helper.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use spot_worker::storage::{HandlerError, Job, MessageHandler, MessageQueue, handler_fn};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::worker::{Env, VM_B, within};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// Starts the worker `command` with no input, its stderr piped to the test
/// and its stdout as `stdout` says (`Stdio::piped()` to read it too), killed
/// if the test drops it before it exits.
pub fn start_worker(command: &mut Command, stdout: Stdio) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the worker starts")
}

/// A handler that never returns and never looks at its cancellation token,
/// and the notice it gives once it has started: only a release (the drain's
/// cut-off, or a second signal) frees its message.
pub fn stubborn_handler() -> (Arc<Notify>, impl MessageHandler) {
    let started = Arc::new(Notify::new());
    let handler = handler_fn({
        let started = started.clone();
        move |_job: Job| {
            let started = started.clone();
            async move {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    (started, handler)
}

/// Sends the primes job `job_id` (the primes below `end`) to `queue`,
/// visible at once, as `spot-worker enqueue` would; returns it, to check
/// its result against.
pub async fn enqueue_primes(queue: &impl MessageQueue, job_id: &str, end: u64) -> PrimesJob {
    let job = PrimesJob::new(job_id, 0, end).expect("a valid primes job");
    queue
        .send(&job.to_message(), Duration::ZERO)
        .await
        .expect("the job is sent");
    job
}

/// Worker B, on another VM than the first, takes `job` (released by the
/// first worker's drain) at once, finishes it with the right result and
/// stops; returns the cursor it resumed from (its first progress), for the
/// caller to compare with the first worker's checkpoint.
pub async fn another_worker_resumes(env: &Env, job: &PrimesJob) -> u64 {
    let b = env.primes_worker(VM_B);
    let progress = b.progress.clone();
    let stop = b.worker.shutdown_token();
    let running = tokio::spawn(b.worker.run(b.handler));
    let result = within("the result", env.result(&job.job_id)).await;
    stop.cancel();
    within("worker B to stop", running).await.unwrap().unwrap();
    assert_eq!(result, spot_worker_primes::expected_result(job));
    progress.first_cursor(&job.job_id).expect("B made progress")
}
