//! The chaos run: three worker processes of the example job (the real
//! `examples/primes` binary) on one queue in a real Azurite, each on its own
//! emulated Spot VM, while a seeded random schedule of faults hits them:
//! Preempt notices (the worker must drain in time and exit 0; the scale set
//! then replaces the VM), `SIGKILL` without notice (replaced too), short
//! Freezes (which must not drain), a brief Azurite outage (stopped and
//! started again on the same data), and slow or failing IMDS.
//!
//! At the end the harness checks, with its own reads of storage, that every
//! job has exactly one, correct result, that the queue is empty and the
//! poison queue holds exactly the malformed messages, and, from the
//! workers' JSON logs and exit statuses, that every graceful drain met its
//! deadline. It prints the figures and the failed checks.
//!
//! Two scripted faults go beyond single VMs: one long job, enqueued first,
//! is Preempted on whichever VM holds it more times than `max_failures`
//! (see `long_job.rs`), and one Reboot listing two VMs is posted to both,
//! then cancelled or left to start (see `shared_reboot.rs`).
//!
//! Shared by `benches/chaos.rs` (the long run, `cargo bench --bench chaos`)
//! and `tests/chaos.rs` (a short, seed-fixed run in CI).

mod long_job;
mod shared_reboot;

pub use long_job::LongJob;
pub use shared_reboot::SharedReboots;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::Azurite;
use anyhow::{Context as _, Result, bail};
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::Value;
use spot_worker::azure::{AzureQueue, AzureStorage, RetryConfig, StorageConfig};
use spot_worker::storage::{MessageQueue as _, PoisonRecord, ResultStore as _};
use spot_worker_imds_emulator::{
    Emulator, EmulatorConfig, EventSpec, Fault, RunningEmulator, StatusCode,
};
use spot_worker_primes::{PrimesJob, expected_result};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

/// The queue the workers consume (a fresh Azurite per run).
const QUEUE: &str = "chaos";
/// Where the example job writes its results (its default).
const RESULTS: &str = "results";
/// Numbers per checkpoint in the example job (`PrimesConfig::default()`).
const CHUNK: u64 = 1_000_000;
/// How long a Preempted worker may take to exit: the notice itself.
const PREEMPT_EXIT_BOUND: Duration = Duration::from_secs(30);
/// How long a worker may take to exit after SIGTERM (the drain budget, 25 s,
/// plus margin).
const STOP_EXIT_BOUND: Duration = Duration::from_secs(30);

/// Messages that are not valid jobs: each must end up in the poison queue,
/// and nothing else may.
pub const MALFORMED: [&str; 4] = [
    "this is not JSON",
    r#"{"job_id":"bad-range","start":5000,"end":100}"#,
    r#"{"job_id":"no-end","start":0}"#,
    r#"{"job_id":"../escape","start":0,"end":10}"#,
];

/// One run's settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seeds every random choice: the jobs, the fault schedule, the VMs.
    pub seed: u64,
    /// Worker processes (VMs) at any time.
    pub workers: usize,
    /// Valid jobs enqueued.
    pub jobs: usize,
    /// Malformed messages enqueued (the first N of [`MALFORMED`]).
    pub malformed: usize,
    /// Numbers per job, drawn uniformly from this range.
    pub job_span: (u64, u64),
    /// Faults of each kind in the schedule (shuffled).
    pub faults: FaultMix,
    /// Pause between two faults, drawn uniformly from this range.
    pub gap: (Duration, Duration),
    /// `SPOT_WORKER_CONCURRENCY` of each worker.
    pub concurrency: usize,
    /// `SPOT_WORKER_VISIBILITY_TIMEOUT`.
    pub visibility_timeout: Duration,
    /// `SPOT_WORKER_MAX_FAILURES`.
    pub max_failures: u32,
    /// Bound of the whole run, from the first worker start to the last result.
    pub timeout: Duration,
    /// The worker binary (`examples/primes`).
    pub binary: PathBuf,
    /// Keep the workers' logs even if every check passes.
    pub keep_logs: bool,
    /// One long job, enqueued first and evicted repeatedly.
    pub long_job: Option<LongJob>,
    /// Reboots shared by two VMs, in the schedule besides `faults`.
    pub shared_reboots: SharedReboots,
}

/// How many faults of each kind the schedule holds.
#[derive(Clone, Copy, Debug)]
pub struct FaultMix {
    /// Preempt notices to one VM (drain, exit 0, replaced).
    pub preempt: usize,
    /// SIGKILLs without notice (replaced).
    pub kill: usize,
    /// Short Freezes (must not drain).
    pub freeze: usize,
    /// Azurite stopped and started again on the same data.
    pub azurite_outage: usize,
    /// IMDS answering slowly for a while.
    pub imds_slow: usize,
    /// IMDS failing (503, malformed, dropped) for a while.
    pub imds_failing: usize,
}

impl FaultMix {
    /// Faults of every kind together.
    pub fn total(&self) -> usize {
        self.preempt
            + self.kill
            + self.freeze
            + self.azurite_outage
            + self.imds_slow
            + self.imds_failing
    }
}

/// One planned fault. The random parameters are drawn when the schedule is
/// made, so a seed replays the same faults in the same order (their effect
/// still depends on timing: which jobs are in flight, for instance).
#[derive(Clone, Debug)]
enum FaultKind {
    /// A Preempt notice (30 s) for one VM.
    Preempt,
    /// SIGKILL, no notice.
    Kill,
    /// A Freeze announced `notice` ahead, lasting `secs`: too short to drain.
    Freeze { notice: Duration, secs: i64 },
    /// Azurite stopped, then started again on the same data after `hold`.
    AzuriteOutage { hold: Duration },
    /// The VM's next `count` Scheduled Events GETs answered after `delay`.
    ImdsSlow { delay: Duration, count: u32 },
    /// The VM's next `count` Scheduled Events GETs fail with `fault`.
    ImdsFailing { fault: Fault, count: u32 },
    /// One Reboot listing this VM and the one in `peer`'s slot, posted to
    /// both, `notice` ahead; cancelled once both wait for it, or left to
    /// start at `NotBefore`.
    SharedReboot {
        peer: usize,
        notice: Duration,
        cancel: bool,
    },
}

