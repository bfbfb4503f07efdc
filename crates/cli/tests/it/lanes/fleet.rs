//! The emulated fleet: Spot VMs and regular VMs, each a real `spot-worker
//! run` process on its own IMDS emulator, configured only through the
//! environment contract (scaled-down durations through real settings),
//! and a regular pool scaled from zero on its queue as autoscale does.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, RunningEmulator};
use tokio::process::{Child, Command};

/// The Spot lane's queue and the regular lane's.
pub const SPOT_QUEUE: &str = "jobs";
pub const REGULAR_QUEUE: &str = "jobs-regular";
/// Bound of a worker's exit after a notice or SIGTERM: the drain budget.
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// The job every VM runs: `steps` steps of 0.25 s each (its work), its
/// step in the checkpoint file and its share done in the progress file;
/// it resumes from the checkpoint file, stops at SIGTERM (the runner saves
/// the file), writes which VM holds it at each start (the test's probe),
/// and its body as its result.
pub const PROGRAM: &str = r#"set -u
body=$(cat)
steps=$(printf '%s' "$body" | sed -n 's/.*"steps":\([0-9]*\).*/\1/p')
step=0
if [ -s "$SPOT_WORKER_CHECKPOINT" ]; then step=$(cat "$SPOT_WORKER_CHECKPOINT"); fi
printf '%s %s\n' "$SPOT_WORKER_VM_NAME" "$step" > "$PROBE_DIR/holder-$SPOT_WORKER_JOB_KEY"
trap 'exit 143' TERM
while [ "$step" -lt "$steps" ]; do
  sleep 0.25 & wait $!
  step=$((step + 1))
  printf '%s' "$step" > "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"
  if [ "$step" -ge "$steps" ]; then echo 1 > "$SPOT_WORKER_PROGRESS"
  else printf '0.%03d\n' $((step * 1000 / steps)) > "$SPOT_WORKER_PROGRESS"; fi
done
printf '%s' "$body" > "$SPOT_WORKER_RESULT""#;

/// One VM: its emulator and its worker.
pub struct Vm {
    pub name: String,
    pub regular: bool,
    pub emulator: RunningEmulator,
    pub child: Child,
}

/// How a VM ended.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The VM, and whether it was a regular one.
    #[allow(dead_code)] // in failures' messages
    pub vm: (String, bool),
    /// Preempted (Spot), or stopped (scale-in, the end of the run).
    pub preempted: bool,
    pub exit_code: Option<i32>,
}

/// What every VM shares.
pub struct Fleet {
    pub connection_string: String,
    pub dir: PathBuf,
    counter: AtomicUsize,
    pub ended: Mutex<Vec<Ended>>,
}

impl Fleet {
    pub fn new(connection_string: String, dir: &Path) -> Arc<Fleet> {
        Arc::new(Fleet {
            connection_string,
            dir: dir.to_owned(),
            counter: AtomicUsize::new(0),
            ended: Mutex::new(Vec::new()),
        })
    }

    /// Boots a VM of the Spot lane, or of the regular one.
    pub async fn boot(&self, regular: bool) -> Vm {
        let index = self.counter.fetch_add(1, Ordering::SeqCst);
        let name = format!(
            "{}_{index}",
            if regular { "regularvmss" } else { "spotvmss" }
        );
        let emulator = Emulator::start(EmulatorConfig::for_vm(&name))
            .await
            .expect("an IMDS emulator");
        let runtime_dir = self.dir.join(format!("run-{name}"));
        std::fs::create_dir_all(&runtime_dir).unwrap();
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_spot-worker"))
            .args(["run", "--", "sh", "-c", PROGRAM])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("AZURE_STORAGE_CONNECTION_STRING", &self.connection_string)
            .env("SPOT_WORKER_QUEUE", SPOT_QUEUE)
            .env("SPOT_WORKER_REGULAR_QUEUE", REGULAR_QUEUE)
            .env("SPOT_WORKER_LANE", if regular { "regular" } else { "spot" })
            .env("SPOT_WORKER_IMDS_ENDPOINT", emulator.url())
            .env("SPOT_WORKER_VM_NAME", &name)
            .env("SPOT_WORKER_IMDS_POLL_INTERVAL", "250ms")
            .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
            .env("SPOT_WORKER_RUNTIME_DIR", &runtime_dir)
            .env("SPOT_WORKER_CONCURRENCY", "1")
            .env("SPOT_WORKER_VISIBILITY_TIMEOUT", "5s")
            .env("SPOT_WORKER_IDLE_POLL_MAX", "250ms")
            .env("SPOT_WORKER_JOB_KEY", "job_id")
            .env("SPOT_WORKER_CHECKPOINT_EVERY", "1s")
            // The lanes, scaled down: the keeper looks every second, and a
            // switch is assumed to cost 2 s until measured.
            .env("SPOT_WORKER_LANE_KEEPER_EVERY", "1s")
            .env("SPOT_WORKER_SWITCH_COST", "2s")
            .env("SPOT_WORKER_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("PROBE_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("spot-worker run starts");
        Vm {
            name,
            regular,
            emulator,
            child,
        }
    }

    /// Preempts `vm` (a Spot eviction with its notice) and waits for its
    /// worker to drain and exit.
    pub async fn preempt(&self, mut vm: Vm) {
        vm.emulator.schedule(EventSpec::preempt()).unwrap();
        let exit = tokio::time::timeout(EXIT_BOUND, vm.child.wait()).await;
        self.record(&vm, true, exit.ok().and_then(Result::ok));
    }

    /// Stops `vm` with SIGTERM (a scale-in, the end of the run) once its
    /// worker is up (a process signalled before it listens for signals
    /// just dies, as any would), and waits for it to drain and exit.
    pub async fn stop(&self, mut vm: Vm) {
        let up = async {
            while !std::fs::read_to_string(self.dir.join(format!("{}.log", vm.name)))
                .unwrap_or_default()
                .contains("warmup gate open")
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(EXIT_BOUND, up).await;
        let pid = vm.child.id().expect("running") as i32;
        // SAFETY: signals the worker this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let exit = tokio::time::timeout(EXIT_BOUND, vm.child.wait()).await;
        self.record(&vm, false, exit.ok().and_then(Result::ok));
    }

    fn record(&self, vm: &Vm, preempted: bool, exit: Option<std::process::ExitStatus>) {
        self.ended.lock().unwrap().push(Ended {
            vm: (vm.name.clone(), vm.regular),
            preempted,
            exit_code: exit.and_then(|status| status.code()),
        });
    }

    /// Which VM last started `job`, and from which step.
    pub fn holder(&self, job: &str) -> Option<(String, u32)> {
        let text = std::fs::read_to_string(self.dir.join(format!("holder-{job}"))).ok()?;
        let (vm, step) = text.trim().split_once(' ')?;
        Some((vm.to_owned(), step.parse().ok()?))
    }

    /// The VMs whose log has a line containing every one of `parts`.
    pub fn logged(&self, parts: &[&str]) -> Vec<String> {
        let mut vms = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let Some(vm) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.extension().is_some_and(|e| e == "log")
                && std::fs::read_to_string(&path)
                    .unwrap_or_default()
                    .lines()
                    .any(|line| parts.iter().all(|part| line.contains(part)))
            {
                vms.push(vm.to_owned());
            }
        }
        vms.sort();
        vms
    }

    /// Every VM's log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let log = std::fs::read_to_string(&path).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    text.push_str(&format!("== {}\n", path.display()));
                    for line in tail.into_iter().rev() {
                        text.push_str(line);
                        text.push('\n');
                    }
                }
            }
        }
        text
    }
}
