//! The `spot-worker` binary as an operator uses it, against the emulator.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use spot_worker_imds_emulator::{EventSpec, Fault, RunningEmulator};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const VM: &str = "spotvmss_0";
/// Bound on any one command: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(30);

async fn emulator() -> RunningEmulator {
    crate::support::imds_of(VM).await
}

fn spot_worker(endpoint: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
    command
        .env("SPOT_WORKER_IMDS_ENDPOINT", endpoint)
        .env_remove("RUST_LOG")
        .env_remove("SPOT_WORKER_VM_NAME")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run(command: &mut Command) -> Output {
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the command finishes in time")
        .expect("the binary runs");
    Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Errors are one line on stderr, a non-zero exit and never a panic.
fn assert_clean_failure(output: &Output, expected: &str) {
    assert_eq!(output.code, Some(1), "{}", output.stderr);
    let lines: Vec<&str> = output.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {:?}", output.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(lines[0].contains(expected), "{}", lines[0]);
    assert!(!output.stderr.contains("panicked"));
}

#[tokio::test]
async fn events_prints_the_document() {
    let emulator = emulator().await;
    let event = emulator.schedule(EventSpec::preempt()).unwrap();

    let json = run(spot_worker(&emulator.url()).args(["events", "--json"])).await;
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let document: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(document["DocumentIncarnation"], 2);
    assert_eq!(document["Events"][0]["EventId"], event.id.as_str());

    let summary = run(spot_worker(&emulator.url()).arg("events")).await;
    assert_eq!(summary.code, Some(0), "{}", summary.stderr);
    let lines: Vec<&str> = summary.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("DocumentIncarnation 2: 1 event(s), this VM is {VM}")
    );
    assert!(
        lines[1].starts_with(&format!("* {} Preempt", event.id)),
        "{}",
        lines[1]
    );
}

#[tokio::test]
async fn watch_streams_json_lines_until_the_notice() {
    let emulator = emulator().await;
    let other = emulator
        .schedule(EventSpec::freeze().resources(["spotvmss_1"]))
        .unwrap();
    let preempt = emulator.schedule(EventSpec::preempt()).unwrap();

    let output = run(spot_worker(&emulator.url()).args([
        "events",
        "watch",
        "--json",
        "--interval",
        "200ms",
        "--until-notice",
    ]))
    .await;
    assert_eq!(output.code, Some(0), "{}", output.stderr);
    let lines: Vec<Value> = output
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", output.stdout);
    assert_eq!(lines[0]["event_id"], other.id.as_str());
    assert_eq!(lines[0]["concerns_this_vm"], false);
    let notice = &lines[1];
    assert_eq!(notice["transition"], "scheduled");
    assert_eq!(notice["event_id"], preempt.id.as_str());
    assert_eq!(notice["event_type"], "Preempt");
    assert_eq!(notice["event_status"], "Scheduled");
    assert_eq!(notice["resources"], serde_json::json!([VM]));
    assert_eq!(notice["concerns_this_vm"], true);
    assert_eq!(notice["incarnation"], 3);
    let not_before = notice["not_before"].as_str().expect("RFC 3339 text");
    time::OffsetDateTime::parse(not_before, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
}

#[tokio::test]
async fn approve_approves_this_vms_event_and_refuses_others() {
    let emulator = emulator().await;
    let mine = emulator.schedule(EventSpec::reboot()).unwrap();
    let theirs = emulator
        .schedule(EventSpec::reboot().resources(["spotvmss_1"]))
        .unwrap();

    let approved = run(spot_worker(&emulator.url()).args(["events", "approve", &mine.id])).await;
    assert_eq!(approved.code, Some(0), "{}", approved.stderr);
    assert_eq!(approved.stdout.trim(), format!("approved {}", mine.id));
    assert_eq!(emulator.approvals().len(), 1);

    let again = run(spot_worker(&emulator.url()).args(["events", "approve", &mine.id])).await;
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(again.stdout.contains("already started"));

    let refused = run(spot_worker(&emulator.url()).args(["events", "approve", &theirs.id])).await;
    assert_clean_failure(&refused, "refusing to approve");
    assert_eq!(emulator.approvals().len(), 1, "nothing sent for another VM");

    let forced =
        run(spot_worker(&emulator.url()).args(["events", "approve", &theirs.id, "--any-vm"])).await;
    assert_eq!(forced.code, Some(0), "{}", forced.stderr);
}

#[tokio::test]
async fn errors_are_one_clear_line() {
    let unreachable = run(spot_worker("http://127.0.0.1:9").arg("events")).await;
    assert_clean_failure(&unreachable, "reading Scheduled Events");

    let bad_endpoint = run(spot_worker("169.254.169.254").arg("events")).await;
    assert_clean_failure(&bad_endpoint, "invalid IMDS endpoint");

    let emulator = emulator().await;
    let unknown = run(spot_worker(&emulator.url()).args(["events", "approve", "NOPE"])).await;
    assert_clean_failure(
        &unknown,
        "event NOPE is not in the current Scheduled Events document",
    );
}

#[tokio::test]
async fn imds_emulator_serves_until_stopped() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spot-worker"))
        .args([
            "imds-emulator",
            "--listen",
            "127.0.0.1:0",
            "--vm-name",
            "pool_3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let url = tokio::time::timeout(PATIENCE, BufReader::new(stdout).lines().next_line())
        .await
        .expect("the URL is printed in time")
        .unwrap()
        .expect("a first line");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let instance: Value = http
        .get(format!("{url}/metadata/instance?api-version=2021-02-01"))
        .header("Metadata", "true")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(instance["compute"]["name"], "pool_3");

    // And the CLI reads it like a real IMDS.
    let events = run(spot_worker(&url).arg("events")).await;
    assert_eq!(events.code, Some(0), "{}", events.stderr);
    assert!(
        events
            .stdout
            .starts_with("DocumentIncarnation 1: 0 event(s), this VM is pool_3")
    );

    child.start_kill().unwrap();
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn imds_emulator_reports_a_busy_port() {
    let emulator = emulator().await;
    let output = run(Command::new(env!("CARGO_BIN_EXE_spot-worker")).args([
        "imds-emulator",
        "--listen",
        &emulator.addr().to_string(),
    ]))
    .await;
    assert_clean_failure(&output, "listening on");
}

#[tokio::test]
async fn a_closed_stdout_is_not_a_crash() {
    let emulator = emulator().await;
    emulator.schedule(EventSpec::preempt()).unwrap();
    let mut child = spot_worker(&emulator.url())
        .args(["events", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the reading end before the command writes: `spot-worker ... | head -0`.
    drop(child.stdout.take());
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn events_json_is_the_body_imds_sent() {
    let emulator = emulator().await;
    emulator.schedule(EventSpec::preempt()).unwrap();
    let output = run(spot_worker(&emulator.url()).args(["events", "--json"])).await;
    assert_eq!(output.code, Some(0), "{}", output.stderr);
    let printed: Value = serde_json::from_str(&output.stdout).unwrap();
    assert_eq!(printed, emulator.document());
    assert!(
        output
            .stdout
            .contains("\"ResourceType\":\"VirtualMachine\"")
    );
}

/// Every subcommand logs through one set-up: into a pipe (or a file, a
/// journal) the lines carry no ANSI colour codes, whether `NO_COLOR` is
/// set or not; only a terminal gets colours. `events watch` wrote them
/// (`^[[2m`) while `run` did not.
#[tokio::test]
async fn logs_into_a_pipe_have_no_colour_codes() {
    let emulator = emulator().await;
    // Two malformed answers: the watcher warns, then sees the notice.
    emulator.inject_faults(Fault::Malformed, 2);
    emulator.schedule(EventSpec::preempt()).unwrap();
    let watch = run(spot_worker(&emulator.url()).env_remove("NO_COLOR").args([
        "events",
        "watch",
        "--interval",
        "200ms",
        "--until-notice",
    ]))
    .await;
    assert_eq!(watch.code, Some(0), "{}", watch.stderr);
    assert!(
        watch.stderr.contains("WARN"),
        "a warning was logged: {}",
        watch.stderr
    );
    assert!(!watch.stderr.contains('\x1b'), "{:?}", watch.stderr);

    // `run` sets its logs up from the settings: the same layer.
    let worker = run(spot_worker(&emulator.url())
        .env_remove("NO_COLOR")
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
        .args(["run", "--", "true"]))
    .await;
    assert_eq!(worker.code, Some(1), "{}", worker.stderr);
    assert!(worker.stderr.contains("INFO"), "{}", worker.stderr);
    assert!(!worker.stderr.contains('\x1b'), "{:?}", worker.stderr);
    // And its error says its cause once.
    assert_eq!(
        worker.stderr.matches("no storage configured").count(),
        1,
        "{}",
        worker.stderr
    );
}

#[tokio::test]
async fn watch_policy_flags_change_what_counts_as_a_notice() {
    let emulator = emulator().await;
    let reboot = emulator.schedule(EventSpec::reboot()).unwrap();
    let freeze = emulator.schedule(EventSpec::freeze()).unwrap();
    // Reboot ignored, every Freeze drains: the 5 s Freeze is the notice.
    let output = run(spot_worker(&emulator.url()).args([
        "events",
        "watch",
        "--json",
        "--interval",
        "250ms",
        "--until-notice",
        "--ignore",
        "Reboot",
        "--freeze-threshold",
        "0s",
    ]))
    .await;
    assert_eq!(output.code, Some(0), "{}", output.stderr);
    let ids: Vec<String> = output
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids, [reboot.id, freeze.id]);
}

/// Bound on a whole demo run: a few seconds of counting in a debug build,
/// more on a loaded CI machine, never a hang.
const DEMO_PATIENCE: Duration = Duration::from_secs(120);

/// `spot-worker demo` with small jobs (about a second each in a debug build).
async fn demo(extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
    command
        .args([
            "demo",
            "--jobs",
            "2",
            "--size",
            "40_000_000",
            "--chunk-size",
            "1_000_000",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(DEMO_PATIENCE, command.output())
        .await
        .expect("the demo finishes in time")
        .expect("the binary runs");
    Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The summary of a successful demo: every check holds, and nothing but the
/// demo's own output was printed.
fn assert_demo_succeeded(output: &Output) {
    assert_eq!(output.code, Some(0), "{}\n{}", output.stdout, output.stderr);
    assert!(output.stderr.is_empty(), "{}", output.stderr);
    let lines: Vec<&str> = output.stdout.lines().map(str::trim).collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    for expected in [
        "IMDS emulator (plays Azure's Scheduled Events): http://127.0.0.1:",
        ">>> ",
        "A saw the notice ",
        "event approved after the drain: yes",
        "every job has its result",
        "jobs done 2/2",
        "results verified 2/2",
        "lost 0 (0 messages left in the queue, 0 in the poison queue)",
        "duplicates 0",
        "drain ",
        "B resumed every job where its checkpoint was",
        "work redone after the eviction ",
        "wall time ",
    ] {
        assert!(
            has(expected),
            "no line starting {expected:?} in:\n{}",
            output.stdout
        );
    }
    assert!(!output.stdout.contains("FAILED"), "{}", output.stdout);
}

#[tokio::test]
async fn demo_evicts_a_worker_and_a_second_one_finishes_the_jobs() {
    let output = demo(&[]).await;
    assert_demo_succeeded(&output);
    assert!(
        output.stdout.contains("storage: in memory"),
        "{}",
        output.stdout
    );
}

#[tokio::test]
async fn demo_runs_on_azurite() {
    let output = demo(&["--azurite"]).await;
    assert_demo_succeeded(&output);
    assert!(
        output.stdout.contains("storage: Azurite"),
        "{}",
        output.stdout
    );
}

#[tokio::test]
async fn demo_without_azurite_installed_says_how_to_install_it() {
    let output = run(Command::new(env!("CARGO_BIN_EXE_spot-worker"))
        .args(["demo", "--azurite"])
        .env("AZURITE_BIN", "/nonexistent/azurite")
        .stdin(Stdio::null()))
    .await;
    assert_clean_failure(&output, "npm ci --prefix tools/azurite");
}

/// Every command of "Operating a fleet" (docs/operating.md), and each of
/// their subcommands, has `--help` with examples.
#[test]
fn every_operator_command_has_examples_in_its_help() {
    fn help(path: &[String]) -> String {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_spot-worker"))
            .args(path)
            .arg("--help")
            .output()
            .expect("the binary runs");
        assert!(output.status.success(), "{path:?} --help");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
    /// The subcommands a help lists under "Commands:", `help` left out.
    fn subcommands(help: &str) -> Vec<String> {
        help.lines()
            .skip_while(|line| *line != "Commands:")
            .skip(1)
            .take_while(|line| line.starts_with("  "))
            .filter(|line| !line.starts_with("   "))
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(str::to_owned)
            .collect()
    }
    let mut pending: Vec<Vec<String>> = ["enqueue", "status", "poison", "checkpoints", "results"]
        .iter()
        .map(|c| vec![(*c).to_owned()])
        .collect();
    let mut missing = Vec::new();
    let mut checked = 0;
    while let Some(path) = pending.pop() {
        let text = help(&path);
        checked += 1;
        if !["Examples:\n  spot-worker ", "Example:\n  spot-worker "]
            .iter()
            .any(|heading| text.contains(heading))
        {
            missing.push(path.join(" "));
        }
        for sub in subcommands(&text) {
            let mut next = path.clone();
            next.push(sub);
            pending.push(next);
        }
    }
    assert!(checked > 5, "only {checked} commands found");
    assert!(missing.is_empty(), "no examples in --help of: {missing:?}");
}
