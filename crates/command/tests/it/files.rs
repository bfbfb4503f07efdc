//! The checkpoint file and process hygiene with real programs on a real
//! Azurite: a file replaced while it is saved is never saved half, a file
//! over the limit is a clear error, and nothing a program started outlives
//! its delivery.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandHandler, from_progress};
use spot_worker_storage::Checkpoint;
use spot_worker_testkit::store_layer::{KeepWrites, Layered};
use spot_worker_testkit::worker::{Env, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_file_replaced_while_being_saved_is_never_saved_half() {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // Replaces the file as fast as it can for 3 s, each version a
    // different size (up to about 45 KiB, kept in the checkpoint document
    // itself, so every save can be read back here) of one repeated line.
    let program = r#"
import os, time
path = os.environ["SPOT_WORKER_CHECKPOINT"]
until = time.monotonic() + 3
i = 0
while time.monotonic() < until:
    i += 1
    with open(path + ".tmp", "w") as f:
        f.write(("%08d\n" % i) * (1000 + (i * 7919) % 4000))
    os.replace(path + ".tmp", path)
"#;
    let config = spot_worker_command::CommandConfig::new("python3", ["-c", program])
        .with_checkpoint_every(Duration::from_millis(10));
    let handler = Observed::new(CommandHandler::new(config, env.results.clone()));
    // Keeps a copy of every checkpoint written.
    let recording = Arc::new(Layered::wrap(env.checkpoints.clone(), KeepWrites::new()));
    one_job_saving_to(&env, &handler, recording.clone()).await;

    let written = recording.policy().written();
    let saved: Vec<Vec<u8>> = written
        .iter()
        .filter_map(|checkpoint| match checkpoint {
            Checkpoint::InProgress { progress } => Some(from_progress(progress).unwrap()),
            Checkpoint::Completed { .. } => None,
        })
        .collect();
    assert!(saved.len() >= 5, "only {} saves", saved.len());
    for bytes in &saved {
        let text = std::str::from_utf8(bytes).unwrap();
        let first = &text[..9];
        assert!(
            text.len().is_multiple_of(9)
                && text.len() >= 9000
                && text
                    .as_bytes()
                    .chunks(9)
                    .all(|line| line == first.as_bytes()),
            "a save of {} bytes is not one whole version of the file",
            bytes.len()
        );
    }
    assert!(matches!(written.last(), Some(Checkpoint::Completed { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_file_over_the_limit_is_a_clear_error() {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let config = sh("head -c 2048 /dev/zero > \"$SPOT_WORKER_CHECKPOINT\"; exec sleep 60")
        .with_checkpoint_max_bytes(1024);
    let handler = CommandHandler::new(config, env.results.clone());
    // Well before the program's 60 s: it is stopped at the next save.
    let record = poisoned_by(&env, 1, handler).await;
    assert_error_has(
        &record,
        "the checkpoint is 2048 bytes, over the limit of 1024 bytes",
    );
    assert_eq!(record.failures, 1, "a counted failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_program_leaves_running_is_gone_when_its_delivery_ends() {
    spot_worker_command::become_subreaper().unwrap();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (child, orphan) = (dir.path().join("child"), dir.path().join("orphan"));
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // A background child, and an orphan whose parent (a subshell) is gone
    // before the program exits 0.
    let script = format!(
        "sleep 300 & echo $! > {child}; (sleep 300 & echo $! > {orphan}); exit 0",
        child = quoted(&child),
        orphan = quoted(&orphan)
    );
    let handler = Observed::new(shell(&env, &script));
    let running = Running::start(consumer(&env, 5), handler.clone());
    handler.finished(1).await;
    for file in [&child, &orphan] {
        let pid: u32 = std::fs::read_to_string(file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            !process_exists(pid),
            "{} ({pid}) outlived the delivery (or was not reaped)",
            file.display()
        );
    }
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_that_left_the_group_is_reaped_when_it_exits() {
    spot_worker_command::become_subreaper().unwrap();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let escaped = dir.path().join("escaped");
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // A process in a session of its own, which the group kill cannot
    // reach; it exits by itself a little later. The program waits until
    // it has left the group (else the group kill may still catch it).
    let script = format!(
        "setsid sh -c 'echo $$ > {escaped}.tmp; mv {escaped}.tmp {escaped}; exec sleep 0.5' & \
         i=0; while [ ! -f {escaped} ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; exit 0",
        escaped = dir.path().join("escaped").display()
    );
    let handler = Observed::new(shell(&env, &script));
    let running = Running::start(consumer(&env, 5), handler.clone());
    handler.finished(1).await;
    let pid: u32 = std::fs::read_to_string(&escaped)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut reaped = 0;
    for _ in 0..100 {
        reaped += spot_worker_command::reap_orphans();
        if !process_exists(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!process_exists(pid), "{pid} is left as a zombie");
    assert_eq!(reaped, 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_save_follows_the_files_first_appearance() {
    let (env, _dir, go) = job_queued(r#"{"job_id":"first"}"#, "go").await;
    // The file appears a moment after the start, then the program waits
    // for the test; saves are 10 minutes apart.
    let script = format!(
        "sleep 0.2; echo 3 > \"$SPOT_WORKER_CHECKPOINT.tmp\"; \
         mv \"$SPOT_WORKER_CHECKPOINT.tmp\" \"$SPOT_WORKER_CHECKPOINT\"; \
         i=0; while [ ! -f {go} ] && [ $i -lt 6000 ]; do sleep 0.02; i=$((i+1)); done; exit 0",
        go = quoted(&go)
    );
    let config = sh(&script)
        .with_job_key("job_id")
        .with_checkpoint_every(Duration::from_secs(600));
    let handler = Observed::new(CommandHandler::new(config, env.results.clone()));
    let running = Running::start(consumer(&env, 5), handler.clone());
    let saved = async {
        loop {
            if let Some(stored) = env.checkpoints.read("first").await.unwrap() {
                return stored.checkpoint;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let saved = within("the first save", saved).await;
    let Checkpoint::InProgress { progress } = saved else {
        panic!("{saved:?}");
    };
    assert_eq!(from_progress(&progress).unwrap(), b"3\n");
    std::fs::write(&go, b"").unwrap();
    handler.finished(1).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_file_over_the_limit_on_exit_0_is_a_counted_failure() {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // Written just before a clean exit: no periodic save sees it.
    let config = sh("echo partial > \"$SPOT_WORKER_RESULT\"; \
         head -c 2048 /dev/zero > \"$SPOT_WORKER_CHECKPOINT\"; exit 0")
    .with_checkpoint_every(Duration::from_secs(600))
    .with_checkpoint_max_bytes(1024);
    let handler = CommandHandler::new(config, env.results.clone());
    let record = poisoned_by(&env, 1, handler).await;
    assert_error_has(
        &record,
        "the program exited 0, but the checkpoint is 2048 bytes, over the limit of 1024 bytes",
    );
    assert_eq!(record.failures, 1, "a counted failure");
    assert!(
        env.results
            .get(&record.original_id)
            .await
            .unwrap()
            .is_none(),
        "no result stored"
    );
}
