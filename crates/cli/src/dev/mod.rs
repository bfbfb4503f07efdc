//! `spot-worker dev`: a local development environment in one command.
//!
//! Azurite (one already answering on its ports is used as it is) with both
//! lanes' queues, an IMDS emulator for a Spot VM and one for a regular VM,
//! the environment a worker needs to use them printed as `export` lines
//! (and written to `--env-file`), and, optionally, a worker command run in
//! that environment and started again whenever it exits, as systemd does
//! on a scale-set VM: on the Spot VM at once, on the regular VM once the
//! regular lane needs it (`regular.rs`). `dev env` prints the environment
//! of a running one; `dev evict` posts a Preempt for its Spot VM and
//! reports the drain.

mod env;
mod evict;
mod regular;
mod supervise;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig};
use spot_worker_local::{Azurite, DEV_PORTS, HarnessError, azurite_answers};
use tokio::net::TcpListener;

pub use env::DevEnvironment;
use supervise::Interrupted;

/// The emulated VM's name unless `--vm-name` says otherwise.
const DEFAULT_VM_NAME: &str = "local_0";
/// The regular VM's name unless `--regular-vm-name` says otherwise.
const DEFAULT_REGULAR_VM_NAME: &str = "local_regular_0";

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
    /// The regular VM's name (its worker serves the regular lane).
    #[arg(long, default_value = DEFAULT_REGULAR_VM_NAME)]
    regular_vm_name: String,
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
    /// with an error). The same command is the regular VM's worker, on the
    /// regular lane, once a job waits in the regular queue or the Spot VM
    /// is gone (`dev evict --spot-away`).
    #[arg(last = true, value_name = "WORKER COMMAND")]
    worker: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum DevAction {
    /// Print the `export` lines of the environment `spot-worker dev` serves,
    /// once it answers (waits up to two minutes).
    Env(env::EnvArgs),
    /// Post a Preempt (Spot eviction, 30 s notice) for the Spot VM of the
    /// IMDS emulator `spot-worker dev` runs, and report how its worker
    /// drained; with --spot-away, Spot capacity stays away for a while.
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
    /// Where the IMDS emulator of the Spot VM listens (loopback).
    #[arg(long, default_value = "127.0.0.1:8089", global = true)]
    imds_listen: SocketAddr,
    /// Where the IMDS emulator of the regular VM listens (loopback);
    /// default: the port after --imds-listen's.
    #[arg(long, value_name = "IMDS_LISTEN", global = true)]
    regular_imds_listen: Option<SocketAddr>,
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

    fn regular_imds_listen(&self) -> Result<SocketAddr> {
        if let Some(address) = self.regular_imds_listen {
            return Ok(address);
        }
        let mut address = self.imds_listen;
        let port = address.port().checked_add(1).with_context(|| {
            format!(
                "--imds-listen {} leaves no port after it for the regular VM's emulator: \
                 give --regular-imds-listen",
                self.imds_listen
            )
        })?;
        address.set_port(port);
        Ok(address)
    }

    fn environment(&self) -> Result<DevEnvironment> {
        let [blob, queue, _] = self.azurite_ports()?;
        Ok(DevEnvironment::new(
            blob,
            queue,
            self.imds_listen,
            self.regular_imds_listen()?,
            |key| std::env::var(key).ok(),
        ))
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
    let regular_listen = args.addresses.regular_imds_listen()?;
    for (flag, address) in [
        ("--imds-listen", args.addresses.imds_listen),
        ("--regular-imds-listen", regular_listen),
    ] {
        if !address.ip().is_loopback() {
            bail!(
                "{flag} {address} is not a loopback address: the emulator answers anyone who \
                 reaches it"
            );
        }
    }
    let ports = args.addresses.azurite_ports()?;
    let azurite = start_azurite(ports).await?;
    // Before the emulator listens: `dev env` answers once it does, so
    // whatever runs in that environment finds the queue there.
    if let Err(error) = create_queue(&environment).await {
        stop_azurite(azurite).await;
        return Err(error);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let served = async {
        let spot = serve_emulator(
            &args.vm_name,
            args.addresses.imds_listen,
            "--imds-listen",
            &stop,
        )
        .await?;
        let regular = serve_emulator(
            &args.regular_vm_name,
            regular_listen,
            "--regular-imds-listen",
            &stop,
        )
        .await?;
        anyhow::Ok((spot, regular))
    }
    .await;
    let ((emulator, spot_server), (regular_emulator, regular_server)) = match served {
        Ok(both) => both,
        Err(error) => {
            stop.cancel();
            stop_azurite(azurite).await;
            return Err(error);
        }
    };

    let exports = environment.exports();
    print!("{exports}");
    if let Some(path) = &args.env_file {
        std::fs::write(path, &exports)
            .with_context(|| format!("writing the environment to {}", path.display()))?;
    }
    eprintln!(
        "spot-worker dev: {}; IMDS emulators for the Spot VM {} on {} and the regular VM {} on \
         {}. Export the lines above (or `eval \"$(spot-worker dev env)\"` in another shell); \
         `spot-worker dev evict` evicts the Spot VM; Ctrl-C stops.",
        match &azurite {
            Some(_) => format!("Azurite started on 127.0.0.1:{}-{}", ports[0], ports[2]),
            None => format!("using the Azurite already on 127.0.0.1:{}", ports[0]),
        },
        args.vm_name,
        environment.imds_endpoint(),
        args.regular_vm_name,
        environment.regular_imds_endpoint(),
    );

    let result = async {
        if !args.jobs.is_empty() {
            supervise::enqueue(&environment, &args.jobs).await?;
        }
        if args.worker.is_empty() {
            crate::interrupted().await;
            return Ok(());
        }
        let (mut spot_interrupted, mut regular_interrupted): (Interrupted, Interrupted) = (
            Box::pin(crate::interrupted()),
            Box::pin(crate::interrupted()),
        );
        let spot_variables = environment.variables();
        // Both stop at Ctrl-C; one that fails ends the other.
        tokio::try_join!(
            supervise::run_worker(
                &spot_variables,
                &emulator,
                &args.worker,
                &mut spot_interrupted
            ),
            regular::run(
                &environment,
                &emulator,
                &regular_emulator,
                &args.worker,
                &mut regular_interrupted
            ),
        )
        .map(|_| ())
    }
    .await;

    stop.cancel();
    let _ = tokio::join!(spot_server, regular_server);
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

/// An IMDS emulator for the VM `vm_name`, serving on `address` until
/// `stop`.
async fn serve_emulator(
    vm_name: &str,
    address: SocketAddr,
    flag: &str,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(Emulator, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(address).await.with_context(|| {
        format!(
            "listening on {address} for the IMDS emulator of {vm_name} (is another `spot-worker \
             dev` or `imds-emulator` running? {flag} picks another address)"
        )
    })?;
    let emulator = Emulator::new(EmulatorConfig::for_vm(vm_name));
    let server = tokio::spawn({
        let emulator = emulator.clone();
        let stop = stop.clone();
        async move { emulator.serve(listener, stop.cancelled_owned()).await }
    });
    Ok((emulator, server))
}

/// Creates both lanes' queues (`SPOT_WORKER_QUEUE` and the regular one) as
/// a deployment would: `enqueue` never creates them, so jobs sent before a
/// worker has started (`--job`, or a user's `spot-worker enqueue`) have a
/// queue to go to.
async fn create_queue(environment: &DevEnvironment) -> Result<()> {
    use spot_worker::storage::MessageQueue as _;
    let config =
        spot_worker_azure::StorageConfig::from_connection_string(&environment.connection_string())?;
    let spot = spot_worker::settings::Source::from_env()?
        .get(&spot_worker::settings::table::QUEUE)?
        .into_owned();
    let storage = spot_worker_azure::AzureStorage::new(config)?;
    for name in [spot.as_str(), environment.regular_queue()] {
        storage
            .queue(name)?
            .prepare()
            .await
            .with_context(|| format!("creating the queue {name} in the local Azurite"))?;
    }
    Ok(())
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
