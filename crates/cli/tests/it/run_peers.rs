//! Two workers on one VM never cost each other progress (issue 21): real
//! `spot-worker run` processes with default settings (only the queue, the
//! health port and the emulator's address set) on one emulated VM, against
//! Azurite. A Preempt is approved only after every worker on the VM has
//! drained, so the busy worker's program saves its progress and the job
//! resumes from it on another VM; a worker killed with SIGKILL does not
//! hold the approval.

use crate::support;

use std::process::Stdio;
use std::time::{Duration, SystemTime};

use spot_worker_azure::{AzureQueue, AzureStorage, StorageConfig};
use spot_worker_imds_emulator::{EventSpec, RunningEmulator};
use spot_worker_storage::{MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;
use support::Log;
use tokio::process::{Child, Command};

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(90);
const VM: &str = "spotvmss_0";
const OTHER_VM: &str = "spotvmss_1";

/// Azurite, this VM's IMDS and another VM's.
struct World {
    azurite: Azurite,
    emulator: RunningEmulator,
    other_vm: RunningEmulator,
    storage: AzureStorage,
    /// `XDG_RUNTIME_DIR` of the workers: their rendezvous when `/run` is
    /// not writable (a test run as a user other than root).
    xdg: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let azurite = crate::support::azurite_from(Azurite::start).await;
        let emulator = crate::support::imds_of(VM).await;
        let other_vm = crate::support::imds_of(OTHER_VM).await;
        let config = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
        World {
            azurite,
            emulator,
            other_vm,
            storage: AzureStorage::new(config).unwrap(),
            xdg: tempfile::tempdir().unwrap(),
        }
    }

    async fn queue(&self, name: &str) -> AzureQueue {
        let queue = self.storage.queue(name).unwrap();
        queue.prepare().await.unwrap();
        queue
    }

    /// `spot-worker run` on `queue`, on the VM `imds` serves, running `program`.
    fn worker(&self, queue: &str, imds: &RunningEmulator, program: &str) -> Worker {
        Worker::spawn(self.worker_command(queue, imds, program))
    }

    /// The command [`World::worker`] runs, to add to.
    fn worker_command(&self, queue: &str, imds: &RunningEmulator, program: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
        command
            .args(["run", "--", "sh", "-c", program])
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                self.azurite.connection_string(),
            )
            .env("SPOT_WORKER_IMDS_ENDPOINT", imds.url())
            .env("SPOT_WORKER_QUEUE", queue)
            // Two workers cannot both listen on the default 127.0.0.1:8080.
            .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
            .env("XDG_RUNTIME_DIR", self.xdg.path())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("RUST_LOG")
            .env_remove("SPOT_WORKER_CONFIG")
            .env_remove("SPOT_WORKER_RUNTIME_DIR")
            .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// A worker process and everything it logged so far.
struct Worker {
    child: Child,
    pid: i32,
    log: Log,
}

impl Worker {
    /// Starts `command`, its stderr read line by line into its log.
    fn spawn(mut command: Command) -> Worker {
        let mut child = command.spawn().expect("spot-worker run starts");
        let log = Log::collect(child.stderr.take().unwrap());
        let pid = child.id().expect("the worker is running") as i32;
        Worker { child, pid, log }
    }

    /// Waits for its exit, bounded, and returns its status code.
    async fn exit(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the worker did not exit:\n{}", self.log.text()))
            .unwrap();
        status.code()
    }

    /// Whether no line it logged holds a raw escape character (its stderr
    /// is no terminal, so it writes no colours of its own).
    fn raw_escape_free(&self) -> bool {
        !self.log.as_written().any(|line| line.contains('\x1b'))
    }
}

/// The time a log line was written (its first word, RFC 3339).
fn logged_at(line: &str) -> SystemTime {
    let first = line.split_whitespace().next().unwrap_or_default();
    let at = time::OffsetDateTime::parse(first, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("no time at the start of {line:?}: {e}"));
    at.into()
}

/// A job that counts to 100, one step per 0.1 s, its count in the
/// checkpoint file (and in `progress` for the test); it starts from the
/// checkpoint file if one was saved, and says where it started in its
/// result. SIGTERM makes it take 2 s to save and stop: the worker's drain
/// lasts that long.
fn counting_job(progress: &std::path::Path) -> String {
    format!(
        r#"n=$(cat "$SPOT_WORKER_CHECKPOINT" 2>/dev/null || echo 0); first=$n
save() {{ echo "$n" > "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"; }}
trap 'sleep 2; save; exit 143' TERM
while [ "$n" -lt 100 ]; do
  n=$((n + 1)); save; echo "$n" > '{progress}'
  sleep 0.1 & wait $!
done
echo "from $first to $n" > "$SPOT_WORKER_RESULT""#,
        progress = progress.display()
    )
}

/// The count the job reported last.
fn count(progress: &std::path::Path) -> u32 {
    std::fs::read_to_string(progress)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempt_is_approved_only_once_both_workers_drained_and_the_job_resumes_from_its_progress()
 {
    let world = World::start().await;
    let busy_queue = world.queue("busy").await;
    world.queue("idle").await;
    let job_id = busy_queue.send("count", Duration::ZERO).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let progress = dir.path().join("progress");
    let job = counting_job(&progress);

    let mut idle = world.worker("idle", &world.emulator, "cat > /dev/null");
    let mut busy = world.worker("busy", &world.emulator, &job);
    idle.log.wait_for(&["warmup gate open"]).await;
    let started = std::time::Instant::now();
    while count(&progress) < 20 {
        assert!(
            started.elapsed() < PATIENCE,
            "the job made no progress:\n{}",
            busy.log.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_notice = count(&progress);
    let event = world.emulator.schedule(EventSpec::preempt()).unwrap();

    // The idle worker drains at once and holds the approval, saying why.
    let held = idle
        .log
        .wait_for(&["approving it once the other workers on this VM have drained"])
        .await;
    assert!(held.contains("queue busy"), "names the busy worker: {held}");
    assert_eq!(idle.exit().await, Some(0), "{}", idle.log.text());
    assert_eq!(busy.exit().await, Some(0), "{}", busy.log.text());

    // Approved (by either, or both: each approves once all have drained),
    // and only after both drained.
    let approvals = world.emulator.approvals();
    assert!(!approvals.is_empty(), "not approved");
    for (name, worker) in [("idle", &idle), ("busy", &busy)] {
        let drained = worker
            .log
            .line(&["drained", "notice_to_drained_ms"])
            .unwrap_or_else(|| panic!("{name} did not drain:\n{}", worker.log.text()));
        for approval in &approvals {
            assert_eq!(approval.event_id, event.id);
            assert!(
                logged_at(&drained) <= approval.at,
                "approved at {:?}, before the {name} worker drained: {drained}",
                approval.at
            );
        }
    }

    // Another VM takes the job up where the evicted one left it.
    let mut resumed = world.worker("busy", &world.other_vm, &job);
    let results = world.storage.result_store("results").unwrap();
    let started = std::time::Instant::now();
    let result = loop {
        if let Some(bytes) = results.get(job_id.as_str()).await.unwrap() {
            break String::from_utf8(bytes).unwrap();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no result:\n{}",
            resumed.log.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let from: u32 = result
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("result {result:?}"));
    assert!(
        from >= before_notice && from > 0,
        "resumed from {from}, not from the progress saved in the drain (at least {before_notice}): {result}"
    );
    assert!(result.trim().ends_with("to 100"), "{result}");
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(resumed.pid, libc::SIGTERM) }, 0);
    assert_eq!(resumed.exit().await, Some(0), "{}", resumed.log.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_does_not_hold_the_approval() {
    let world = World::start().await;
    world.queue("crashes").await;
    world.queue("stays").await;
    let mut crashed = world.worker("crashes", &world.emulator, "cat > /dev/null");
    let mut stays = world.worker("stays", &world.emulator, "cat > /dev/null");
    crashed
        .log
        .wait_for(&["joined the workers on this VM"])
        .await;
    let joined = stays.log.wait_for(&["joined the workers on this VM"]).await;
    stays.log.wait_for(&["warmup gate open"]).await;
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(crashed.pid, libc::SIGKILL) }, 0);
    assert_eq!(crashed.exit().await, None, "killed by a signal");
    let group = joined
        .split_whitespace()
        .find_map(|word| word.strip_prefix("dir="))
        .unwrap_or_else(|| panic!("no dir= in {joined}"))
        .to_owned();
    let member = format!("{}-", crashed.pid);
    assert!(
        std::fs::read_dir(&group)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&member)),
        "the crashed worker left its member file in {group}"
    );

    // A long notice: waiting for the dead worker would show as an approval
    // at NotBefore, not at once.
    let notice = Duration::from_secs(60);
    let event = world
        .emulator
        .schedule(EventSpec::preempt().notice(notice))
        .unwrap();
    assert_eq!(stays.exit().await, Some(0), "{}", stays.log.text());
    let approvals = world.emulator.approvals();
    assert_eq!(approvals.len(), 1, "{approvals:?}\n{}", stays.log.text());
    assert_eq!(approvals[0].event_id, event.id);
    let not_before = event.not_before.expect("a Preempt has a NotBefore");
    assert!(
        approvals[0].at + Duration::from_secs(30) < not_before,
        "approved at {:?}, near NotBefore {not_before:?}: the dead worker held it",
        approvals[0].at
    );
    assert!(
        stays
            .log
            .line(&["other worker(s) on this VM not drained"])
            .is_none(),
        "waited for the dead worker:\n{}",
        stays.log.text()
    );
    assert!(
        !std::fs::read_dir(&group)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&member)),
        "the crashed worker's file was removed as stale"
    );
}

