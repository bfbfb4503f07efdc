//! A checkpoint directory no save can store fails its job at the first
//! look, loudly, with a reason that names the limit or the path: not at
//! the program's exit, and never by saving nothing in silence.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_command::CommandHandler;
use spot_worker_testkit::worker::Env;

/// Runs `script`, which leaves what no save can store and then waits a
/// minute; returns the poison record's reason (one counted failure).
async fn reason_of(script: &str) -> String {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let handler = CommandHandler::new(sh(script), env.results.clone());
    let record = poisoned_by(&env, 1, handler).await;
    assert_eq!(record.failures, 1, "a counted failure");
    record.last_error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_directory_over_the_entry_cap_fails_while_the_program_runs() {
    // Made beside, then moved in whole: one look sees all of it.
    let reason = reason_of(
        "cd \"$SPOT_WORKER_WORK_DIR\" && mkdir many && cd many && seq 0 10000 | xargs touch && \
         mv \"$SPOT_WORKER_WORK_DIR/many\" \"$SPOT_WORKER_CHECKPOINT_DIR/\" && exec sleep 60",
    )
    .await;
    assert!(
        reason.contains("more than 10000 files and directories"),
        "{reason}"
    );
    // Killed for it at a look, not found once the program exited.
    assert!(!reason.contains("exited 0"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_is_not_utf8_fails_while_the_program_runs_and_is_named() {
    let reason = reason_of(
        "printf 1 > \"$SPOT_WORKER_CHECKPOINT_DIR/step\" && \
         printf x > \"$SPOT_WORKER_CHECKPOINT_DIR/$(printf 'caf\\351')\" && exec sleep 60",
    )
    .await;
    assert!(reason.contains(r"/caf\xe9 is not UTF-8 text"), "{reason}");
    assert!(!reason.contains("exited 0"), "{reason}");
}
