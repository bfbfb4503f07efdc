//! The worked Optuna example of docs/command.md ("An Optuna study as a
//! job"), read from the page itself (one source), under the real
//! `spot-worker run` on Azurite with the IMDS emulator: evicted twice by
//! Preempt notices (on two VMs) and crashed once (the program SIGKILLed
//! mid-trial, as the OOM killer would) on a third, it finishes with
//! exactly `N_TRIALS` complete trials, none left RUNNING, and the best
//! value the grid has.
//!
//! Optuna comes from tools/python/.venv (pinned in
//! tools/python/requirements.txt, installed by scripts/test.sh); skipped
//! only when `SPOT_WORKER_PYTHON_INTEROP` is `0`, a missing venv is a
//! failure.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use spot_worker_imds_emulator::{EventSpec, RunningEmulator};
use support::PATIENCE;
use support::large::{Runner, World};

/// The job the test runs.
const JOB: &str = "study";

/// The fenced block of docs/command.md holding the example.
const BLOCK: &str = "```python optuna_job.py\n";

/// What the example's `N_TRIALS` is, read from the block.
fn n_trials(script: &str) -> u64 {
    script
        .lines()
        .find_map(|line| line.strip_prefix("N_TRIALS = "))
        .and_then(|n| n.trim().parse().ok())
        .expect("the example sets N_TRIALS")
}

/// The example, written to `into`: the page's block, byte for byte.
fn example(into: &Path) -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/command.md");
    let text = std::fs::read_to_string(page).unwrap();
    let start = text
        .find(BLOCK)
        .expect("docs/command.md has the Optuna block")
        + BLOCK.len();
    let end = start + text[start..].find("\n```\n").expect("the block ends");
    let script = format!("{}\n", &text[start..end]);
    std::fs::write(into, &script).unwrap();
    script
}

/// The program's processes: those whose command line is `python script`
/// (the runner's spawner, which also names them, is not one).
fn programs(python: &Path, script: &Path) -> Vec<i32> {
    let wanted = format!("{}\0{}\0", python.display(), script.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline == wanted.as_bytes())
        })
        .collect()
}

/// The checkpoint interval the running program was handed
/// (`SPOT_WORKER_CHECKPOINT_INTERVAL`, seconds), read from its
/// environment.
fn interval_handed(python: &Path, script: &Path) -> f64 {
    let pids = programs(python, script);
    assert_eq!(pids.len(), 1, "one program runs: {pids:?}");
    let environ = std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap();
    environ
        .split(|byte| *byte == 0)
        .find_map(|entry| entry.strip_prefix(b"SPOT_WORKER_CHECKPOINT_INTERVAL="))
        .and_then(|value| std::str::from_utf8(value).ok()?.parse().ok())
        .expect("the program has SPOT_WORKER_CHECKPOINT_INTERVAL")
}

/// The number logged as `name=` in `line`.
fn field(line: &str, name: &str) -> f64 {
    let at = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + name.len()
        + 2;
    line[at..]
        .split(|c: char| c.is_whitespace() || c == ',')
        .next()
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not a number in {line}"))
}

/// Below what a database charged its age (seconds, as before) gets: 5
/// minutes and more at the default eviction rate (0.05 an hour). A save
/// charged what its backup costs (tens of milliseconds; up to about half a
/// second when CI runs several suites at once on 2 cores) gets Daly's
/// √(2 · 0.5 s · 72,000 s) = 268 s at most, so the bound tells the two
/// apart without failing on a slow machine.
const MAX_INTERVAL_S: f64 = 290.0;

