//! One emulated Spot VM: an IMDS emulator of its own and a worker process
//! (the real `examples/primes` binary, or for the command jobs the real
//! `spot-worker run -- PROGRAM`) configured only through its environment,
//! as `spot-worker.service` configures it on a real VM.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, Result};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use tokio::process::{Child, Command};

use super::command_jobs::COMMAND_QUEUE;
use super::fleet::{CommandProgram, Shared, VmRecord};
use super::{Options, QUEUE, lanes};
use spot_worker_decisions::lanes::Lane;

/// What a worker slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotKind {
    /// `examples/primes` in the Spot lane (the fault schedule's targets).
    Spot,
    /// `examples/primes` serving the regular lane.
    Regular,
    /// `spot-worker run` on the command jobs' queue (see `command_jobs.rs`).
    Command,
}

impl SlotKind {
    /// The kind of the slot at `slot`, by [`Options::slots`]' order.
    pub(super) fn of(options: &Options, slot: usize) -> SlotKind {
        if slot < options.workers {
            SlotKind::Spot
        } else if slot < options.workers + options.regular_workers {
            SlotKind::Regular
        } else {
            SlotKind::Command
        }
    }
}

/// A running VM.
pub(super) struct Vm {
    pub(super) name: String,
    pub(super) log: PathBuf,
    pub(super) emulator: RunningEmulator,
    pub(super) child: Child,
    pub(super) health: String,
}

/// The lanes' settings, when the run has a regular lane: a regular VM
/// runs one job at a time, as the regular pool does.
fn lane_env(options: &Options, lane: Lane) -> Vec<(&'static str, String)> {
    if options.regular_workers == 0 {
        return Vec::new();
    }
    let mut env = lanes::worker_env(lane);
    if lane == Lane::Regular {
        env.push(("SPOT_WORKER_CONCURRENCY", "1".to_owned()));
    }
    env
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Starts a VM of `kind`: its own IMDS emulator, and the worker process
/// pointed at it, logging JSON to a file of its own.
pub(super) async fn boot_vm(shared: &Shared, kind: SlotKind) -> Result<Vm> {
    let index = shared.vm_counter.fetch_add(1, Ordering::SeqCst);
    let (name, lane) = match kind {
        SlotKind::Spot => (format!("chaos_{index}"), Lane::Spot),
        SlotKind::Regular => (format!("chaos_regular_{index}"), Lane::Regular),
        SlotKind::Command => (format!("chaos_command_{index}"), Lane::Spot),
    };
    let emulator = Emulator::start(EmulatorConfig::for_vm(&name))
        .await
        .context("starting an IMDS emulator")?;
    let port = free_port()?;
    let log = shared.log_dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log)?;
    let options = &shared.options;
    let mut command = match (kind, &shared.command_program) {
        (SlotKind::Command, Some(program)) => Command::new(&program.cli),
        (SlotKind::Command, None) => anyhow::bail!("a command slot without a program"),
        _ => Command::new(&options.binary),
    };
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
        // The goodput check bounds what a delivery cut without a word lost
        // by one checkpoint interval, so the interval is fixed at the one it
        // assumes. Adaptive, it is Daly's from the measured cost of a save
        // and the fleet's losses, spread over the rest of the job, and can
        // pass 10 s (a resumed long job once went 15 s without a save).
        .env(
            "SPOT_WORKER_CHECKPOINT_EVERY",
            format!(
                "{}s",
                spot_worker_primes::DEFAULT_CHECKPOINT_EVERY.as_secs()
            ),
        )
        .env("SPOT_WORKER_LOG_FORMAT", "json")
        // The consumer's debug lines (lease renewals, deletes, `handler
        // started`) name the message each delivery holds: how the harness
        // finds the long job, and where each delivery's handler time began;
        // the job's own (chunks counted, progress saved) show what each
        // delivery redid, for the goodput check; the runner's, each save of
        // a command job's checkpoint. (The consumer is its own crate since
        // the store's split: without its target here, the goodput check saw
        // no delivery's start.)
        .env(
            "RUST_LOG",
            "info,spot_worker_storage=debug,spot_worker_consumer=debug,spot_worker_primes=debug,spot_worker_command=debug",
        );
    match (kind, &shared.command_program) {
        (SlotKind::Command, Some(program)) => command_worker(&mut command, program),
        _ => {
            command.envs(lane_env(&shared.options, lane));
        }
    }
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true);
    let child = command
        .spawn()
        .with_context(|| format!("starting the worker of {name}"))?;
    shared.vms.lock().unwrap().push(VmRecord {
        name: name.clone(),
        regular: kind == SlotKind::Regular,
        command: kind == SlotKind::Command,
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

/// Makes `command` (the `spot-worker` command, its environment set) run
/// the command jobs' program on their queue, one job at a time (its
/// settings override the `primes` workers'); the job key is the message's `job_id`, and the result the
/// blob `<job_id>.digest`.
fn command_worker(command: &mut Command, program: &CommandProgram) {
    command
        .args([
            "run",
            "--job-key",
            "job_id",
            "--result-name",
            "{job_key}.digest",
        ])
        .arg("--")
        .arg(&program.python)
        .arg(&program.script)
        .env("SPOT_WORKER_QUEUE", COMMAND_QUEUE)
        .env("SPOT_WORKER_CONCURRENCY", "1")
        // Saves often, so that an eviction soon after one finds a
        // checkpoint of several chunks to restore.
        .env(
            "SPOT_WORKER_CHECKPOINT_EVERY",
            format!("{}s", program.checkpoint_every.as_secs().max(1)),
        );
}

/// Resolves once the worker's `/readyz` answers 200 (polled every 100 ms:
/// the worker offers no push notification of readiness).
pub(super) async fn ready(http: &reqwest::Client, url: &str) {
    loop {
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The worker's exit status, if it exits within `bound`; killed otherwise.
pub(super) async fn wait_exit(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    match tokio::time::timeout(bound, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    }
}
