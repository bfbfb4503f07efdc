//! `spot-worker imds-emulator`: serve an emulated IMDS for rehearsals.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, Scenario};
use tokio::net::TcpListener;

#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Address to listen on (port 0 picks a free one; the URL is printed).
    #[arg(long, default_value = "127.0.0.1:8089")]
    listen: SocketAddr,
    /// The emulated VM's name (`{scale-set}_{instance}` for scale sets).
    #[arg(long, default_value = "spotvmss_0")]
    vm_name: String,
    /// Play a built-in scenario once the server is up.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(Scenario::BUILTIN))]
    scenario: Option<String>,
    /// Time scale for the scenario (10 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Delay of the first Scheduled Events request, as when the real service
    /// enables Scheduled Events for a VM (up to two minutes).
    #[arg(long, default_value = "0s", value_parser = crate::parse_duration)]
    first_call_delay: Duration,
    /// Do not throttle clients above 5 requests per second.
    #[arg(long)]
    no_rate_limit: bool,
}

pub async fn run(args: EmulatorArgs) -> Result<()> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        bail!("--speed must be a positive number, not {}", args.speed);
    }
    let config = EmulatorConfig {
        rate_limit_per_sec: (!args.no_rate_limit).then_some(5),
        first_call_delay: args.first_call_delay,
        ..EmulatorConfig::for_vm(&args.vm_name)
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let emulator = Emulator::new(config.clone());

    // The URL goes to stdout alone, so scripts can read it; the rest is for
    // people and goes to stderr.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "http://{addr}").context("printing the URL")?;
    stdout.flush().context("printing the URL")?;
    drop(stdout);
    eprintln!(
        "IMDS emulator for VM {} on http://{addr} (control API under /emulator/; Ctrl-C stops)",
        config.vm_name
    );
    if let Some(name) = &args.scenario {
        let scenario = Scenario::builtin(name, &config)
            .with_context(|| format!("no built-in scenario {name:?}"))?;
        eprintln!(
            "playing {name} at {}x: {}",
            args.speed, scenario.description
        );
        emulator.play(scenario, args.speed);
    }
    emulator
        .serve(listener, async {
            crate::interrupted().await;
        })
        .await
        .context("serving the emulator")
}