impl FaultKind {
    fn name(&self) -> &'static str {
        match self {
            FaultKind::Preempt => "preempt",
            FaultKind::Kill => "sigkill",
            FaultKind::Freeze { .. } => "freeze",
            FaultKind::AzuriteOutage { .. } => "azurite-outage",
            FaultKind::ImdsSlow { .. } => "imds-slow",
            FaultKind::ImdsFailing { .. } => "imds-failing",
            FaultKind::SharedReboot { cancel: true, .. } => "shared-reboot-cancelled",
            FaultKind::SharedReboot { cancel: false, .. } => "shared-reboot-started",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Preempt | FaultKind::Kill => f.write_str(self.name()),
            FaultKind::Freeze { notice, secs } => {
                write!(f, "freeze ({secs} s, notice {} s)", notice.as_secs())
            }
            FaultKind::AzuriteOutage { hold } => {
                write!(f, "azurite-outage ({} ms down)", hold.as_millis())
            }
            FaultKind::ImdsSlow { delay, count } => {
                write!(
                    f,
                    "imds-slow ({count} GETs delayed {} ms)",
                    delay.as_millis()
                )
            }
            FaultKind::ImdsFailing { fault, count } => {
                let what = match fault {
                    Fault::Status(status) => status.as_u16().to_string(),
                    Fault::Malformed => "malformed".to_owned(),
                    Fault::Drop => "dropped".to_owned(),
                    Fault::Delay(_) => "delayed".to_owned(),
                };
                write!(f, "imds-failing ({count} GETs {what})")
            }
            FaultKind::SharedReboot { notice, .. } => {
                write!(f, "{} (notice {} s)", self.name(), notice.as_secs())
            }
        }
    }
}

#[derive(Clone, Debug)]
struct PlannedFault {
    /// Pause before it, after the previous fault.
    gap: Duration,
    kind: FaultKind,
    /// The worker slot it targets (ignored for the Azurite outage).
    slot: usize,
}

/// The fault schedule: each kind as often as `mix` says, in a random order,
/// with random pauses and targets.
fn plan_faults(rng: &mut StdRng, options: &Options) -> Vec<PlannedFault> {
    let mix = options.faults;
    let mut kinds: Vec<u8> = Vec::new();
    for (kind, count) in [
        (0, mix.preempt),
        (1, mix.kill),
        (2, mix.freeze),
        (3, mix.azurite_outage),
        (4, mix.imds_slow),
        (5, mix.imds_failing),
    ] {
        kinds.extend(std::iter::repeat_n(kind, count));
    }
    kinds.shuffle(rng);
    let mut plan: Vec<PlannedFault> = kinds
        .into_iter()
        .map(|kind| {
            let kind = match kind {
                0 => FaultKind::Preempt,
                1 => FaultKind::Kill,
                2 => FaultKind::Freeze {
                    notice: Duration::from_secs(rng.random_range(1..=3)),
                    secs: rng.random_range(2..=10),
                },
                3 => FaultKind::AzuriteOutage {
                    hold: Duration::from_millis(rng.random_range(1000..=3000)),
                },
                4 => FaultKind::ImdsSlow {
                    // Slow but inside the client's 2 s timeout.
                    delay: Duration::from_millis(rng.random_range(300..=1500)),
                    count: rng.random_range(2..=5),
                },
                _ => FaultKind::ImdsFailing {
                    fault: match rng.random_range(0..3) {
                        0 => Fault::Status(StatusCode::SERVICE_UNAVAILABLE),
                        1 => Fault::Malformed,
                        _ => Fault::Drop,
                    },
                    // At most five: with the watcher's backoff that is
                    // about 7 s blind, well inside a 30 s notice. (Much
                    // longer and a Preempt is seen only after NotBefore,
                    // which no poller survives.)
                    count: rng.random_range(2..=5),
                },
            };
            let (lo, hi) = options.gap;
            PlannedFault {
                gap: rng.random_range(lo..=hi),
                kind,
                slot: rng.random_range(0..options.workers),
            }
        })
        .collect();
    shared_reboot::plan(rng, options, &mut plan);
    plan
}

/// The worker binary `examples/primes` of the profile this program was built
/// with, built first if it is missing or older than a source file (`cargo
/// test` builds it with the other targets; `cargo bench` does not).
pub fn worker_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("SPOT_WORKER_CHAOS_WORKER") {
        return Ok(PathBuf::from(path));
    }
    // This program is target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().context("locating this program")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("this program is not in target/<profile>/deps")?;
    let binary = profile_dir.join("examples").join("primes");
    let root = crate::workspace_root();
    let workspace = root.as_path();
    if is_fresh(&binary, workspace) {
        return Ok(binary);
    }
    let release = profile_dir
        .file_name()
        .is_some_and(|name| name == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build
        .current_dir(workspace)
        .args(["build", "--example", "primes"]);
    if release {
        build.arg("--release");
    }
    eprintln!("chaos: building the worker: {build:?}");
    let status = build.status().context("running cargo build")?;
    if !status.success() || !binary.exists() {
        bail!("building examples/primes failed ({status})");
    }
    Ok(binary)
}

/// True if `binary` exists and is newer than every Rust source and manifest
/// it could be built from.
fn is_fresh(binary: &Path, workspace: &Path) -> bool {
    fn newest(dir: &Path, newest_seen: &mut SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == "target" || name.starts_with('.') || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                newest(&path, newest_seen);
            } else if (name.ends_with(".rs") || name == "Cargo.toml" || name == "Cargo.lock")
                && let Ok(modified) = entry.metadata().and_then(|m| m.modified())
            {
                *newest_seen = (*newest_seen).max(modified);
            }
        }
    }
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else {
        return false;
    };
    let mut newest_source = SystemTime::UNIX_EPOCH;
    for dir in ["crates", "src", "examples"] {
        newest(&workspace.join(dir), &mut newest_source);
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        if let Ok(modified) = std::fs::metadata(workspace.join(file)).and_then(|m| m.modified()) {
            newest_source = newest_source.max(modified);
        }
    }
    built >= newest_source
}

