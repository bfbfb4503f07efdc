//! A FIFO at the checkpoint path (a program's mistake, or its attempt to
//! block the runner): the runner never opens it for reading in a way that
//! blocks, says once why it is not saved, and the drain stops the program
//! on time.

mod common;

use std::time::Duration;

use common::*;
use spot_worker_command::CommandHandler;
use spot_worker_testkit::worker::{Env, VM_A, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_checkpoint_path_is_passed_over_once_and_the_program_stopped_on_time() {
    let captured = Captured::install_from(tracing::Level::WARN);
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (made, stopped) = (dir.path().join("made"), dir.path().join("stopped"));
    env.queue.send("fifo", Duration::ZERO).await.unwrap();
    let script = format!(
        "trap 'touch {stopped}; exit 143' TERM; mkfifo \"$SPOT_WORKER_CHECKPOINT\"; touch {made}; \
         while :; do sleep 0.02; done",
        stopped = quoted(&stopped),
        made = quoted(&made),
    );
    let handler = CommandHandler::new(sh(&script), env.results.clone());
    let worker = env.worker(env.config(VM_A));
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    let appeared = async {
        while !made.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within("the FIFO", appeared).await;
    stop.cancel();
    let report = within("the drain", running).await.unwrap().unwrap();

    assert!(stopped.exists(), "the program got its stop signal");
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        !report.drain.released_running_handlers,
        "it stopped on SIGTERM"
    );
    assert!(
        report.drain.notice_to_drained < Duration::from_secs(5),
        "drained in {:?}",
        report.drain.notice_to_drained
    );
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    let warnings: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|line| line.contains("FIFO"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning: {warnings:#?}");
    assert!(
        warnings[0].contains("not a regular file"),
        "{}",
        warnings[0]
    );
}