/// Waits (bounded) until `runner`'s log has a line with every one of
/// `parts` after `after` such lines; how many it has then.
async fn until_count(runner: &Runner, parts: &[&str], after: usize) -> usize {
    let started = std::time::Instant::now();
    loop {
        let count = runner.log.count(parts);
        if count > after {
            return count;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no new line with {parts:?}:\n{}",
            runner.log.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the program under `runner` has resumed (or started) and
/// is in the middle of a trial.
async fn mid_trial(runner: &Runner) {
    runner
        .log
        .wait_for(&["resuming with", "complete trials"])
        .await;
    let before = runner.log.count(&["x=", "started"]);
    until_count(runner, &["x=", "started"], before).await;
}

/// Evicts the runner on `vm` with a Preempt notice and waits for its exit.
async fn evict(vm: &RunningEmulator, mut runner: Runner) {
    vm.schedule(EventSpec::preempt()).unwrap();
    assert_eq!(runner.exit().await, Some(0), "{}", runner.log.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optuna_example_survives_two_evictions_and_a_crash_with_every_trial_complete() {
    let Some(python) = spot_worker_testkit::bench::python().unwrap() else {
        eprintln!("skipped: SPOT_WORKER_PYTHON_INTEROP turns the Python tests off");
        return;
    };
    let world = World::start().await;
    let script: PathBuf = world.path("optuna_job.py");
    let n_trials = n_trials(&example(&script));
    world.send(JOB).await;
    let third_vm = crate::support::imds_of("spotvmss_2").await;
    let command = [python.display().to_string(), script.display().to_string()];
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    // Default (adaptive) saves; a short lease so a crashed delivery's
    // message comes back within the test's patience.
    let settings = [("SPOT_WORKER_VISIBILITY_TIMEOUT", "5s")];
    let runner = |vm: &RunningEmulator| world.runner_of(vm, &[], &command, &[], &settings);

    let mut intervals = Vec::new();
    let a = runner(&world.emulator);
    mid_trial(&a).await;
    intervals.push(interval_handed(&python, &script));
    evict(&world.emulator, a).await;

    let b = runner(&world.other_vm);
    mid_trial(&b).await;
    intervals.push(interval_handed(&python, &script));
    evict(&world.other_vm, b).await;

    let mut c = runner(&third_vm);
    mid_trial(&c).await;
    intervals.push(interval_handed(&python, &script));
    let pids = programs(&python, &script);
    assert_eq!(pids.len(), 1, "one program runs: {pids:?}");
    // SAFETY: signals the program this test's runner started.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    // The crash counts as a failure; the same runner takes the job again
    // once its retry delay has passed, and the study finishes.
    let result = world.result(JOB, &c).await;
    c.signal(libc::SIGTERM);
    assert_eq!(c.exit().await, Some(0), "{}", c.log.text());

    let result: serde_json::Value = serde_json::from_slice(&result).unwrap();
    let log = c.log.text();
    assert!(
        c.log
            .line(&["the program ended", "was killed by SIGKILL"])
            .is_some(),
        "the crash is in the log:\n{log}"
    );
    assert_eq!(result["complete"], n_trials, "{result}");
    assert_eq!(result["running"], 0, "{result}");
    assert_eq!(result["best_value"], 0.5, "{result}");
    assert_eq!(result["best_x"], 7, "{result}");
    // The trials cut short were failed and run again, not lost or counted.
    assert!(result["failed"].as_u64().unwrap() >= 1, "{result}");
    // The interval handed to each delivery is Daly's for what a save of
    // a live database costs the job (tens of milliseconds: its backup),
    // not for the database's age.
    assert!(
        intervals.iter().all(|&interval| interval <= MAX_INTERVAL_S),
        "intervals handed {intervals:?} s"
    );
    // Where the job's time went, by the finishing delivery: saving a
    // database costs the program nothing it waits for, so checkpointing is
    // a small share (it was more than half, its age counted as a write).
    let finished = c
        .log
        .line(&["job finished: where its time went"])
        .unwrap_or_else(|| panic!("the job's goodput is logged:\n{log}"));
    let [useful, redone, checkpointing, waiting] =
        ["useful_s", "redone_s", "checkpointing_s", "waiting_s"].map(|name| field(&finished, name));
    let total = useful + redone + checkpointing + waiting;
    assert!(
        checkpointing <= 0.05 * total,
        "checkpointing {checkpointing} s of {total} s: {finished}"
    );
    // Three interruptions, each mid-trial: what each lost is at most the
    // trial cut short (OPTUNA_TRIAL_SECONDS, 0.5 s, since its start's
    // commit) and the runner's reaction, never more.
    assert!(redone <= 3.0 * (0.5 + 0.5), "redone {redone} s: {finished}");
    assert_eq!(field(&finished, "deliveries"), 4.0, "{finished}");
    eprintln!("result: {result}; intervals handed {intervals:?} s; {finished}");
}
