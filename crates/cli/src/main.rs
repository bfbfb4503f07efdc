//! `spot-worker`: the operator's command.
//!
//! This binary only wires: argument parsing, logging and output formatting
//! live here; everything it does is a call into the library crates.

mod demo;
mod dev;
mod emulator;
mod events;
mod operate;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
// Durations on the command line read like the configuration's: `1s`,
// `250ms`, `2m` or a bare number of seconds.
use spot_worker::telemetry::{self, TelemetryConfig};
use spot_worker_runtime::settings::table;
use spot_worker_runtime::{interrupted, parse_duration};

/// Queue workers for Azure Spot VMs: inspect and rehearse Scheduled Events,
/// and operate a fleet's queue, poison queue and checkpoints.
#[derive(Debug, Parser)]
#[command(name = "spot-worker", version, about)]
struct Cli {
    /// IMDS base URL (an emulator's, for rehearsals); empty means the
    /// default.
    #[arg(
        long,
        global = true,
        env = table::IMDS_ENDPOINT.key,
        default_value = spot_worker_imds::DEFAULT_ENDPOINT,
        value_parser = parse_endpoint
    )]
    imds_endpoint: String,

    /// Log filter for stderr, e.g. `info` or `spot_worker_imds=debug`
    /// [default: warn; error for `demo`, whose drain warnings are expected;
    /// info for `run`, as for every worker (RUST_LOG's default)].
    #[arg(long, global = true, env = table::LOG_FILTER.key)]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print, watch or approve this VM's Scheduled Events.
    Events(events::EventsArgs),
    /// Run an IMDS emulator (Scheduled Events and instance metadata) with a
    /// control API under /emulator/.
    ImdsEmulator(emulator::EmulatorArgs),
    /// Rehearse a Spot eviction on this machine, with nothing to set up:
    /// jobs, a Preempt mid-job, the drain, a second worker resuming from
    /// the checkpoints, and checks that nothing was lost or done twice.
    Demo(demo::DemoArgs),
    /// A local development environment: Azurite with both lanes' queues,
    /// IMDS emulators for a Spot VM and a regular VM, the environment to
    /// export; optionally a worker run in it (`-- COMMAND`); until Ctrl-C.
    /// `dev env` prints the environment, `dev evict` evicts the Spot VM
    /// (docs/develop-locally.md).
    Dev(dev::DevArgs),
    /// Put jobs on the work queue: one message per line of JSON Lines.
    Enqueue(operate::enqueue::EnqueueArgs),
    /// Read, requeue or purge the records of the poison queue.
    Poison(operate::poison::PoisonArgs),
    /// List, show or delete job checkpoints.
    Checkpoints(operate::checkpoints::CheckpointsArgs),
    /// Read a job's result from the results container.
    Results(operate::results::ResultsArgs),
    /// The queue, the poison queue, jobs in progress and workers' readiness.
    Status(operate::status::StatusArgs),
    /// Be a Spot worker that runs PROGRAM once per message:
    /// `spot-worker run [SETTINGS] -- PROGRAM [ARGS...]` (docs/command.md).
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    give_back_large_buffers();
    let cli = Cli::parse();
    let default_log = match cli.command {
        Command::Demo(_) => "error",
        _ => "warn",
    };
    // A worker installs its own logs and telemetry from the settings; the
    // other subcommands get the same stderr logs without an export.
    if !matches!(cli.command, Command::Run(_)) {
        let filter = cli.log.as_deref().unwrap_or(default_log);
        let logs = TelemetryConfig::default().with_log_filter(filter);
        if let Err(error) = telemetry::init_logs(&logs) {
            return fail(&anyhow::Error::new(error).context("--log (or RUST_LOG)"));
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&anyhow::Error::new(error).context("starting the runtime")),
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Events(args) => events::run(&cli.imds_endpoint, args).await,
            Command::ImdsEmulator(args) => emulator::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Enqueue(args) => operate::enqueue::run(args).await,
            Command::Poison(args) => operate::poison::run(args).await,
            Command::Checkpoints(args) => operate::checkpoints::run(args).await,
            Command::Results(args) => operate::results::run(args).await,
            Command::Status(args) => operate::status::run(args).await,
            Command::Run(args) => {
                let endpoint = (cli.imds_endpoint != spot_worker_imds::DEFAULT_ENDPOINT)
                    .then_some(cli.imds_endpoint);
                run::run(args, cli.log, endpoint).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

/// One line on stderr, with the whole cause chain, and a non-zero exit.
fn fail(error: &anyhow::Error) -> ExitCode {
    // A reader that went away (`| head`) is not an error worth a message.
    let broken_pipe = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    eprintln!("error: {error:#}");
    ExitCode::FAILURE
}

/// Same as the library: an empty or blank endpoint means the default.
/// Makes every allocation of 128 KiB or more (a checkpoint's chunks, up to
/// 4 MiB, and the buffers they are downloaded into) come from the kernel
/// and go back to it when freed. Left alone, glibc raises that threshold
/// once such a buffer is freed and carves later ones from its per-thread
/// arenas, which keep their pages: under `spot-worker run`, a restore then
/// saves of a 192 MiB checkpoint took the runner's peak RSS from 52 MB to
/// 78 MB (crates/cli/tests/it/run_large.rs). Set first, before any thread.
fn give_back_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of malloc's parameters; no other thread
    // exists yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

fn parse_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    Ok(if text.is_empty() {
        spot_worker_imds::DEFAULT_ENDPOINT.to_owned()
    } else {
        text.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn an_empty_endpoint_means_the_default() {
        // As the settings treat any blank value.
        assert_eq!(
            parse_endpoint(" ").unwrap(),
            spot_worker_imds::DEFAULT_ENDPOINT
        );
        assert_eq!(
            parse_endpoint("http://127.0.0.1:1").unwrap(),
            "http://127.0.0.1:1"
        );
        let cli = Cli::try_parse_from(["spot-worker", "--imds-endpoint", "", "events"]).unwrap();
        assert_eq!(cli.imds_endpoint, spot_worker_imds::DEFAULT_ENDPOINT);
    }
}
