//! A checkpoint directory that never holds still, under the command
//! handler on a real Azurite: the program rewrites a file in place without
//! pause beside a ballast that makes every read of the directory take a
//! while, so no two passes of a read ever agree. The runner tries again
//! promptly and, after `REPORT_AFTER` tries in a row, says so once in the
//! log, naming the job and the directory, instead of leaving the job
//! silently with no version (or a stale one).

mod common;

use std::time::Duration;

use common::*;
use spot_worker_command::{CommandHandler, REPORT_AFTER};
use spot_worker_testkit::worker::{Env, VM_A, within};

const NEVER_STILL: &str = "the checkpoint never held still long enough";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_never_holds_still_is_reported_with_its_job_and_directory() {
    let log = Captured::install();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let stop_file = dir.path().join("stop");
    let script = restless_script(&stop_file);
    env.queue
        .send(r#"{"job_id":"restless"}"#, Duration::ZERO)
        .await
        .unwrap();
    let config = sh(&script).with_job_key("job_id");
    let worker = env.worker(env.config(VM_A));
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(CommandHandler::new(config, env.results.clone())));
    let warned = within("the warning that the directory never held still", async {
        loop {
            if let Some(line) = log.lines().into_iter().find(|l| l.contains(NEVER_STILL)) {
                break line;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // The program stops rewriting; the worker stops (a drain).
    std::fs::write(&stop_file, b"").unwrap();
    assert!(warned.contains("WARN"), "{warned}");
    assert!(warned.contains("job_key=restless"), "{warned}");
    assert!(warned.contains("/checkpoint.d"), "{warned}");
    assert!(
        warned.contains(&format!("tries={REPORT_AFTER}")),
        "{warned}"
    );
    assert!(warned.contains("SPOT_WORKER_CHECKPOINT_MARKER"), "{warned}");
    // Said once, however long it goes on.
    let said = log
        .lines()
        .iter()
        .filter(|l| l.contains(NEVER_STILL))
        .count();
    assert_eq!(said, 1);
    stop.cancel();
    within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
}
