//! A checkpoint file the program rewrites in place instead of renaming a
//! new file over it: its birth is an older version's, so its age is not
//! its write (save_cost.rs: it costs the job no write the runner can
//! see), and nothing is said "not measured" about it. A real program on a
//! real Azurite; alone in its test binary, because it installs the log
//! subscriber for the whole process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource};
use spot_worker_testkit::worker::{Env, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_place_costs_no_write_and_is_not_said_unmeasured() {
    let captured = Captured::install();
    assert_birth_times_recorded();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    // The first version renamed over the file, the second written into
    // the same file; then a failure, so that the runner's last save takes
    // the second.
    let script = format!(
        r#"printf one > "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"
i=0; while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
printf two > "$SPOT_WORKER_CHECKPOINT"; exit 3"#,
        go = quoted(&go),
    );
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(3600),
    )));
    let consumer = consumer(&env, 1).with_cadence(cadence.clone());
    let running = Running::start(consumer, shell(&env, &script));
    within("the runner's save of the first version", async {
        while cadence.view().cost.saves == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    std::fs::write(&go, b"").unwrap();
    within("the poison record", poisoned(&env)).await;
    running.stop().await;
    assert_eq!(cadence.view().cost.saves, 2, "{:?}", cadence.view().cost);
    let said: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|line| line.contains("is not measured"))
        .collect();
    assert!(said.is_empty(), "{said:#?}");
}