/// What happened, for the figures and the checks.
#[derive(Debug, Default)]
pub struct Report {
    /// The seed of the schedule (replays it).
    pub seed: u64,
    /// Worker processes at a time.
    pub workers: usize,
    /// Jobs enqueued (the long one included).
    pub jobs: usize,
    /// Numbers in all the jobs' ranges.
    pub numbers: u64,
    /// Malformed messages enqueued.
    pub malformed: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Every fault injected: seconds since the start, kind, target.
    pub faults: Vec<(f64, String, String)>,
    /// VMs started, replacements included.
    pub vms_started: usize,
    /// Drains after a Preempt: (VM, notice-to-drained ms).
    pub preempt_drains: Vec<(String, u64)>,
    /// Drains after the final SIGTERM.
    pub stop_drains: Vec<(String, u64)>,
    /// Deliveries logged by the workers.
    pub deliveries: u64,
    /// Deliveries released by a drain.
    pub released_on_drain: u64,
    /// Deliveries that failed and were retried.
    pub retried: u64,
    /// Deliveries whose lease was lost.
    pub leases_lost: u64,
    /// Deliveries that waited for another holder of the job.
    pub fenced_out: u64,
    /// Deliveries of a job already completed (deleted, not run).
    pub already_completed: u64,
    /// Deliveries that ended without a checkpoint of where they got (killed,
    /// lease lost): each redid at most one chunk.
    pub cut_deliveries: u64,
    /// An upper bound of the numbers counted twice.
    pub redone_bound: u64,
    /// Deliveries that resumed from a checkpoint.
    pub resumed: u64,
    /// Results written again with the same content (harmless).
    pub identical_rewrites: u64,
    /// Jobs with conflicting results.
    pub duplicates: u64,
    /// Jobs without a result.
    pub lost: u64,
    /// Jobs whose result differs from an independent count.
    pub wrong: u64,
    /// Records in the poison queue.
    pub poisoned: usize,
    /// ERROR lines in the workers' logs.
    pub error_lines: u64,
    /// The long job's evictions, if the run had one.
    pub long_job: Option<long_job::Figures>,
    /// The shared Reboots, in schedule order.
    pub shared_reboots: Vec<shared_reboot::Record>,
    /// Where the logs were kept, if they were.
    pub log_dir: Option<PathBuf>,
    /// The checks that failed (empty: passed).
    pub failures: Vec<String>,
}

impl Report {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    fn fail(&mut self, failure: impl Into<String>) {
        self.failures.push(failure.into());
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos run, seed {} (replay: --seed {})",
            self.seed, self.seed
        )?;
        writeln!(
            f,
            "  jobs             {} ({} numbers) + {} malformed, {} workers at a time, {} VMs in all, {:.1} s",
            self.jobs,
            self.numbers,
            self.malformed,
            self.workers,
            self.vms_started,
            self.elapsed.as_secs_f64()
        )?;
        let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, kind, _) in &self.faults {
            let name = kind.split(' ').next().unwrap_or(kind);
            *by_kind.entry(name).or_default() += 1;
        }
        let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "  faults           {} ({})",
            self.faults.len(),
            kinds.join(", ")
        )?;
        let worst = |drains: &[(String, u64)]| drains.iter().map(|(_, ms)| *ms).max();
        writeln!(
            f,
            "  drains           {} after Preempt (worst {} ms), {} after the final SIGTERM (worst {} ms); budget 25000 ms",
            self.preempt_drains.len(),
            worst(&self.preempt_drains).map_or("-".to_owned(), |ms| ms.to_string()),
            self.stop_drains.len(),
            worst(&self.stop_drains).map_or("-".to_owned(), |ms| ms.to_string()),
        )?;
        writeln!(
            f,
            "  deliveries       {} ({} released by drains, {} resumed from a checkpoint, {} retried, {} leases lost, {} waited for another holder, {} already completed)",
            self.deliveries,
            self.released_on_drain,
            self.resumed,
            self.retried,
            self.leases_lost,
            self.fenced_out,
            self.already_completed
        )?;
        let share = if self.numbers == 0 {
            0.0
        } else {
            self.redone_bound as f64 * 100.0 / self.numbers as f64
        };
        writeln!(
            f,
            "  redone work      at most {} numbers ({share:.2} % of the work): {} deliveries cut without a checkpoint (SIGKILL, lost lease), at most one {CHUNK}-number chunk each; drains redo nothing",
            self.redone_bound, self.cut_deliveries
        )?;
        writeln!(
            f,
            "  duplicates       {} (conflicting results; identical rewrites, harmless: {})",
            self.duplicates, self.identical_rewrites
        )?;
        writeln!(
            f,
            "  lost             {} (wrong results: {}; poison queue: {} records)",
            self.lost, self.wrong, self.poisoned
        )?;
        if let Some(long) = &self.long_job {
            writeln!(f, "  long job         {long}")?;
        }
        for reboot in &self.shared_reboots {
            writeln!(f, "  shared reboot    {reboot}")?;
        }
        writeln!(f, "  ERROR log lines  {}", self.error_lines)?;
        writeln!(f, "  fault log:")?;
        for (at, kind, target) in &self.faults {
            writeln!(f, "    {at:7.1} s  {kind:<40} {target}")?;
        }
        if let Some(dir) = &self.log_dir {
            writeln!(f, "  worker logs      {}", dir.display())?;
        }
        if self.failures.is_empty() {
            writeln!(f, "  result           PASS")?;
        } else {
            writeln!(f, "  result           FAIL")?;
            for failure in &self.failures {
                writeln!(f, "    - {failure}")?;
            }
        }
        Ok(())
    }
}

/// How a VM's worker process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ending {
    Preempted,
    Killed,
    Stopped,
    /// It exited by itself when a shared Reboot it waited for started.
    Rebooted,
    /// It exited by itself, or did not exit in time after a notice.
    Unexpected(String),
}

/// One VM: a worker process with its own IMDS emulator.
#[derive(Clone, Debug)]
struct VmRecord {
    name: String,
    log: PathBuf,
    ending: Option<Ending>,
    exit: Option<String>,
    exit_ok: bool,
    ended_at: Option<SystemTime>,
}

