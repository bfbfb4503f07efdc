//! docs/develop-locally.md, followed step by step: its `job.py` and its
//! three commands (on free ports, so nothing else on the machine is in the
//! way), with what the page promises checked between them: the job makes
//! progress, `dev evict` reports the worker's approval, the worker is
//! started again and resumes from the checkpoint (`resuming at step N`,
//! N > 0), and the result is the one the job writes. The doc runner
//! (tests/it/docs.rs) runs the page as written, too.

use crate::docs::{blocks, session};

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use blocks::Kind;
use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::storage::ResultStore;

const SPOT_WORKER: &str = env!("CARGO_BIN_EXE_spot-worker");
const PATIENCE: Duration = Duration::from_secs(120);

/// The page's command with the address flags after `dev` (or after `dev
/// env` / `dev evict`, where they must follow the subcommand).
fn on_ports(command: &str, flags: &str) -> String {
    for sub in ["dev env", "dev evict"] {
        if let Some(rest) = command.strip_prefix(&format!("spot-worker {sub}")) {
            return format!("spot-worker {sub} {flags}{rest}");
        }
    }
    match command.strip_prefix("spot-worker dev") {
        Some(rest) => format!("spot-worker dev {flags}{rest}"),
        None => command.to_owned(),
    }
}

fn bash(dir: &Path, command: &str) -> Command {
    let bin = Path::new(SPOT_WORKER).parent().unwrap();
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
        // The scratch directory is outside the clone: its pinned Azurite.
        .env(
            "AZURITE_BIN",
            std::env::var_os("AZURITE_BIN").unwrap_or_else(|| {
                session::workspace_root()
                    .join("tools/azurite/node_modules/.bin/azurite")
                    .into()
            }),
        )
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("SPOT_WORKER_IMDS_ENDPOINT")
        .stdin(Stdio::null());
    bash
}

/// The blocks of docs/develop-locally.md.
fn page_blocks() -> Vec<blocks::Block> {
    let root = session::workspace_root();
    let page = std::fs::read_to_string(root.join("docs/develop-locally.md")).unwrap();
    blocks::parse(Path::new("docs/develop-locally.md"), &page).unwrap()
}

/// The page's `job.py`.
fn job_py(blocks: &[blocks::Block]) -> String {
    blocks
        .iter()
        .find(|b| b.kind == Kind::File("job.py".to_owned()))
        .expect("the page shows job.py")
        .text
        .clone()
}

/// Waits (bounded) for `job`'s result, the one `job.py` writes for 40
/// steps.
async fn expect_result(storage: &AzureStorage, job: &str, log: &Path) {
    let results = storage.result_store("results").unwrap();
    let deadline = Instant::now() + PATIENCE;
    let result = loop {
        if let Some(body) = results.get(job).await.unwrap_or(None) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no result; the log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&result).unwrap(),
        serde_json::json!({"job_id": job, "steps": 40})
    );
}

fn output(command: &mut Command) -> Output {
    command.output().expect("bash runs")
}

