//! `spot-worker dev`: a local development environment in one command.
//!
//! Azurite (one already answering on its ports is used as it is) and the
//! IMDS emulator as one VM, the environment a worker needs to use them
//! printed as `export` lines (and written to `--env-file`), and,
//! optionally, a worker command run in that environment and started again
//! whenever it exits, as systemd does on a scale-set VM. `dev env` prints
//! the environment of a running one; `dev evict` posts a Preempt for its
//! VM and reports the drain.

mod env;
mod evict;
mod supervise;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig};
use spot_worker_local::{Azurite, DEV_PORTS, HarnessError, azurite_answers};
use tokio::net::TcpListener;

pub use env::DevEnvironment;

/// The emulated VM's name unless `--vm-name` says otherwise.
const DEFAULT_VM_NAME: &str = "local_0";

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DevArgs {
    #[command(subcommand)]
    action: Option<DevAction>,
    #[command(flatten)]
    addresses: Addresses,
    /// The emulated VM's name (instance metadata's `compute.name`, and the
    /// `Resources` of `dev evict`'s Preempt).
    #[arg(long, default_value = DEFAULT_VM_NAME)]
    vm_name: String,
    /// Also write the `export` lines to this file (removed on exit).
    #[arg(long, value_name = "PATH")]
    env_file: Option<PathBuf>,
    /// A job to put on the queue once the environment is up (a message
    /// body, e.g. JSON; repeatable).
    #[arg(long = "job", value_name = "BODY")]
    jobs: Vec<String>,
    /// A worker command to run in the environment, after `--` (e.g. `--
    /// spot-worker run -- python3 job.py`, or `-- cargo run --example
    /// primes`); started again whenever it exits, until Ctrl-C, unless it
    /// fails 5 times in a row within 10 s of starting (then `dev` stops
    /// with an error).
    #[arg(last = true, value_name = "WORKER COMMAND")]
    worker: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum DevAction {
    /// Print the `export` lines of the environment `spot-worker dev` serves,
    /// once it answers (waits up to two minutes).
    Env(env::EnvArgs),
    /// Post a Preempt (Spot eviction, 30 s notice) for the VM of the IMDS
    /// emulator `spot-worker dev` runs, and report how its worker drained.
    Evict(evict::EvictArgs),
}

/// Where the environment listens: Azurite's default ports and the IMDS
/// emulator's default address, unless told otherwise.
#[derive(Debug, Clone, Args)]
pub struct Addresses {
    /// Azurite's blob port (the queue service is on the next one, the table
    /// service on the one after).
    #[arg(long, default_value_t = DEV_PORTS[0], global = true)]
    azurite_port: u16,
    /// Where the IMDS emulator listens (loopback).
    #[arg(long, default_value = "127.0.0.1:8089", global = true)]
    imds_listen: SocketAddr,
}

impl Addresses {
    fn azurite_ports(&self) -> Result<[u16; 3]> {
        let blob = self.azurite_port;
        match (blob.checked_add(1), blob.checked_add(2)) {
            (Some(queue), Some(table)) => Ok([blob, queue, table]),
            _ => {
                bail!("--azurite-port {blob} leaves no room for the queue and table ports after it")
            }
        }
    }

    fn environment(&self) -> Result<DevEnvironment> {
        let [blob, queue, _] = self.azurite_ports()?;
        Ok(DevEnvironment::new(blob, queue, self.imds_listen))
    }
}

pub async fn run(args: DevArgs) -> Result<()> {
    match args.action {
        Some(DevAction::Env(env)) => env::run(args.addresses.environment()?, env).await,
        Some(DevAction::Evict(evict)) => evict::run(args.addresses.environment()?, evict).await,
        None => serve(args).await,
    }
}

/// Starts the environment, prints it, runs the worker command if any, and
/// stays up until Ctrl-C (or SIGTERM).
async fn serve(args: DevArgs) -> Result<()> {
    let environment = args.addresses.environment()?;
    if !args.addresses.imds_listen.ip().is_loopback() {
        bail!(
            "--imds-listen {} is not a loopback address: the emulator answers anyone who reaches it",
            args.addresses.imds_listen
        );
    }
    let ports = args.addresses.azurite_ports()?;
    let azurite = start_azurite(ports).await?;
    // Before the emulator listens: `dev env` answers once it does, so
    // whatever runs in that environment finds the queue there.
    if let Err(error) = create_queue(&environment).await {
        stop_azurite(azurite).await;
        return Err(error);
    }
    let listener = TcpListener::bind(args.addresses.imds_listen)
        .await
        .with_context(|| {
            format!(
                "listening on {} for the IMDS emulator (is another `spot-worker dev` or \
                 `imds-emulator` running? --imds-listen picks another address)",
                args.addresses.imds_listen
            )
        })?;
    let emulator = Emulator::new(EmulatorConfig::for_vm(&args.vm_name));
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn({
        let emulator = emulator.clone();
        let stop = stop.clone();
        async move { emulator.serve(listener, stop.cancelled_owned()).await }
    });

    let exports = environment.exports();
    print!("{exports}");
    if let Some(path) = &args.env_file {
        std::fs::write(path, &exports)
            .with_context(|| format!("writing the environment to {}", path.display()))?;
    }
    eprintln!(
        "spot-worker dev: {}; IMDS emulator for VM {} on {}. Export the lines above (or \
         `eval \"$(spot-worker dev env)\"` in another shell); `spot-worker dev evict` evicts \
         the VM; Ctrl-C stops.",
        match &azurite {
            Some(_) => format!("Azurite started on 127.0.0.1:{}-{}", ports[0], ports[2]),
            None => format!("using the Azurite already on 127.0.0.1:{}", ports[0]),
        },
        args.vm_name,
        environment.imds_endpoint(),
    );

    let result = async {
        if !args.jobs.is_empty() {
            supervise::enqueue(&environment, &args.jobs).await?;
        }
        if args.worker.is_empty() {
            crate::interrupted().await;
            Ok(())
        } else {
            supervise::run_worker(&environment, &emulator, &args.worker).await
        }
    }
    .await;

    stop.cancel();
    let _ = server.await;
    if let Some(path) = &args.env_file {
        let _ = std::fs::remove_file(path);
    }
    stop_azurite(azurite).await;
    result
}

/// Stops the Azurite `serve` started, if it started one.
async fn stop_azurite(azurite: Option<Azurite>) {
    if let Some(azurite) = azurite {
        // Its stop waits for the process to exit.
        let _ = tokio::task::spawn_blocking(move || drop(azurite)).await;
    }
}

/// Creates the work queue (`SPOT_WORKER_QUEUE`) as a deployment would:
/// `enqueue` never creates it, so jobs sent before a worker has started
/// (`--job`, or a user's `spot-worker enqueue`) have a queue to go to.
async fn create_queue(environment: &DevEnvironment) -> Result<()> {
    use spot_worker::storage::MessageQueue as _;
    let config =
        spot_worker_azure::StorageConfig::from_connection_string(&environment.connection_string())?;
    let name = spot_worker::settings::Source::from_env()?
        .get(&spot_worker::settings::table::QUEUE)?
        .into_owned();
    spot_worker_azure::AzureStorage::new(config)?
        .queue(&name)?
        .prepare()
        .await
        .with_context(|| format!("creating the queue {name} in the local Azurite"))
}

/// Azurite on `ports`, started unless one already answers there (then
/// `None`: it is someone else's, and left running).
async fn start_azurite(ports: [u16; 3]) -> Result<Option<Azurite>> {
    let started = tokio::task::spawn_blocking(move || {
        if azurite_answers(ports[0], ports[1]) {
            return Ok(None);
        }
        Azurite::start_on(ports).map(Some)
    })
    .await
    .context("starting Azurite")?;
    started.map_err(|error| match error {
        HarnessError::NotReady { reason, log } => anyhow::anyhow!(
            "Azurite did not start: {reason}; the end of its log:\n{}",
            log.trim_end()
        ),
        HarnessError::PortInUse { address, .. } => anyhow::anyhow!(
            "Azurite could not listen on {address}: something else holds that port (not an \
             Azurite serving devstoreaccount1); stop it, or pick other ports with --azurite-port"
        ),
        other => anyhow::anyhow!(other),
    })
}