enum Order {
    Fault(FaultKind),
    /// Preempt the VM if it is still the one named (it was seen holding the
    /// long job); answers whether it was.
    EvictIfCurrent {
        vm: String,
        evicted: oneshot::Sender<bool>,
    },
    Stop,
}

/// What the scripted steps need of a slot's running, ready VM.
#[derive(Clone)]
struct VmHandle {
    name: String,
    log: PathBuf,
    health: String,
    emulator: Emulator,
}

/// What every slot supervisor shares.
struct Shared {
    options: Options,
    connection_string: String,
    log_dir: PathBuf,
    started: Instant,
    vm_counter: AtomicUsize,
    faults: Mutex<Vec<(f64, String, String)>>,
    vms: Mutex<Vec<VmRecord>>,
    /// Per slot, its VM once ready, until it ends.
    current: Mutex<Vec<Option<VmHandle>>>,
    /// VMs that are to exit by themselves (a shared Reboot started), with
    /// the ending to record.
    expected_exits: Mutex<HashMap<String, Ending>>,
    /// Checks failed by the scripted steps, for the report.
    step_failures: Mutex<Vec<String>>,
    /// The shared Reboots run so far.
    reboots: Mutex<Vec<shared_reboot::Record>>,
    /// Set once the run is over: scripted steps stop waiting.
    stopping: AtomicBool,
    /// Held by a shared Reboot for its whole course and by each eviction of
    /// the long job: the evictions run besides the schedule, and a Preempt of
    /// a VM waiting for a shared Reboot would end it mid-check.
    exclusive_step: tokio::sync::Mutex<()>,
    http: reqwest::Client,
}

impl Shared {
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn record_fault(&self, kind: &FaultKind, target: &str) {
        self.record_fault_named(&kind.to_string(), target);
    }

    fn record_fault_named(&self, kind: &str, target: &str) {
        let at = self.now();
        let line = (at, kind.to_owned(), target.to_owned());
        eprintln!("chaos: {at:7.1} s  {:<40} {target}", line.1);
        self.faults.lock().unwrap().push(line);
    }

    fn step_failed(&self, failure: String) {
        eprintln!("chaos: FAILED: {failure}");
        self.step_failures.lock().unwrap().push(failure);
    }

    /// The slot's VM, if it is running and was ready.
    fn current(&self, slot: usize) -> Option<VmHandle> {
        self.current.lock().unwrap().get(slot).cloned().flatten()
    }

    /// The slot's VM is about to end (an order to Preempt or kill it was
    /// taken): scripted steps must not pick it any more.
    fn retire(&self, slot: usize) {
        if let Some(current) = self.current.lock().unwrap().get_mut(slot) {
            *current = None;
        }
    }

    /// Whether the VM's process has ended (as far as its supervisor knows).
    fn has_ended(&self, vm: &str) -> bool {
        self.ended_at(vm).is_some()
    }

    /// When the VM's process ended, if it has.
    fn ended_at(&self, vm: &str) -> Option<SystemTime> {
        self.vms
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.name == vm)
            .and_then(|r| r.ended_at)
    }

    fn record_end(&self, vm: &str, ending: Ending, exit: Option<ExitStatus>) {
        for current in self.current.lock().unwrap().iter_mut() {
            if current.as_ref().is_some_and(|c| c.name == vm) {
                *current = None;
            }
        }
        let mut vms = self.vms.lock().unwrap();
        if let Some(record) = vms.iter_mut().find(|r| r.name == vm) {
            record.ending = Some(ending);
            record.ended_at = Some(SystemTime::now());
            record.exit_ok = exit.is_some_and(|s| s.success());
            record.exit = Some(exit.map_or("did not exit".to_owned(), |s| s.to_string()));
        }
    }
}

/// A running VM.
struct Vm {
    name: String,
    log: PathBuf,
    emulator: RunningEmulator,
    child: Child,
    health: String,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

async fn boot_vm(shared: &Shared) -> Result<Vm> {
    let index = shared.vm_counter.fetch_add(1, Ordering::SeqCst);
    let name = format!("chaos_{index}");
    let emulator = Emulator::start(EmulatorConfig::for_vm(&name))
        .await
        .context("starting an IMDS emulator")?;
    let port = free_port()?;
    let log = shared.log_dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log)?;
    let options = &shared.options;
    let mut command = Command::new(&options.binary);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("AZURE_STORAGE_CONNECTION_STRING", &shared.connection_string)
        .env("SPOT_WORKER_QUEUE", QUEUE)
        .env("SPOT_WORKER_HEALTH_ADDR", format!("127.0.0.1:{port}"))
        .env("SPOT_WORKER_IMDS_ENDPOINT", emulator.url())
        .env("SPOT_WORKER_VM_NAME", &name)
        .env("SPOT_WORKER_IMDS_POLL_INTERVAL", "250ms")
        .env("SPOT_WORKER_CONCURRENCY", options.concurrency.to_string())
        .env(
            "SPOT_WORKER_VISIBILITY_TIMEOUT",
            format!("{}s", options.visibility_timeout.as_secs()),
        )
        .env("SPOT_WORKER_MAX_FAILURES", options.max_failures.to_string())
        .env("SPOT_WORKER_LOG_FORMAT", "json")
        // The consumer's debug lines (lease renewals, deletes) name the
        // message each delivery holds: how the harness finds the long job.
        .env("RUST_LOG", "info,spot_worker_storage=debug")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true);
    let child = command
        .spawn()
        .with_context(|| format!("starting {}", options.binary.display()))?;
    shared.vms.lock().unwrap().push(VmRecord {
        name: name.clone(),
        log: log.clone(),
        ending: None,
        exit: None,
        exit_ok: false,
        ended_at: None,
    });
    Ok(Vm {
        name,
        log,
        emulator,
        child,
        health: format!("http://127.0.0.1:{port}/readyz"),
    })
}

