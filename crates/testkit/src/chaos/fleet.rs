//! The fleet's shared state: every VM started (its record and how it
//! ended), each slot's current VM, the orders a slot's supervisor takes,
//! and the log of faults injected. Shared by the slot supervisors, the
//! schedule and the scripted steps (the long job, the shared Reboots).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use spot_worker_imds_emulator::Emulator;
use tokio::sync::oneshot;

use super::{FaultKind, Options, shared_reboot};

/// How a VM's worker process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ending {
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
pub(super) struct VmRecord {
    pub(super) name: String,
    /// Whether it serves the regular lane (a regular-priority VM).
    pub(super) regular: bool,
    /// Whether it runs `spot-worker run` on the command jobs' queue (see
    /// `command_jobs.rs`) rather than `examples/primes`.
    pub(super) command: bool,
    pub(super) log: PathBuf,
    pub(super) ending: Option<Ending>,
    pub(super) exit: Option<String>,
    pub(super) exit_ok: bool,
    pub(super) ended_at: Option<SystemTime>,
}

/// What the schedule (or the long job's evictions) asks of a slot's
/// supervisor.
pub(super) enum Order {
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
pub(super) struct VmHandle {
    pub(super) name: String,
    pub(super) log: PathBuf,
    pub(super) health: String,
    pub(super) emulator: Emulator,
}

/// What every slot supervisor shares.
pub(super) struct Shared {
    pub(super) options: Options,
    pub(super) connection_string: String,
    pub(super) log_dir: PathBuf,
    pub(super) started: Instant,
    pub(super) vm_counter: AtomicUsize,
    pub(super) faults: Mutex<Vec<(f64, String, String)>>,
    pub(super) vms: Mutex<Vec<VmRecord>>,
    /// Per slot, its VM once ready, until it ends.
    pub(super) current: Mutex<Vec<Option<VmHandle>>>,
    /// VMs that are to exit by themselves (a shared Reboot started), with
    /// the ending to record.
    pub(super) expected_exits: Mutex<HashMap<String, Ending>>,
    /// Checks failed by the scripted steps, for the report.
    pub(super) step_failures: Mutex<Vec<String>>,
    /// The shared Reboots run so far.
    pub(super) reboots: Mutex<Vec<shared_reboot::Record>>,
    /// Set once the run is over: scripted steps stop waiting.
    pub(super) stopping: AtomicBool,
    /// Held by a shared Reboot for its whole course and by each eviction of
    /// the long job: the evictions run besides the schedule, and a Preempt of
    /// a VM waiting for a shared Reboot would end it mid-check.
    pub(super) exclusive_step: tokio::sync::Mutex<()>,
    pub(super) http: reqwest::Client,
    /// What the command VMs run: the `spot-worker` command, Python and
    /// the program (with command jobs only).
    pub(super) command_program: Option<CommandProgram>,
}

/// What a command VM runs (see `command_jobs.rs`).
#[derive(Clone, Debug)]
pub(super) struct CommandProgram {
    pub(super) cli: PathBuf,
    pub(super) python: PathBuf,
    pub(super) script: PathBuf,
    pub(super) checkpoint_every: Duration,
}

impl Shared {
    /// Nothing started yet: no VM, no fault; the run's clock started at
    /// `started`.
    pub(super) fn new(
        options: &Options,
        connection_string: String,
        log_dir: PathBuf,
        started: Instant,
        command_program: Option<CommandProgram>,
    ) -> Result<Shared> {
        Ok(Shared {
            options: options.clone(),
            connection_string,
            log_dir,
            started,
            vm_counter: AtomicUsize::new(0),
            faults: Mutex::new(Vec::new()),
            vms: Mutex::new(Vec::new()),
            current: Mutex::new(vec![None; options.slots()]),
            expected_exits: Mutex::new(HashMap::new()),
            step_failures: Mutex::new(Vec::new()),
            reboots: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            exclusive_step: tokio::sync::Mutex::new(()),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(2))
                .build()?,
            command_program,
        })
    }

    pub(super) fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub(super) fn record_fault(&self, kind: &FaultKind, target: &str) {
        self.record_fault_named(&kind.to_string(), target);
    }

    pub(super) fn record_fault_named(&self, kind: &str, target: &str) {
        let at = self.now();
        let line = (at, kind.to_owned(), target.to_owned());
        eprintln!("chaos: {at:7.1} s  {:<40} {target}", line.1);
        self.faults.lock().unwrap().push(line);
    }

    pub(super) fn step_failed(&self, failure: String) {
        eprintln!("chaos: FAILED: {failure}");
        self.step_failures.lock().unwrap().push(failure);
    }

    /// The slot's VM, if it is running and was ready.
    pub(super) fn current(&self, slot: usize) -> Option<VmHandle> {
        self.current.lock().unwrap().get(slot).cloned().flatten()
    }

    /// The slot's VM is about to end (an order to Preempt or kill it was
    /// taken): scripted steps must not pick it any more.
    pub(super) fn retire(&self, slot: usize) {
        if let Some(current) = self.current.lock().unwrap().get_mut(slot) {
            *current = None;
        }
    }

    /// Whether the VM's process has ended (as far as its supervisor knows).
    pub(super) fn has_ended(&self, vm: &str) -> bool {
        self.ended_at(vm).is_some()
    }

    /// When the VM's process ended, if it has.
    pub(super) fn ended_at(&self, vm: &str) -> Option<SystemTime> {
        self.vms
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.name == vm)
            .and_then(|r| r.ended_at)
    }

    pub(super) fn record_end(&self, vm: &str, ending: Ending, exit: Option<ExitStatus>) {
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
