//! One emulated Spot VM: an IMDS emulator of its own and a worker process
//! (the real `examples/primes` binary) configured only through its
//! environment, as `spot-worker.service` configures it on a real VM.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, Result};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use tokio::process::{Child, Command};

use super::fleet::{Shared, VmRecord};
use super::{Options, QUEUE, lanes};
use spot_worker_decisions::lanes::Lane;

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

/// Starts a VM of `lane`: its own IMDS emulator, and the worker process
/// pointed at it, logging JSON to a file of its own.
pub(super) async fn boot_vm(shared: &Shared, lane: Lane) -> Result<Vm> {
    let index = shared.vm_counter.fetch_add(1, Ordering::SeqCst);
    let name = match lane {
        Lane::Spot => format!("chaos_{index}"),
        Lane::Regular => format!("chaos_regular_{index}"),
    };
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
        .envs(lane_env(&shared.options, lane))
        // The consumer's debug lines (lease renewals, deletes) name the
        // message each delivery holds: how the harness finds the long job;
        // the job's own (chunks counted, progress saved) show what each
        // delivery redid, for the goodput check.
        .env(
            "RUST_LOG",
            "info,spot_worker_storage=debug,spot_worker_primes=debug",
        )
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true);
    let child = command
        .spawn()
        .with_context(|| format!("starting {}", options.binary.display()))?;
    shared.vms.lock().unwrap().push(VmRecord {
        name: name.clone(),
        regular: lane == Lane::Regular,
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
