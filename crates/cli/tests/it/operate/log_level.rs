//! `--help` states the default log levels, and they are the ones used:
//! `warn` for the operator's commands, `info` for `spot-worker run` (as
//! every worker: RUST_LOG's default in the settings table).

use std::process::Stdio;

use spot_worker_storage::MessageEncoding;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_help_states_the_default_log_levels_that_apply() {
    let azurite = start_azurite();
    deployed(&azurite).await;
    let cli = || spot_worker(&azurite, MessageEncoding::Text);
    let help = run(cli().arg("--help")).await;
    help.assert_success();
    let flat = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("[default: warn; error for `demo`, whose drain warnings are expected; info for `run`, as for every worker (RUST_LOG's default)]"),
        "{}",
        help.stdout
    );

    // An operator command logs nothing below warn by default.
    let (_dir, path) = input_file("{\"job_id\":\"a\"}\n");
    let enqueue = run(cli().arg("enqueue").arg(&path)).await;
    enqueue.assert_success();
    assert!(
        !enqueue.stderr.contains(" INFO ") && !enqueue.stderr.contains(" DEBUG "),
        "{}",
        enqueue.stderr
    );

    // `run` logs at info by default.
    let mut worker = cli()
        .args(["run", "--", "cat"])
        .env("SPOT_WORKER_IMDS", "off")
        .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spot-worker run starts");
    let mut lines = BufReader::new(worker.stderr.take().unwrap()).lines();
    let info = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("INFO") && line.contains("warmup gate open") {
                return true;
            }
        }
        false
    })
    .await;
    let status = stop_with_sigterm(&mut worker).await;
    assert_eq!(info, Ok(true), "no info line from `run` by default");
    assert_eq!(status.code(), Some(0));
}
