//! A notice never spends drain time on a version already saved: a
//! program that renamed its checkpoint file over the path once, and was
//! saved, is evicted by a real (emulated) IMDS notice; the runner's final
//! save reads none of the file again, and does not say the program
//! rewrote it in place (it renamed). A real program on a real Azurite;
//! alone in its test binary, because it installs the log subscriber for
//! the whole process and counts the bytes the process reads.

mod common;

use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_imds_emulator::EventSpec;
use spot_worker_testkit::worker::{Env, VM_A, within};

/// The checkpoint file's size: far more than the rest of the drain reads
/// (the store's answers, a few KiB), so a re-read cannot hide in it.
const FILE_BYTES: u64 = 32 * 1024 * 1024;

/// Bytes this process has read with `read`/`pread` so far (`rchar`).
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|line| line.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_save_of_the_version_saved_already_reads_nothing_and_warns_of_nothing() {
    let captured = Captured::install_from(tracing::Level::DEBUG);
    assert_birth_times_recorded();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("written");
    // One version, renamed over the path as the contract says; then the
    // program waits for the notice and exits on SIGTERM without writing.
    // Made without reading anything: what a reaped program read counts in
    // its reaper's `rchar`, and that is this process.
    let script = format!(
        r#"truncate -s {FILE_BYTES} "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"
touch {written}
trap 'exit 143' TERM
i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done"#,
        written = quoted(&written),
    );
    env.queue
        .send(r#"{"job_id":"f1"}"#, Duration::ZERO)
        .await
        .unwrap();
    // Default settings: the worker's interval, SIGTERM to stop.
    let handler = CommandHandler::new(
        CommandConfig::new("sh", ["-c", script.as_str()]).with_job_key("job_id"),
        env.results.clone(),
    );
    let a = env.worker(env.config(VM_A));
    let running = tokio::spawn(a.run(handler));
    // The runner saves a version as soon as it appears.
    within("the runner's save of the version", async {
        loop {
            if written.exists() && env.checkpoints.read("f1").await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let before = bytes_read();
    env.emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    let report = within("worker A to drain", running).await.unwrap().unwrap();
    let read = bytes_read() - before;
    let lines = captured.lines();
    let runner: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("spot_worker_command"))
        .collect();
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert_eq!(report.stats.released, 1, "{:?}", report.stats);
    assert!(
        read < FILE_BYTES / 4,
        "the drain read {read} bytes: the {FILE_BYTES}-byte version saved already was read again; the runner said {runner:#?}"
    );
    let in_place: Vec<&String> = lines.iter().filter(|l| l.contains("in place")).collect();
    assert!(in_place.is_empty(), "{in_place:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("the checkpoint is the version saved last")),
        "the final save did not say why it read nothing"
    );
}
