//! Large state under `spot-worker run`: the real binary on a real Azurite
//! (blob and queue in processes of their own, so the blob service alone
//! can be stalled) with the IMDS emulator, running a Python training loop
//! (`large/train.py`) whose pace the test sets with go-files.
//!
//! - A checkpoint file three times the runner's 64 MB memory bound, with a
//!   checkpoint directory beside it: saved whole once, again unchanged for
//!   nothing, with a 1 % region changed for about that region (counted at
//!   the store: the chunk blobs that appeared). Then the blob service is
//!   stalled (SIGSTOP) as the next save starts, and the runner gets
//!   SIGTERM: the program's stop signal comes within 50 ms of an idle
//!   process's; the save cannot finish before the release, so it is
//!   abandoned, the last complete checkpoint stands and the log says so.
//!   A second runner resumes from it, and the result equals an
//!   uninterrupted run's. Neither runner's peak RSS reaches 64 MB.
//! - A checkpoint directory alone (the parameters in shards, as frameworks
//!   write them), evicted by a real Preempt notice: the program's last
//!   checkpoint on its stop signal is too big to save in the time left at
//!   the throughput measured, so that save is not started, the log says
//!   so, and another VM's runner resumes from the last complete one
//!   exactly.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use spot_worker_azure::{AzureStorage, BlobCheckpointStore, StorageConfig};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, RunningEmulator};
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::{Checkpoint, CheckpointStore as _, MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;
use spot_worker_testkit::procfs::PeakRss;
use support::{Log, PATIENCE};
use tokio::process::{Child, Command};

/// The runner's memory bound: 64 MB, in KiB.
const MEMORY_BOUND_KIB: u64 = 64_000_000 / 1024;
/// The job every test runs.
const JOB: &str = "train";
/// Where the runner keeps chunks in the checkpoint container.
const CHUNKS: &str = ".spot-worker/chunks/";
/// What the runner logs as it starts a save.
const SAVING: &str = "saving the checkpoint beside the program";

/// Azurite (blob and queue apart), this VM's IMDS and another VM's, and
/// the directories the programs and the test share.
struct World {
    azurite: Azurite,
    emulator: RunningEmulator,
    other_vm: RunningEmulator,
    checkpoints: BlobCheckpointStore,
    storage: AzureStorage,
    /// Where the workers of this test meet (not the machine's /run).
    runtime_dir: tempfile::TempDir,
    shared: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let azurite = tokio::task::spawn_blocking(Azurite::start_separate)
            .await
            .unwrap()
            .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
        let emulator = Emulator::start(EmulatorConfig::for_vm("spotvmss_0"))
            .await
            .unwrap();
        let other_vm = Emulator::start(EmulatorConfig::for_vm("spotvmss_1"))
            .await
            .unwrap();
        // The operator's scope: the test lists the chunk blobs.
        let config = StorageConfig::from_connection_string(&azurite.connection_string())
            .unwrap()
            .for_operator();
        let storage = AzureStorage::new(config).unwrap();
        let queue = storage.queue("jobs").unwrap();
        queue.prepare().await.unwrap();
        queue
            .send(&format!(r#"{{"job_id":"{JOB}"}}"#), Duration::ZERO)
            .await
            .unwrap();
        let shared = tempfile::tempdir().unwrap();
        std::fs::create_dir(shared.path().join("go")).unwrap();
        World {
            checkpoints: storage.checkpoint_store("checkpoints").unwrap(),
            azurite,
            emulator,
            other_vm,
            storage,
            runtime_dir: tempfile::tempdir().unwrap(),
            shared,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.shared.path().join(name)
    }

    /// Lets the program go on after `epoch`.
    fn go(&self, epoch: u32) {
        std::fs::write(self.path("go").join(format!("go-{epoch}")), b"").unwrap();
    }

    fn blob_pid(&self) -> u32 {
        let processes = self.azurite.processes();
        processes
            .iter()
            .find(|process| process.name == "azurite-blob")
            .expect("the blob service runs apart")
            .pid
    }

    /// `spot-worker run -- python train.py` on the VM `imds` serves, with
    /// `program` for the training loop and `settings` for the worker.
    fn runner(
        &self,
        imds: &RunningEmulator,
        program: &[(&str, String)],
        settings: &[(&str, &str)],
    ) -> Runner {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spot-worker"))
            .args(["run", "--job-key", "job_id", "--checkpoint-every", "200ms"])
            .arg("--")
            .arg(python())
            .arg(script("train.py"))
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                self.azurite.connection_string(),
            )
            .env("SPOT_WORKER_IMDS_ENDPOINT", imds.url())
            .env("SPOT_WORKER_QUEUE", "jobs")
            .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
            .env("SPOT_WORKER_RUNTIME_DIR", self.runtime_dir.path())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("RUST_LOG", "info,spot_worker_command=debug")
            .envs(program.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(settings.iter().copied())
            .env_remove("SPOT_WORKER_CONFIG")
            .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spot-worker run starts");
        let log = Log::collect(child.stderr.take().unwrap());
        let pid = child.id().expect("the runner is running");
        Runner {
            child,
            pid,
            log,
            peak: PeakRss::watch(pid),
        }
    }

    /// The job's saved manifest, if any.
    async fn manifest(&self) -> Option<Manifest> {
        let stored = self.checkpoints.read(JOB).await.ok()??;
        let Checkpoint::InProgress { progress } = stored.checkpoint else {
            return None;
        };
        Manifest::from_progress(&progress)?.ok()
    }

    /// The epoch the job's saved checkpoint holds.
    async fn saved_epoch(&self) -> Option<u32> {
        let Files::Listed(files) = self.manifest().await?.files else {
            return None;
        };
        let epoch = files.into_iter().find(|file| file.path == "dir/epoch")?;
        match epoch.content {
            Content::Inline(text) => String::from_utf8(text).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits (bounded) until the job's checkpoint holds `epoch`.
    async fn until_saved(&self, epoch: u32, runner: &Runner) {
        let started = std::time::Instant::now();
        while self.saved_epoch().await != Some(epoch) {
            assert!(
                started.elapsed() < PATIENCE,
                "epoch {epoch} was not saved:\n{}",
                runner.log.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The chunk blobs stored now, by name, with their sizes.
    async fn chunk_blobs(&self) -> BTreeMap<String, u64> {
        self.checkpoints
            .list()
            .await
            .unwrap()
            .into_iter()
            .filter(|blob| blob.name.starts_with(CHUNKS))
            .map(|blob| (blob.name, blob.len))
            .collect()
    }

    /// Waits (bounded) for the job's result.
    async fn result(&self, runner: &Runner) -> Vec<u8> {
        let results = self.storage.result_store("results").unwrap();
        let started = std::time::Instant::now();
        loop {
            if let Some(bytes) = results.get(JOB).await.unwrap() {
                return bytes;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "no result:\n{}",
                runner.log.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A runner process, its log and its peak memory.
struct Runner {
    child: Child,
    pid: u32,
    log: Log,
    peak: PeakRss,
}

impl Runner {
    fn signal(&self, signal: i32) {
        send(self.pid, signal);
    }

    /// Waits (bounded) for its exit; its exit code.
    async fn exit(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the runner did not exit:\n{}", self.log.text()))
            .unwrap();
        status.code()
    }

    /// The epochs its program saved, in order (`TRAIN_LOG`).
    fn epochs(log: &Path) -> Vec<u32> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.parse().ok())
            .collect()
    }
}

fn python() -> String {
    std::env::var("SPOT_WORKER_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/large")
        .join(name)
}

fn send(pid: u32, signal: i32) {
    // SAFETY: signals a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A time a watcher wrote (`watch.py`: CLOCK_MONOTONIC, ns).
fn stamped_ns(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) for `done`, looking every 5 ms; `log` says why not.
async fn until(what: &str, log: &Log, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting for {what}:\n{}",
            log.text()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What the training loop computes uninterrupted, with `program`'s
/// settings, on a blocking thread.
fn uninterrupted(program: Vec<(&'static str, String)>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let alone = tempfile::tempdir().unwrap();
        std::fs::create_dir(alone.path().join("d")).unwrap();
        std::fs::create_dir(alone.path().join("work")).unwrap();
        let status = std::process::Command::new(python())
            .arg(script("train.py"))
            .envs(program)
            .env("SPOT_WORKER_CHECKPOINT", alone.path().join("ck"))
            .env("SPOT_WORKER_CHECKPOINT_DIR", alone.path().join("d"))
            .env("SPOT_WORKER_WORK_DIR", alone.path().join("work"))
            .env("SPOT_WORKER_RESULT", alone.path().join("result"))
            .status()
            .unwrap();
        assert!(status.success(), "the uninterrupted run failed");
        std::fs::read(alone.path().join("result")).unwrap()
    })
}

/// The bytes of the chunk blobs in `after` that `before` did not have.
fn sent(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(name, _)| !before.contains_key(*name))
        .map(|(_, len)| len)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_three_times_the_memory_bound_survives_an_eviction_with_storage_stalled() {
    // 192 MiB: three times the memory bound.
    const SIZE: u64 = 192 << 20;
    let world = World::start().await;
    let size = ("TRAIN_SIZE", SIZE.to_string());
    let expected = uninterrupted(vec![size.clone()]);
    let (a_epochs, signalled) = (world.path("a-epochs"), world.path("signalled"));
    let program = [
        size.clone(),
        ("TRAIN_GO", world.path("go").display().to_string()),
        ("TRAIN_LOG", a_epochs.display().to_string()),
        ("TRAIN_SIGNAL_FILE", signalled.display().to_string()),
    ];
    // A release budget of 3 s after SIGTERM: too short for a save to wait
    // out the stall.
    let short_release = [
        ("SPOT_WORKER_DRAIN_BUDGET", "4s"),
        ("SPOT_WORKER_RELEASE_MARGIN", "1s"),
        ("SPOT_WORKER_RELEASE_FLOOR", "500ms"),
    ];
    let mut a = world.runner(&world.emulator, &program, &short_release);

    // The first save sends the whole file; the second, of the same
    // parameters written again, sends nothing; the third, with a region
    // of 1 % changed, about that region.
    world.until_saved(1, &a).await;
    let first = world.chunk_blobs().await;
    let whole = sent(&BTreeMap::new(), &first);
    assert!(whole >= SIZE, "the first save sent {whole} bytes");
    world.go(1);
    world.until_saved(2, &a).await;
    let second = world.chunk_blobs().await;
    assert_eq!(
        sent(&first, &second),
        0,
        "a save of the unchanged file sent chunks"
    );
    world.go(2);
    world.until_saved(3, &a).await;
    let third = world.chunk_blobs().await;
    let (changed, region) = (sent(&second, &third), SIZE / 100);
    let around = 2 * spot_worker_storage::files::MAX_CHUNK as u64 + (256 << 10);
    assert!(
        changed >= region && changed <= region + around,
        "a {region}-byte region changed: {changed} bytes sent"
    );
    let expected = expected.await.unwrap();

    // Storage stalls just as the next save starts; then SIGTERM, to the
    // runner and to an idle process (what the machine takes to deliver a
    // signal now).
    until("the program's signal watcher", &a.log, || {
        signalled.with_extension("ready").exists()
    })
    .await;
    let control_file = world.path("control");
    let mut control = std::process::Command::new(python())
        .arg(script("watch.py"))
        .arg(&control_file)
        .spawn()
        .unwrap();
    until("the idle process", &a.log, || {
        control_file.with_extension("ready").exists()
    })
    .await;
    let blob = world.blob_pid();
    send(blob, libc::SIGSTOP);
    let saves = a.log.count(&[SAVING]);
    world.go(3);
    until("epoch 4 and a save of it", &a.log, || {
        Runner::epochs(&a_epochs).contains(&4) && a.log.count(&[SAVING]) > saves
    })
    .await;
    let sigterm = monotonic_ns();
    send(control.id(), libc::SIGTERM);
    a.signal(libc::SIGTERM);
    until("the program's stop signal", &a.log, || signalled.exists()).await;
    until("the idle process's signal", &a.log, || {
        control_file.exists()
    })
    .await;
    control.wait().unwrap();
    let program_ms = (stamped_ns(&signalled) - sigterm) as f64 / 1e6;
    let control_ms = (stamped_ns(&control_file) - sigterm) as f64 / 1e6;

    // Storage stays stalled past the release: the save is given up, and
    // the last complete checkpoint (epoch 3) stands.
    let given_up = a
        .log
        .wait_for(&["the last complete checkpoint stands"])
        .await;
    send(blob, libc::SIGCONT);
    assert_eq!(a.exit().await, Some(0), "{}", a.log.text());
    let log_a = a.log.text();
    assert!(
        program_ms <= control_ms + 50.0,
        "the stop signal reached the program {program_ms:.1} ms after SIGTERM \
         (an idle process: {control_ms:.1} ms)\n{log_a}"
    );
    assert_eq!(world.saved_epoch().await, Some(3), "{log_a}");
    let peak_a = a.peak.kib();
    assert!(
        peak_a > 0 && peak_a < MEMORY_BOUND_KIB,
        "runner A peaked at {peak_a} KiB"
    );

    // Another runner resumes from epoch 3; the result is an uninterrupted
    // run's.
    let b_epochs = world.path("b-epochs");
    let mut b = world.runner(
        &world.other_vm,
        &[size, ("TRAIN_LOG", b_epochs.display().to_string())],
        &[],
    );
    let result = world.result(&b).await;
    let peak_b = b.peak.kib();
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert_eq!(
        String::from_utf8_lossy(&result),
        String::from_utf8_lossy(&expected),
        "{}",
        b.log.text()
    );
    assert!(
        b.log
            .line(&["resuming from the saved checkpoint"])
            .is_some(),
        "{}",
        b.log.text()
    );
    assert_eq!(
        Runner::epochs(&b_epochs),
        [4, 5, 6],
        "resumed after epoch 3"
    );
    assert!(
        peak_b > 0 && peak_b < MEMORY_BOUND_KIB,
        "runner B peaked at {peak_b} KiB"
    );
    eprintln!(
        "stop signal after {program_ms:.1} ms (an idle process: {control_ms:.1} ms); \
         sent {whole} bytes, then 0, then {changed} for a {region}-byte region; \
         peak RSS A {peak_a} KiB, B {peak_b} KiB; {given_up}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_directory_resumes_after_a_notice_whose_final_save_cannot_fit() {
    // Four shards of 12 MiB: saves big enough to measure the throughput.
    const SIZE: u64 = 48 << 20;
    let world = World::start().await;
    let program = |log: &Path| {
        vec![
            ("TRAIN_SIZE", SIZE.to_string()),
            ("TRAIN_LAYOUT", "dir".to_owned()),
            ("TRAIN_LOG", log.display().to_string()),
        ]
    };
    let expected = uninterrupted(program(&world.path("alone-epochs")));
    let a_epochs = world.path("a-epochs");
    let mut in_a = program(&a_epochs);
    in_a.push(("TRAIN_GO", world.path("go").display().to_string()));
    // Its last checkpoint, on the stop signal: 100 GB more.
    in_a.push(("TRAIN_ON_STOP", "huge".to_owned()));
    let mut a = world.runner(&world.emulator, &in_a, &[]);
    for epoch in 1..=3 {
        world.until_saved(epoch, &a).await;
        if epoch < 3 {
            world.go(epoch);
        }
    }
    world.emulator.schedule(EventSpec::preempt()).unwrap();
    let skipped = a
        .log
        .wait_for(&[
            "the final save would not finish before the release at the throughput measured",
            "the last complete checkpoint stands",
        ])
        .await;
    assert_eq!(a.exit().await, Some(0), "{}", a.log.text());
    assert_eq!(world.saved_epoch().await, Some(3), "{}", a.log.text());
    let Some(Manifest {
        files: Files::Listed(files),
        ..
    }) = world.manifest().await
    else {
        panic!("no manifest listing its files");
    };
    let paths: Vec<&str> = files.iter().map(|file| file.path.as_str()).collect();
    assert!(
        !paths.contains(&"dir/params/final-shard") && paths.contains(&"dir/params/shard-3"),
        "{paths:?}"
    );

    let b_epochs = world.path("b-epochs");
    let mut b = world.runner(&world.other_vm, &program(&b_epochs), &[]);
    let result = world.result(&b).await;
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert_eq!(
        String::from_utf8_lossy(&result),
        String::from_utf8_lossy(&expected.await.unwrap()),
        "{}",
        b.log.text()
    );
    assert_eq!(
        Runner::epochs(&b_epochs),
        [4, 5, 6],
        "resumed after epoch 3"
    );
    eprintln!("{skipped}");
}
