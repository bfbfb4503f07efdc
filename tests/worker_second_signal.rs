//! A second SIGTERM (or SIGINT) while draining skips the handlers' wind-down:
//! what is in flight is released at once and the worker returns, instead of
//! waiting out the drain budget for a handler that will not stop.
//!
//! A binary of its own: the test sends signals to its own process.

mod common;

use std::time::Duration;

use common::stubborn_handler;
use spot_worker::runtime::DrainTrigger;
use spot_worker_testkit::worker::*;

fn sigterm() {
    // SAFETY: signalling our own process; the worker has a handler for it.
    let sent = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    assert_eq!(sent, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_releases_at_once() {
    let env = Env::start().await;
    env.queue.send("stubborn", Duration::ZERO).await.unwrap();
    let mut config = env.config(VM_A);
    config.drain.handle_signals = true;
    // Without the second signal, the handler would hold the drain for 17 s.
    config.drain.drain_budget = Duration::from_secs(20);
    let (started, handler) = stubborn_handler();
    let worker = env.worker(config);
    let mut readiness = worker.readiness();
    let running = tokio::spawn(worker.run(handler));
    within("the handler to start", started.notified()).await;

    sigterm();
    within(
        "the drain to start",
        readiness.wait_for(|r| r.shutting_down.is_some()),
    )
    .await
    .unwrap();
    let again = tokio::time::Instant::now();
    sigterm();
    let report = within("the drain", running).await.unwrap().unwrap();
    let took = again.elapsed();

    assert_eq!(report.drain.trigger, DrainTrigger::Signal("SIGTERM"));
    assert!(report.drain.released_running_handlers);
    assert_eq!(report.stats.released, 1);
    assert!(
        took < Duration::from_secs(8),
        "returned {took:?} after the second signal"
    );
    let back = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(back.len(), 1, "the message is back on the queue");
}