fn wait_for(what: &str, log: &Path, mut done: impl FnMut(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `spot-worker dev`, stopped (SIGTERM, then waited for) also when the
/// test fails half-way, so no Azurite or worker outlives it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }
}

fn stop(mut child: Child, log: &Path) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!(
                "spot-worker dev did not stop; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "spot-worker dev exited with {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_develop_locally_page_evicts_and_resumes_a_python_job() {
    let blocks = page_blocks();
    let job = job_py(&blocks);
    let three = blocks
        .iter()
        .find(|b| b.kind == Kind::Run)
        .expect("the page's three commands");
    let commands: Vec<&str> = three
        .text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(commands.len(), 3, "three commands: {commands:?}");
    assert!(commands[0].starts_with("cargo install"), "{}", commands[0]);
    let serve = commands[1]
        .trim()
        .strip_suffix('&')
        .expect("dev runs in the background")
        .trim();
    let evict = commands[2].trim();

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.py"), job).unwrap();
    let (first, _) = session::free_ports();
    let flags = format!(
        "--azurite-port {first} --imds-listen 127.0.0.1:{}",
        first + 3
    );
    let log = dir.path().join("dev.log");
    let log_file = std::fs::File::create(&log).unwrap();

    // 2. The environment, the job and the worker.
    let dev = bash(dir.path(), &format!("exec {}", on_ports(serve, &flags)))
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let mut dev = Running(Some(dev));
    let exports = String::from_utf8(
        output(&mut bash(
            dir.path(),
            &on_ports("spot-worker dev env --wait 90s", &flags),
        ))
        .stdout,
    )
    .unwrap();
    let connection_string = exports
        .lines()
        .find_map(|l| l.strip_prefix("export AZURE_STORAGE_CONNECTION_STRING='"))
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or_else(|| {
            panic!(
                "dev env prints the connection string; the log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })
        .to_owned();
    // The job makes progress before the eviction (its checkpoint is saved).
    let show = format!(
        "eval \"$({})\"; spot-worker checkpoints show j1",
        on_ports("spot-worker dev env", &flags)
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let shown = output(&mut bash(dir.path(), &show));
        if String::from_utf8_lossy(&shown.stdout).contains("in_progress") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no progress; the log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // 3. The eviction: drained and approved.
    let evicted = output(&mut bash(dir.path(), &on_ports(evict, &flags)));
    let said = String::from_utf8_lossy(&evicted.stdout).into_owned()
        + &String::from_utf8_lossy(&evicted.stderr);
    assert!(evicted.status.success(), "{said}");
    assert!(said.contains("approved by the worker"), "{said}");

    // Started again, it resumes from the checkpoint and finishes.
    let text = wait_for("the job to resume", &log, |text| {
        text.contains("resuming at step")
    });
    let step: u64 = text
        .split("resuming at step ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a step number");
    assert!(step > 0 && step < 40, "resumed at step {step}");
    assert!(text.contains("(start 2)"), "started again:\n{text}");
    let storage =
        AzureStorage::new(StorageConfig::from_connection_string(&connection_string).unwrap())
            .unwrap();
    expect_result(&storage, "j1", &log).await;
    stop(dev.0.take().expect("still running"), &log);
}

#[test]
fn dev_without_azurite_says_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = session::free_ports();
    let output = Command::new(SPOT_WORKER)
        .args(["dev", "--azurite-port", &first.to_string()])
        .args(["--imds-listen", &format!("127.0.0.1:{}", first + 3)])
        .current_dir(dir.path())
        .env("AZURITE_BIN", "")
        .env("PATH", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    for hint in [
        "npm install -g azurite",
        "mcr.microsoft.com/azure-storage/azurite",
        "npm ci --prefix tools/azurite",
    ] {
        assert!(stderr.contains(hint), "{hint}: {stderr}");
    }
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

/// `dev` restarts its worker as systemd does, except that it gives up on
/// one that fails 5 times in a row within 10 s of starting, with an error
/// (docs/develop-locally.md says so, and `dev --help`).
#[test]
fn dev_gives_up_on_a_worker_that_keeps_failing_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (first, imds) = session::free_ports();
    let command =
        format!("spot-worker dev --azurite-port {first} --imds-listen 127.0.0.1:{imds} -- false");
    let mut child = bash(dir.path(), &command)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("spot-worker dev kept restarting a worker that always fails");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("starting the worker of VM").count(),
        5,
        "{stderr}"
    );
    assert_eq!(stderr.matches("starting it again").count(), 4, "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("failed 5 times in a row within 10s"),
        "{stderr}"
    );
}

/// `dev`'s regular lane (docs/develop-locally.md, "A deadline on a
/// laptop"): a job with a deadline, evicted from the Spot VM once it saved
/// progress, with Spot capacity then away for longer than the deadline
/// allows. The job goes to the regular lane (at its release, or by the
/// lane keeper of the regular VM booted when the Spot VM went), the
/// regular VM's worker (the same command, `SPOT_WORKER_LANE=regular`)
/// finishes it, and the completion record says the deadline was met in the
/// regular lane; the Spot VM's worker is not started again meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_falls_back_to_dev_s_regular_lane_while_spot_is_away() {
    use spot_worker::storage::CheckpointStore as _;
    use spot_worker_consumer::CompletionRecord;
    use spot_worker_decisions::lanes::Lane;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.py"), job_py(&page_blocks())).unwrap();
    let (first, imds) = session::free_ports();
    let flags = format!("--azurite-port {first} --imds-listen 127.0.0.1:{imds}");
    let log = dir.path().join("dev.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let dev = bash(
        dir.path(),
        &format!(
            "exec spot-worker dev {flags} -- spot-worker run --job-key job_id -- python3 job.py"
        ),
    )
    .stdout(log_file.try_clone().unwrap())
    .stderr(log_file)
    .spawn()
    .unwrap();
    let mut dev = Running(Some(dev));
    let in_dev =
        |command: &str| format!("eval \"$(spot-worker dev env --wait 90s {flags})\" && {command}");
    let said = |output: &Output| {
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr)
    };

    let enqueued = output(&mut bash(
        dir.path(),
        &in_dev(
            "spot-worker enqueue --deadline 75s --work 20s <<< '{\"job_id\":\"d1\",\"steps\":40}'",
        ),
    ));
    assert!(enqueued.status.success(), "{}", said(&enqueued));
    let evicted = output(&mut bash(
        dir.path(),
        &format!("spot-worker dev evict {flags} --after-progress --spot-away 90s"),
    ));
    let evict_said = said(&evicted);
    assert!(evicted.status.success(), "{evict_said}");
    assert!(
        evict_said.contains("approved by the worker")
            && evict_said.contains("Spot capacity is away for 90s"),
        "{evict_said}"
    );

    // Behind its line at the release, the job is sent to the regular queue
    // (and the regular VM boots for it); else it waits for Spot, and the
    // regular VM boots because the Spot VM is gone, for its lane keeper.
    let text = wait_for("the regular VM to boot", &log, |text| {
        text.contains("booting the regular VM local_regular_0 (")
    });
    assert!(
        !text.contains("(start 2)"),
        "the Spot VM came back:\n{text}"
    );
    let exports = String::from_utf8(
        output(&mut bash(
            dir.path(),
            &format!("spot-worker dev env {flags}"),
        ))
        .stdout,
    )
    .unwrap();
    assert!(
        exports.contains("export SPOT_WORKER_REGULAR_QUEUE='jobs-regular'"),
        "{exports}"
    );
    let connection_string = exports
        .lines()
        .find_map(|l| l.strip_prefix("export AZURE_STORAGE_CONNECTION_STRING='"))
        .and_then(|v| v.strip_suffix('\''))
        .expect("the connection string")
        .to_owned();
    let storage =
        AzureStorage::new(StorageConfig::from_connection_string(&connection_string).unwrap())
            .unwrap();
    expect_result(&storage, "d1", &log).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("(start 2)"),
        "the job finished on Spot, which was away:\n{text}"
    );
    let stored = storage
        .checkpoint_store("checkpoints")
        .unwrap()
        .read(&CompletionRecord::key("d1"))
        .await
        .unwrap()
        .expect("d1's completion record");
    let record = CompletionRecord::from_checkpoint(&stored.checkpoint, "d1").unwrap();
    let outcome = record.deadline.clone().expect("d1's deadline");
    assert!(
        outcome.met && outcome.lane == Lane::Regular && outcome.moves >= 1,
        "{record:?}\n{text}"
    );
    assert!(
        record.goodput.regular_ms > 0 && record.goodput.spot_ms() > 0,
        "{record:?}"
    );
    stop(dev.0.take().expect("still running"), &log);
}
