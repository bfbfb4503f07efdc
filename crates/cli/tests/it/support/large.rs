//! Large state under the real `spot-worker run`, shared by
//! `tests/it/run_large.rs` and `benches/large_state.rs`: Azurite with blob
//! and queue in processes of their own (so the blob service alone can be
//! stalled), two emulated VMs, runners whose log and peak memory are
//! kept, and the training loop `tests/large/train.py`, paced with
//! go-files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use spot_worker_azure::{AzureStorage, BlobCheckpointStore, CHUNK_PREFIX, StorageConfig};
use spot_worker_imds_emulator::RunningEmulator;
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::{Checkpoint, CheckpointStore as _, MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;
use spot_worker_testkit::procfs::PeakRss;
use tokio::process::{Child, Command};

use super::{Log, PATIENCE};

/// The runner's memory bound: 64 MB, in KiB.
pub const MEMORY_BOUND_KIB: u64 = 64_000_000 / 1024;
/// What the runner logs as it starts a save.
pub const SAVING: &str = "saving the checkpoint beside the program";

/// Azurite (blob and queue apart), this VM's IMDS and another VM's, and
/// the directories the programs and the test share.
pub struct World {
    pub azurite: Azurite,
    pub emulator: RunningEmulator,
    pub other_vm: RunningEmulator,
    pub checkpoints: BlobCheckpointStore,
    pub storage: AzureStorage,
    /// Where the workers meet (not the machine's /run).
    runtime_dir: tempfile::TempDir,
    shared: tempfile::TempDir,
}

impl World {
    pub async fn start() -> World {
        let azurite = crate::support::azurite_from(Azurite::start_separate).await;
        let emulator = crate::support::imds_of("spotvmss_0").await;
        let other_vm = crate::support::imds_of("spotvmss_1").await;
        // The operator's scope: the chunk blobs are listed.
        let config = StorageConfig::from_connection_string(&azurite.connection_string())
            .unwrap()
            .for_operator();
        let storage = AzureStorage::new(config).unwrap();
        storage.queue("jobs").unwrap().prepare().await.unwrap();
        World {
            checkpoints: storage.checkpoint_store("checkpoints").unwrap(),
            azurite,
            emulator,
            other_vm,
            storage,
            runtime_dir: tempfile::tempdir().unwrap(),
            shared: tempfile::tempdir().unwrap(),
        }
    }

    /// Sends the job `job` to the queue `jobs`.
    pub async fn send(&self, job: &str) {
        let queue = self.storage.queue("jobs").unwrap();
        queue
            .send(&format!(r#"{{"job_id":"{job}"}}"#), Duration::ZERO)
            .await
            .unwrap();
    }

    /// A file or directory of this world's shared directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.shared.path().join(name)
    }

    /// The go-file directory `name` (made if missing), for `TRAIN_GO`.
    pub fn go_dir(&self, name: &str) -> PathBuf {
        let dir = self.path(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    pub fn blob_pid(&self) -> u32 {
        let processes = self.azurite.processes();
        processes
            .iter()
            .find(|process| process.name == "azurite-blob")
            .expect("the blob service runs apart")
            .pid
    }

    /// `spot-worker run -- python train.py` on the VM `imds` serves, with
    /// `program` for the training loop and `settings` for the worker.
    pub fn runner(
        &self,
        imds: &RunningEmulator,
        program: &[(&str, String)],
        settings: &[(&str, &str)],
    ) -> Runner {
        let script = script("train.py").display().to_string();
        self.runner_of(
            imds,
            &["--checkpoint-every", "200ms"],
            &[python().as_str(), script.as_str()],
            program,
            settings,
        )
    }

    /// `spot-worker run --job-key job_id FLAGS -- COMMAND` on the VM
    /// `imds` serves, with `program` for the program's environment and
    /// `settings` for the worker's.
    pub fn runner_of(
        &self,
        imds: &RunningEmulator,
        flags: &[&str],
        command: &[&str],
        program: &[(&str, String)],
        settings: &[(&str, &str)],
    ) -> Runner {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spot-worker"))
            .args(["run", "--job-key", "job_id"])
            .args(flags)
            .arg("--")
            .args(command)
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
    pub async fn manifest(&self, job: &str) -> Option<Manifest> {
        let stored = self.checkpoints.read(job).await.ok()??;
        let Checkpoint::InProgress { progress } = stored.checkpoint else {
            return None;
        };
        Manifest::from_progress(&progress)?.ok()
    }

    /// The epoch the job's saved checkpoint holds.
    pub async fn saved_epoch(&self, job: &str) -> Option<u32> {
        let Files::Listed(files) = self.manifest(job).await?.files else {
            return None;
        };
        let epoch = files.into_iter().find(|file| file.path == "dir/epoch")?;
        match epoch.content {
            Content::Inline(text) => String::from_utf8(text).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits (bounded) until the job's checkpoint holds `epoch`.
    pub async fn until_saved(&self, job: &str, epoch: u32, runner: &Runner) {
        let started = std::time::Instant::now();
        while self.saved_epoch(job).await != Some(epoch) {
            assert!(
                started.elapsed() < PATIENCE,
                "epoch {epoch} was not saved:\n{}",
                runner.log.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The chunk blobs stored now, by name, with their sizes.
    pub async fn chunk_blobs(&self) -> BTreeMap<String, u64> {
        self.checkpoints
            .list()
            .await
            .unwrap()
            .into_iter()
            .filter(|blob| blob.name.starts_with(CHUNK_PREFIX))
            .map(|blob| (blob.name, blob.len))
            .collect()
    }

    /// Waits (bounded) for the job's result.
    pub async fn result(&self, job: &str, runner: &Runner) -> Vec<u8> {
        let results = self.storage.result_store("results").unwrap();
        let started = std::time::Instant::now();
        loop {
            if let Some(bytes) = results.get(job).await.unwrap() {
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
pub struct Runner {
    child: Child,
    pub pid: u32,
    pub log: Log,
    pub peak: PeakRss,
}

impl Runner {
    pub fn signal(&self, signal: i32) {
        send(self.pid, signal);
    }

    /// Waits (bounded) for its exit; its exit code.
    pub async fn exit(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the runner did not exit:\n{}", self.log.text()))
            .unwrap();
        status.code()
    }
}

/// The epochs a program saved, in order (its `TRAIN_LOG`).
pub fn epochs(log: &Path) -> Vec<u32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect()
}

pub fn python() -> String {
    std::env::var("SPOT_WORKER_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// A script of `tests/large`.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/large")
        .join(name)
}

pub fn send(pid: u32, signal: i32) {
    // SAFETY: signals a process the caller started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A time a watcher wrote (`watch.py`: CLOCK_MONOTONIC, ns).
pub fn stamped_ns(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Waits (bounded) for `done`, looking every 5 ms; `log` says why not.
pub async fn until(what: &str, log: &Log, mut done: impl FnMut() -> bool) {
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
pub fn uninterrupted(program: Vec<(&'static str, String)>) -> tokio::task::JoinHandle<Vec<u8>> {
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
pub fn sent(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(name, _)| !before.contains_key(*name))
        .map(|(_, len)| len)
        .sum()
}

/// A drain with a save in flight: the blob service stalled (or not) as
/// the runner starts saving `epoch`'s files, then SIGTERM to the runner
/// and to an idle process (what the machine itself takes to deliver a
/// signal now). What it measured: the program's stop signal after the
/// SIGTERM, and the idle process's, in ms. The blob service is left as
/// `stall` made it.
pub struct StopSignal {
    pub program_ms: f64,
    pub idle_ms: f64,
}

impl World {
    /// Runs the drain [`StopSignal`] describes on `runner`, whose program
    /// (`TRAIN_GO` = `go`, `TRAIN_LOG` = `epochs`, `TRAIN_SIGNAL_FILE` =
    /// `signalled`) waits after `epoch - 1`.
    pub async fn stop_during_a_save(
        &self,
        runner: &Runner,
        epoch: u32,
        go: &Path,
        epochs_log: &Path,
        signalled: &Path,
        stall: bool,
    ) -> StopSignal {
        until("the program's signal watcher", &runner.log, || {
            signalled.with_extension("ready").exists()
        })
        .await;
        let idle_file = signalled.with_extension("idle");
        let mut idle = std::process::Command::new(python())
            .arg(script("watch.py"))
            .arg(&idle_file)
            .spawn()
            .unwrap();
        // watch.py writes its path and ".ready": `with_extension` would
        // name the program's watcher's file (`<signalled>.ready`), already
        // there, and the signal could reach the idle process before its
        // handler is in place.
        let idle_ready = PathBuf::from(format!("{}.ready", idle_file.display()));
        until("the idle process", &runner.log, || idle_ready.exists()).await;
        if stall {
            send(self.blob_pid(), libc::SIGSTOP);
        }
        let saves = runner.log.count(&[SAVING]);
        std::fs::write(go.join(format!("go-{}", epoch - 1)), b"").unwrap();
        until("the epoch and a save of it", &runner.log, || {
            epochs(epochs_log).contains(&epoch) && runner.log.count(&[SAVING]) > saves
        })
        .await;
        let sigterm = monotonic_ns();
        send(idle.id(), libc::SIGTERM);
        runner.signal(libc::SIGTERM);
        until("the program's stop signal", &runner.log, || {
            signalled.exists()
        })
        .await;
        until("the idle process's signal", &runner.log, || {
            idle_file.exists()
        })
        .await;
        idle.wait().unwrap();
        StopSignal {
            program_ms: (stamped_ns(signalled) - sigterm) as f64 / 1e6,
            idle_ms: (stamped_ns(&idle_file) - sigterm) as f64 / 1e6,
        }
    }
}
