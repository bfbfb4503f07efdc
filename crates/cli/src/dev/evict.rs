//! `spot-worker dev evict`: a Spot eviction of the local VM. Posts a
//! Preempt (30 s notice) to the IMDS emulator `spot-worker dev` runs, once a
//! worker polls it, and reports how it ended: approved by the worker once
//! drained, or started at `NotBefore` without an approval. The event is
//! removed as soon as it starts (the VM is gone), so a worker started again
//! afterwards, like a replacement VM, takes the job back; with
//! `--spot-away` it stays, started, for that long: Spot capacity is gone
//! (no Spot VM runs, and `spot-worker dev` wakes its regular VM), and the
//! lanes see an outage.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use super::DevEnvironment;

#[derive(Debug, Args)]
pub struct EvictArgs {
    /// The longest to wait for a worker to poll the emulator before the
    /// Preempt is posted.
    #[arg(long, default_value = "2m", value_parser = crate::parse_duration)]
    wait: Duration,
    /// Wait (up to --wait) until a job has saved progress (a checkpoint in
    /// progress) before evicting, so the eviction lands mid-job and the
    /// resume shows.
    #[arg(long)]
    after_progress: bool,
    /// Keep Spot capacity away this long after the eviction (e.g. `90s`):
    /// the Spot VM's worker is not started again until then, and the
    /// regular VM is woken, as the deployment's autoscale does when no
    /// Spot VM runs. Without it the VM comes back at once.
    #[arg(long, value_name = "DURATION", value_parser = crate::parse_duration)]
    spot_away: Option<Duration>,
}

/// How often the emulator's state is read while waiting.
const POLL: Duration = Duration::from_millis(200);

pub async fn run(environment: DevEnvironment, args: EvictArgs) -> Result<()> {
    let base = environment.imds_endpoint();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .context("building the HTTP client")?;
    let state = |client: reqwest::Client, base: String| async move {
        client
            .get(format!("{base}/emulator/state"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| {
                format!(
                    "reading the IMDS emulator's state at {base} (is `spot-worker dev` running?)"
                )
            })?
            .json::<Value>()
            .await
            .context("reading the IMDS emulator's state")
    };

    // A Preempt nobody polls for drains nothing; `spot-worker dev` itself
    // may still be starting (then the emulator does not answer yet).
    let deadline = Instant::now() + args.wait;
    loop {
        let polled = match state(client.clone(), base.clone()).await {
            Ok(now) => now["stats"]["scheduledevents_gets"].as_u64().unwrap_or(0) > 0,
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => false,
        };
        if polled {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "no worker has polled the IMDS emulator at {base} in {:?}: start one in the \
                 environment `spot-worker dev` prints",
                args.wait
            );
        }
        tokio::time::sleep(POLL).await;
    }

    if args.after_progress {
        wait_for_progress(&environment, deadline, args.wait).await?;
    }

    let posted: Value = client
        .post(format!("{base}/emulator/events"))
        .json(&json!({
            "event_type": "Preempt",
            "complete_after_secs": args.spot_away.unwrap_or_default().as_secs_f64(),
        }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .context("posting the Preempt")?
        .json()
        .await
        .context("reading the posted event")?;
    let event = &posted["event"];
    let id = event["EventId"].as_str().unwrap_or_default().to_owned();
    let vm = event["Resources"][0].as_str().unwrap_or("the VM");
    println!(
        "Preempt {id} posted for {vm} (NotBefore {}): its worker drains, approves, exits",
        event["NotBefore"].as_str().unwrap_or("?")
    );
    let posted_at = Instant::now();
    // The notice is 30 s; then the emulator starts the event by itself.
    let deadline = posted_at + Duration::from_secs(40);
    loop {
        let now = state(client.clone(), base.clone()).await?;
        let approved = now["approvals"]
            .as_array()
            .is_some_and(|all| all.iter().any(|a| a["event_id"] == id.as_str()));
        let pending = now["events"].as_array().is_some_and(|all| {
            all.iter()
                .any(|e| e["EventId"] == id.as_str() && e["EventStatus"] != "Started")
        });
        if approved {
            println!(
                "approved by the worker {} ms after the notice: drained in time",
                posted_at.elapsed().as_millis()
            );
            if let Some(away) = args.spot_away {
                println!(
                    "Spot capacity is away for {away:?}: no Spot VM runs until then, and \
                     `spot-worker dev` wakes its regular VM"
                );
            }
            return Ok(());
        }
        if !pending {
            bail!(
                "the Preempt started at NotBefore without an approval: the worker did not \
                 drain in time (its log says why)"
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "the Preempt {id} neither approved nor started after {:?}",
                posted_at.elapsed()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `spot-worker checkpoints list --in-progress` (this binary,
/// in the environment) lists a job.
async fn wait_for_progress(
    environment: &DevEnvironment,
    deadline: Instant,
    wait: Duration,
) -> Result<()> {
    let exe = std::env::current_exe().context("locating spot-worker")?;
    loop {
        let listed = tokio::process::Command::new(&exe)
            .args(["checkpoints", "list", "--in-progress", "--json"])
            .envs(environment.variables())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .context("running spot-worker checkpoints list")?;
        let jobs: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        if listed.status.success() && !jobs.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "no job saved progress within {wait:?} (`spot-worker checkpoints list \
                 --in-progress` lists none): is a job on the queue, and does it checkpoint?"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
