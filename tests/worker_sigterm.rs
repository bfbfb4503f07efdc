//! SIGTERM (what systemd sends on stop, and what a scale-in without
//! Scheduled Events looks like) drains like an eviction notice: the handler
//! checkpoints, the message is released, another worker resumes.
//!
//! A binary of its own: the test sends SIGTERM to its own process.

mod common;

use common::another_worker_resumes;
use spot_worker::runtime::DrainTrigger;
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::worker::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_another_worker_resumes() {
    let env = Env::start().await;
    let job = PrimesJob::new("j1", 0, 100_000_000).unwrap();
    env.enqueue(&job).await;

    let mut a = env.primes_worker(VM_A);
    let mut config = env.config(VM_A);
    config.drain.handle_signals = true;
    a.worker = env.worker(config);
    let progress = a.progress.clone();
    let running = tokio::spawn(a.worker.run(a.handler));
    // The handlers are installed before the gate opens, and work only starts
    // after it: progress means SIGTERM is caught, not fatal.
    within("a third of the job", progress.reached("j1", 33_000_000)).await;
    // SAFETY: signalling our own process; the worker has a handler for it.
    let sent = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    assert_eq!(sent, 0);
    let report = within("the drain", running).await.unwrap().unwrap();

    assert_eq!(report.drain.trigger, DrainTrigger::Signal("SIGTERM"));
    assert!(report.drain.met_deadline);
    assert!(!report.drain.approved_event, "no event to approve");
    assert_eq!(report.stats.released, 1);
    let stopped_at = env.checkpoint_cursor("j1").await.expect("progress saved");

    assert!(another_worker_resumes(&env, &job).await >= stopped_at);
    env.assert_queues_empty().await;
}