/// The rendezvous subdirectory of the workers watching `imds_url`, as the
/// runtime names it (every character but letters, digits, `.` and `-` as
/// `_`).
fn group_dir(rendezvous: &std::path::Path, imds_url: &str) -> std::path::PathBuf {
    let name: String = imds_url
        .trim_end_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    rendezvous.join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_and_a_link_as_member_files_neither_hang_the_worker_nor_let_it_approve_early() {
    let world = World::start().await;
    world.queue("alone").await;
    // What another local user can leave in a shared rendezvous directory:
    // a FIFO no one writes to (opening it blocked the worker's start) and
    // a link to /dev/zero (read until memory ran out), one of them named
    // with an escape sequence that would recolour a terminal.
    let rendezvous = tempfile::tempdir().unwrap();
    let group = group_dir(rendezvous.path(), &world.emulator.url());
    std::fs::create_dir(&group).unwrap();
    let fifo = group.join("4242-\x1b[31mfifo.working");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", group.join("4243-zero.working")).unwrap();

    let mut worker = {
        let mut command = world.worker_command("alone", &world.emulator, "cat > /dev/null");
        command.env("SPOT_WORKER_RUNTIME_DIR", rendezvous.path());
        Worker::spawn(command)
    };
    worker.log.wait_for(&["warmup gate open"]).await;
    let notice = Duration::from_secs(8);
    let event = world
        .emulator
        .schedule(EventSpec::preempt().notice(notice))
        .unwrap();
    let held = worker
        .log
        .wait_for(&["approving it once the other workers on this VM have drained"])
        .await;
    assert!(
        held.contains("untrusted member file 4242-\\u{1b}[31mfifo.working")
            && held.contains("untrusted member file 4243-zero.working"),
        "holds for both files, named escaped: {held}"
    );
    assert_eq!(worker.exit().await, Some(0), "{}", worker.log.text());

    let approvals = world.emulator.approvals();
    assert_eq!(approvals.len(), 1, "{approvals:?}\n{}", worker.log.text());
    let not_before = event.not_before.expect("a Preempt has a NotBefore");
    assert!(
        approvals[0].at + Duration::from_secs(1) >= not_before,
        "approved at {:?}, before NotBefore {not_before:?}: an unreadable member file let it \
         approve early\n{}",
        approvals[0].at,
        worker.log.text()
    );
    let warnings: Vec<String> = worker
        .log
        .text()
        .lines()
        .filter(|line| line.contains("cannot be trusted as member files"))
        .map(str::to_owned)
        .collect();
    assert_eq!(warnings.len(), 1, "said once: {warnings:#?}");
    assert!(
        warnings[0].contains("4242-\\u{1b}[31mfifo.working is a FIFO")
            && warnings[0].contains("4243-zero.working is a symbolic link"),
        "{}",
        warnings[0]
    );
    assert!(
        worker.raw_escape_free(),
        "an escape sequence reached the log unescaped:\n{}",
        worker.log.text()
    );
}