/// Resolves once the worker's `/readyz` answers 200 (polled every 100 ms:
/// the worker offers no push notification of readiness).
async fn ready(http: &reqwest::Client, url: &str) {
    loop {
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_exit(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    match tokio::time::timeout(bound, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    }
}

/// Runs one worker slot: boots a VM, applies the faults sent to it once the
/// worker is ready, and replaces the VM whenever it is gone (as a scale set
/// replaces an evicted instance).
async fn supervise(shared: Arc<Shared>, slot: usize, mut commands: mpsc::Receiver<Order>) {
    loop {
        let mut vm = match boot_vm(&shared).await {
            Ok(vm) => vm,
            Err(error) => {
                eprintln!("chaos: slot {slot}: {error:#}");
                return;
            }
        };
        // Faults wait until the worker is ready: one that is still warming
        // up would not show how a working worker copes.
        let exited = tokio::select! {
            () = ready(&shared.http, &vm.health) => None,
            status = vm.child.wait() => Some(status.ok()),
        };
        if let Some(status) = exited {
            let ending = Ending::Unexpected(format!("exited before it was ready: {status:?}"));
            shared.record_end(&vm.name, ending, status);
            continue;
        }
        shared.current.lock().unwrap()[slot] = Some(VmHandle {
            name: vm.name.clone(),
            log: vm.log.clone(),
            health: vm.health.clone(),
            emulator: (*vm.emulator).clone(),
        });
        loop {
            let command = tokio::select! {
                status = vm.child.wait() => {
                    let status = status.ok();
                    let expected = shared.expected_exits.lock().unwrap().remove(&vm.name);
                    let ending = expected.unwrap_or_else(|| Ending::Unexpected(format!("exited by itself: {status:?}")));
                    shared.record_end(&vm.name, ending, status);
                    break;
                }
                command = commands.recv() => command.unwrap_or(Order::Stop),
            };
            match command {
                Order::Stop => {
                    if let Some(pid) = vm.child.id().and_then(|id| i32::try_from(id).ok()) {
                        // SAFETY: kill(2) on our own child's pid.
                        unsafe {
                            libc::kill(pid, libc::SIGTERM);
                        }
                    }
                    let status = wait_exit(&mut vm.child, STOP_EXIT_BOUND).await;
                    shared.record_end(&vm.name, Ending::Stopped, status);
                    let _ = vm.emulator.shutdown().await;
                    return;
                }
                Order::EvictIfCurrent { vm: name, evicted } => {
                    if name != vm.name {
                        let _ = evicted.send(false);
                        continue;
                    }
                    shared.retire(slot);
                    shared.record_fault_named("evict-long-job", &vm.name);
                    preempt(&shared, &mut vm).await;
                    let _ = evicted.send(true);
                    break;
                }
                Order::Fault(kind) => {
                    if matches!(kind, FaultKind::Preempt | FaultKind::Kill) {
                        shared.retire(slot);
                    }
                    shared.record_fault(&kind, &vm.name);
                    match kind {
                        FaultKind::Preempt => {
                            preempt(&shared, &mut vm).await;
                            break;
                        }
                        FaultKind::Kill => {
                            let _ = vm.child.start_kill();
                            let status = vm.child.wait().await.ok();
                            shared.record_end(&vm.name, Ending::Killed, status);
                            break;
                        }
                        FaultKind::Freeze { notice, secs } => {
                            let spec = EventSpec::freeze().notice(notice).duration_secs(secs);
                            if let Err(error) = vm.emulator.schedule(spec) {
                                eprintln!("chaos: scheduling a Freeze failed: {error}");
                            }
                        }
                        FaultKind::ImdsSlow { delay, count } => {
                            vm.emulator.inject_faults(Fault::Delay(delay), count);
                        }
                        FaultKind::ImdsFailing { fault, count } => {
                            vm.emulator.inject_faults(fault, count);
                        }
                        // Run by the schedule itself (they span slots).
                        FaultKind::AzuriteOutage { .. } | FaultKind::SharedReboot { .. } => {}
                    }
                }
            }
        }
        let _ = vm.emulator.shutdown().await;
    }
}

/// Posts a Preempt to the VM and waits (bounded) for its worker to exit;
/// records how it ended.
async fn preempt(shared: &Shared, vm: &mut Vm) {
    let not_before = match vm.emulator.schedule(EventSpec::preempt()) {
        Ok(event) => event.not_before,
        Err(error) => {
            eprintln!("chaos: scheduling a Preempt failed: {error}");
            None
        }
    };
    let status = wait_exit(&mut vm.child, PREEMPT_EXIT_BOUND).await;
    // Our own deadline check, besides the worker's `met_deadline`: gone
    // before NotBefore, when Azure would take the VM away.
    let ending = match not_before {
        _ if status.is_none() => Ending::Unexpected(format!(
            "still running {PREEMPT_EXIT_BOUND:?} after a Preempt notice"
        )),
        Some(at) if SystemTime::now() >= at => {
            Ending::Unexpected("exited after the Preempt's NotBefore".to_owned())
        }
        _ => Ending::Preempted,
    };
    shared.record_end(&vm.name, ending, status);
}

fn storage_client(connection_string: &str) -> Result<AzureStorage> {
    let mut config = StorageConfig::from_connection_string(connection_string)?;
    config.retry = RetryConfig {
        max_retries: 3,
        initial_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(500),
        max_elapsed: Duration::from_secs(5),
    };
    Ok(AzureStorage::new(config)?)
}

/// The storage state the run waits for: every result written, every
/// malformed message poisoned, nothing left in the queue.
struct Progress {
    /// Jobs with a result.
    done: usize,
    poison: Vec<String>,
    queued: u64,
}

/// Runs the chaos run and returns its report (with its failed checks).
pub async fn run(options: Options) -> Result<Report> {
    let mut report = Report {
        seed: options.seed,
        workers: options.workers,
        jobs: options.jobs,
        malformed: options.malformed.min(MALFORMED.len()),
        ..Report::default()
    };
    let mut rng = StdRng::seed_from_u64(options.seed);
    // Jobs draw their ranges from a pool a third their number: the
    // independent check recounts each distinct range once, so it costs a
    // third of the work instead of as much again.
    let ranges: Vec<(u64, u64)> = (0..options.jobs.div_ceil(3))
        .map(|_| {
            let span = rng.random_range(options.job_span.0..=options.job_span.1);
            let start = rng.random_range(0..1_000_000_000);
            (start, start + span)
        })
        .collect();
    let mut jobs: Vec<PrimesJob> = (0..options.jobs)
        .map(|i| {
            let (start, end) = ranges[rng.random_range(0..ranges.len())];
            PrimesJob::new(format!("job-{i:04}"), start, end).expect("a valid job")
        })
        .collect();
    // The long job is jobs[0], enqueued before the rest.
    if let Some(long) = &options.long_job {
        jobs.insert(0, long.job(&mut rng));
    }
    report.jobs = jobs.len();
    report.numbers = jobs.iter().map(|j| j.end - j.start).sum();
    let malformed: Vec<&str> = MALFORMED[..report.malformed].to_vec();
    let mut messages: Vec<(Option<usize>, String)> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| (Some(i), job.to_message()))
        .chain(malformed.iter().map(|body| (None, (*body).to_owned())))
        .collect();
    let first = usize::from(options.long_job.is_some());
    messages[first..].shuffle(&mut rng);
    let plan = plan_faults(&mut rng, &options);
    eprintln!(
        "chaos: seed {} — {} jobs, {} malformed, {} workers, {} faults planned",
        options.seed,
        jobs.len(),
        malformed.len(),
        options.workers,
        plan.len()
    );

    // Expected results, computed meanwhile on another thread.
    let expected = {
        let jobs = jobs.clone();
        tokio::task::spawn_blocking(move || {
            let mut counted: HashMap<(u64, u64), Value> = HashMap::new();
            jobs.iter()
                .map(|job| {
                    let primes = counted
                        .entry((job.start, job.end))
                        .or_insert_with(|| expected_result(job)["primes"].clone())
                        .clone();
                    serde_json::json!({
                        "job_id": job.job_id, "start": job.start, "end": job.end, "primes": primes
                    })
                })
                .collect::<Vec<_>>()
        })
    };

    let azurite = tokio::task::spawn_blocking(Azurite::start)
        .await?
        .context("starting azurite (run `npm ci --prefix tools/azurite`)")?;
    let connection_string = azurite.connection_string();
    let azurite = Arc::new(Mutex::new(azurite));
    let storage = storage_client(&connection_string)?;
    let queue = storage.queue(QUEUE)?;
    let poison = storage.poison_queue(QUEUE)?;
    let results = storage.result_store(RESULTS)?;
    queue.prepare().await?;
    poison.prepare().await?;
    results.prepare().await?;
    let mut job_of_message: HashMap<String, usize> = HashMap::new();
    let mut long_job_message = None;
    for (job, body) in &messages {
        let id = queue.send(body, Duration::ZERO).await?;
        if let Some(job) = job {
            job_of_message.insert(id.as_str().to_owned(), *job);
            if *job == 0 && options.long_job.is_some() {
                long_job_message = Some(id.as_str().to_owned());
            }
        }
    }

    let log_dir = std::env::temp_dir().join(format!(
        "spot-worker-chaos-{}-{}",
        options.seed,
        std::process::id()
    ));
    std::fs::create_dir_all(&log_dir)?;
    let shared = Arc::new(Shared {
        options: options.clone(),
        connection_string,
        log_dir: log_dir.clone(),
        started: Instant::now(),
        vm_counter: AtomicUsize::new(0),
        faults: Mutex::new(Vec::new()),
        vms: Mutex::new(Vec::new()),
        current: Mutex::new(vec![None; options.workers]),
        expected_exits: Mutex::new(HashMap::new()),
        step_failures: Mutex::new(Vec::new()),
        reboots: Mutex::new(Vec::new()),
        stopping: AtomicBool::new(false),
        exclusive_step: tokio::sync::Mutex::new(()),
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()?,
    });
    let mut slots = Vec::new();
    let mut supervisors = Vec::new();
    for slot in 0..options.workers {
        let (tx, rx) = mpsc::channel(64);
        slots.push(tx);
        supervisors.push(tokio::spawn(supervise(Arc::clone(&shared), slot, rx)));
    }

    let deadline = tokio::time::Instant::now() + options.timeout;
    // The long job's evictions run besides the schedule, from the start.
    let evictions = match (&options.long_job, &long_job_message) {
        (Some(long), Some(message_id)) => Some(tokio::spawn(long_job::evict_repeatedly(
            Arc::clone(&shared),
            slots.clone(),
            long.clone(),
            message_id.clone(),
            StdRng::seed_from_u64(rng.random()),
        ))),
        _ => None,
    };
    let outcome = async {
        for fault in &plan {
            tokio::time::sleep(fault.gap).await;
            if let FaultKind::SharedReboot { .. } = fault.kind {
                let record = shared_reboot::run(&shared, &slots, fault.slot, &fault.kind).await;
                shared.reboots.lock().unwrap().push(record);
            } else if let FaultKind::AzuriteOutage { hold } = fault.kind {
                shared.record_fault(&fault.kind, "azurite");
                let azurite = Arc::clone(&azurite);
                tokio::task::spawn_blocking(move || -> Result<()> {
                    let mut azurite = azurite.lock().unwrap();
                    azurite.stop()?;
                    // The outage itself: storage is gone for this long.
                    std::thread::sleep(hold);
                    azurite.start_again()?;
                    Ok(())
                })
                .await??;
            } else {
                slots[fault.slot]
                    .send(Order::Fault(fault.kind.clone()))
                    .await
                    .ok();
            }
        }
        // Then until storage shows everything done (polled: storage has no
        // notifications), asking only for the results still missing.
        let mut done = HashSet::new();
        loop {
            if let Ok(p) = storage_progress(&jobs, &mut done, &results, &poison, &queue).await
                && p.done == jobs.len()
                && p.poison.len() >= malformed.len()
                && p.queued == 0
            {
                return Ok::<_, anyhow::Error>(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let finished = tokio::time::timeout_at(deadline, outcome).await;
    report.elapsed = shared.started.elapsed();
    match finished {
        Ok(Ok(())) => {}
        Ok(Err(error)) => report.fail(format!("the run failed: {error:#}")),
        Err(_) => report.fail(format!(
            "not finished within {:?} (results, poison queue or queue incomplete)",
            options.timeout
        )),
    }

    // It gives up once the job is done or the run is over.
    shared.stopping.store(true, Ordering::SeqCst);
    let evicted = match evictions {
        Some(task) => Some(
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .map_err(|_| anyhow::anyhow!("the long job's evictions did not stop"))??,
        ),
        None => None,
    };

    // Every worker stops with SIGTERM, which drains like a notice.
    for slot in &slots {
        let _ = slot.send(Order::Stop).await;
    }
    for supervisor in supervisors {
        let _ = tokio::time::timeout(STOP_EXIT_BOUND + Duration::from_secs(10), supervisor).await;
    }
    drop(slots);

    // The checks, with our own reads of storage.
    let expected = expected.await?;
    let progress = storage_progress(&jobs, &mut HashSet::new(), &results, &poison, &queue).await?;
    for (i, job) in jobs.iter().enumerate() {
        match results.get(&job.result_name()).await? {
            None => report.lost += 1,
            Some(bytes) => {
                let got: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                if got != expected[i] {
                    report.wrong += 1;
                    report.fail(format!(
                        "{}: result {got} but {} expected",
                        job.job_id, expected[i]
                    ));
                }
            }
        }
    }
    if progress.queued != 0 {
        report.fail(format!(
            "{} messages left in the queue {QUEUE}",
            progress.queued
        ));
    }
    report.poisoned = progress.poison.len();
    let mut unmatched: Vec<&str> = malformed.clone();
    for body in &progress.poison {
        if let Some(at) = unmatched.iter().position(|m| m == body) {
            unmatched.remove(at);
        } else {
            let job = jobs.iter().position(|j| j.to_message() == *body);
            if let Some(job) = job {
                report.fail(format!("job {} was poisoned", jobs[job].job_id));
            } else {
                report.fail(format!("unexpected poison record body {body:?}"));
            }
        }
    }
    for body in unmatched {
        report.fail(format!(
            "malformed message {body:?} is not in the poison queue"
        ));
    }

    report.faults = shared.faults.lock().unwrap().clone();
    let vms = shared.vms.lock().unwrap().clone();
    report.vms_started = vms.len();
    analyse_logs(&mut report, &vms, &job_of_message, &jobs)?;
    if let (Some(long), Some(message_id), Some(evicted)) =
        (&options.long_job, &long_job_message, evicted)
    {
        long_job::check(&mut report, long, &options, message_id, evicted, &vms)?;
    }
    report.shared_reboots = shared.reboots.lock().unwrap().clone();
    for failure in shared.step_failures.lock().unwrap().drain(..) {
        report.fail(failure);
    }
    if report.lost > 0 {
        report.fail(format!("{} jobs lost (no result)", report.lost));
    }
    if report.duplicates > 0 {
        report.fail(format!("{} conflicting results", report.duplicates));
    }

    let keep = options.keep_logs || !report.passed();
    if keep {
        report.log_dir = Some(log_dir);
    } else {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(report)
}

/// Where storage stands; `done` holds the jobs known to have a result and
/// is extended.
async fn storage_progress(
    jobs: &[PrimesJob],
    done: &mut HashSet<usize>,
    results: &impl spot_worker::storage::ResultStore,
    poison: &AzureQueue,
    queue: &AzureQueue,
) -> Result<Progress> {
    for (i, job) in jobs.iter().enumerate() {
        if !done.contains(&i) && results.get(&job.result_name()).await?.is_some() {
            done.insert(i);
        }
    }
    let done = done.len();
    let poison = poison
        .peek(32)
        .await?
        .into_iter()
        .map(|m| match PoisonRecord::from_message_text(&m.body) {
            Ok(PoisonRecord {
                body: Some(body), ..
            }) => body,
            _ => m.body,
        })
        .collect();
    let queued = queue.approximate_message_count().await?;
    Ok(Progress {
        done,
        poison,
        queued,
    })
}

/// The consumer's log message for a delivery released by a drain.
const RELEASED: &str = "released on shutdown (not counted as a failure)";
/// ... for a delivery that found another holder of its job making progress.
const WAITED_FOR_PEER: &str =
    "another holder of this job wrote newer progress; checking again later (not a failure)";
/// ... for a delivery of a job completed on an earlier one.
const ALREADY_COMPLETED: &str = "the job is completed already; deleted without running it";

/// One JSON log line of a worker.
struct Line {
    /// RFC 3339, UTC: orders lines across VMs as text.
    timestamp: String,
    level: String,
    message: String,
    fields: serde_json::Map<String, Value>,
    span: serde_json::Map<String, Value>,
}

fn parse_line(text: &str) -> Option<Line> {
    let value: Value = serde_json::from_str(text).ok()?;
    let fields = value.get("fields")?.as_object()?.clone();
    Some(Line {
        timestamp: value
            .get("timestamp")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        level: value.get("level")?.as_str()?.to_owned(),
        message: fields.get("message")?.as_str()?.to_owned(),
        span: value
            .get("span")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        fields,
    })
}

impl Line {
    /// The message this line is about: its delivery's span (the consumer's
    /// or the handler's) or its own field (lease renewals).
    fn message_id(&self) -> Option<&str> {
        ["message_id", "messaging.message.id"]
            .iter()
            .find_map(|name| self.span.get(*name).or_else(|| self.fields.get(*name)))
            .and_then(Value::as_str)
    }
}

/// A worker's log so far, its JSON lines only (a missing file reads as
/// empty: the worker has not started writing).
fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(parse_line)
        .collect()
}

/// The drains, deliveries and conflicts the workers logged, checked against
/// how each VM ended.
fn analyse_logs(
    report: &mut Report,
    vms: &[VmRecord],
    job_of_message: &HashMap<String, usize>,
    jobs: &[PrimesJob],
) -> Result<()> {
    // Per job: the most deliveries seen, drains that released it, retries.
    let mut deliveries: HashMap<usize, u64> = HashMap::new();
    let mut saved: HashMap<usize, u64> = HashMap::new();
    let mut lost_leases: HashSet<(String, String)> = HashSet::new();
    for vm in vms {
        let text = std::fs::read_to_string(&vm.log)
            .with_context(|| format!("reading {}", vm.log.display()))?;
        let mut drains = Vec::new();
        let mut triggers = Vec::new();
        for raw in text.lines().filter(|l| !l.trim().is_empty()) {
            let Some(line) = parse_line(raw) else {
                // Only `main` writes plain text, and only for an error.
                report.error_lines += 1;
                report.fail(format!("{}: {raw}", vm.name));
                continue;
            };
            if line.level == "ERROR" {
                report.error_lines += 1;
            }
            if raw.contains("a different result is stored already") {
                report.duplicates += 1;
            }
            // The consumer's span names the delivery `message_id` and
            // `dequeue_count`; the handler's (OpenTelemetry) span names them
            // by the messaging conventions.
            let span_field = |names: [&str; 2]| names.iter().find_map(|n| line.span.get(*n));
            let message_id = span_field(["message_id", "messaging.message.id"])
                .and_then(Value::as_str)
                .map(str::to_owned);
            let job = message_id
                .as_deref()
                .and_then(|id| job_of_message.get(id))
                .copied();
            let dequeue_count = span_field([
                "dequeue_count",
                "messaging.azure_storage_queue.message.dequeue_count",
            ])
            .and_then(Value::as_u64);
            if let (Some(job), Some(count)) = (job, dequeue_count) {
                let seen = deliveries.entry(job).or_default();
                *seen = (*seen).max(count);
            }
            match line.message.as_str() {
                "draining: intake stopped, handlers asked to checkpoint" => {
                    triggers.push(
                        line.fields
                            .get("trigger")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    );
                }
                "drained" => {
                    let ms = line
                        .fields
                        .get("notice_to_drained_ms")
                        .and_then(Value::as_u64)
                        .unwrap_or(u64::MAX);
                    let met = line.fields.get("met_deadline").and_then(Value::as_bool);
                    if met != Some(true) {
                        report.fail(format!(
                            "{}: a drain missed its deadline ({ms} ms)",
                            vm.name
                        ));
                    }
                    drains.push(ms);
                }
                RELEASED => {
                    report.released_on_drain += 1;
                    if let Some(job) = job {
                        *saved.entry(job).or_default() += 1;
                    }
                }
                "handler failed; will retry" => {
                    if let Some(job) = job {
                        report.retried += 1;
                        *saved.entry(job).or_default() += 1;
                    }
                }
                "resuming from the checkpoint" => report.resumed += 1,
                "the identical result already existed" => report.identical_rewrites += 1,
                WAITED_FOR_PEER => {
                    report.fenced_out += 1;
                }
                ALREADY_COMPLETED => {
                    report.already_completed += 1;
                    if let Some(job) = job {
                        *saved.entry(job).or_default() += 1;
                    }
                }
                message if message.starts_with("lease lost") => {
                    let delivery = format!("{message_id:?}/{dequeue_count:?}");
                    if lost_leases.insert((vm.name.clone(), delivery)) {
                        report.leases_lost += 1;
                    }
                }
                _ => {}
            }
        }
        for trigger in &triggers {
            if trigger.contains("Freeze") {
                report.fail(format!(
                    "{}: drained on a short Freeze ({trigger})",
                    vm.name
                ));
            }
        }
        match &vm.ending {
            Some(ending @ (Ending::Preempted | Ending::Stopped | Ending::Rebooted)) => {
                let preempted = *ending == Ending::Preempted;
                let expected_trigger = match ending {
                    Ending::Preempted => "Preempt",
                    Ending::Rebooted => "Reboot",
                    _ => "SIGTERM",
                };
                if !vm.exit_ok {
                    report.fail(format!(
                        "{}: exit status {} after {expected_trigger}",
                        vm.name,
                        vm.exit.as_deref().unwrap_or("unknown"),
                    ));
                }
                if !triggers.iter().any(|t| t.contains(expected_trigger)) {
                    // "shutdown requested" after a Preempt means the worker
                    // saw the event's token cancelled but not its notice,
                    // and so planned by the drain budget instead of
                    // NotBefore and did not approve the event.
                    report.fail(format!(
                        "{}: no drain triggered by {expected_trigger} (triggers: {triggers:?})",
                        vm.name
                    ));
                }
                // The last drain ended the process (an earlier one was for
                // a shared Reboot that was cancelled).
                match drains.last() {
                    Some(ms) if preempted => report.preempt_drains.push((vm.name.clone(), *ms)),
                    Some(_) if *ending == Ending::Rebooted => {}
                    Some(ms) => report.stop_drains.push((vm.name.clone(), *ms)),
                    None => report.fail(format!("{}: no \"drained\" log line", vm.name)),
                }
            }
            Some(Ending::Killed) => {}
            Some(Ending::Unexpected(why)) => report.fail(format!("{}: {why}", vm.name)),
            None => report.fail(format!("{}: still running at the end", vm.name)),
        }
    }
    report.deliveries = deliveries.values().sum();
    for (job, count) in &deliveries {
        // One delivery completed the job; drained and failed ones saved
        // where they got; the rest were cut (killed, lease lost) and lost
        // at most the chunk in progress.
        let cut = count
            .saturating_sub(1)
            .saturating_sub(saved.get(job).copied().unwrap_or(0));
        report.cut_deliveries += cut;
        let span = jobs[*job].end - jobs[*job].start;
        report.redone_bound += cut * CHUNK.min(span);
    }
    Ok(())
}

/// Parses `--seed N`, `--jobs N`, `--timeout SECS`, `--keep-logs` on top of
/// `options`; ignores what is not ours (`cargo bench` passes `--bench`).
pub fn parse_args(options: &mut Options, args: &[String]) -> Result<()> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().context("a value after the flag");
        match arg.as_str() {
            "--seed" => options.seed = value()?.parse().context("--seed")?,
            "--jobs" => options.jobs = value()?.parse().context("--jobs")?,
            "--timeout" => {
                options.timeout = Duration::from_secs(value()?.parse().context("--timeout")?);
            }
            "--keep-logs" => options.keep_logs = true,
            _ => {}
        }
    }
    Ok(())
}
