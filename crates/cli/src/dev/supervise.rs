//! The worker command `spot-worker dev -- COMMAND` runs: in the local
//! environment, in a process group of its own (Ctrl-C reaches `dev`, which
//! passes one SIGTERM on, so the worker drains once), and started again
//! whenever it exits, as systemd's `Restart=always` does on a scale-set VM,
//! except that `dev` gives up on a worker that fails 5 times in a row within
//! 10 s of starting (systemd, with the unit's `StartLimitIntervalSec=0`,
//! never does).
//! Jobs given with `--job` go through `spot-worker enqueue`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use spot_worker_imds_emulator::Emulator;
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, Command};

use super::DevEnvironment;

/// A worker that exits this soon after starting, unsuccessfully, this many
/// times in a row, is not started again: it would only fail again.
const QUICK_FAILURE: Duration = Duration::from_secs(10);
const QUICK_FAILURES_ALLOWED: u32 = 5;
/// How long a worker asked to stop may take: the drain budget and the exit.
const STOP_GRACE: Duration = Duration::from_secs(35);

/// Ctrl-C or SIGTERM, as [`crate::interrupted`] gives it.
pub type Interrupted = std::pin::Pin<Box<dyn Future<Output = &'static str> + Send>>;

/// Puts `jobs` on the queue with `spot-worker enqueue` (this binary) in the
/// environment: the queue and encoding are the worker's settings.
pub async fn enqueue(environment: &DevEnvironment, jobs: &[String]) -> Result<()> {
    let mut child = Command::new(std::env::current_exe().context("locating spot-worker")?)
        .arg("enqueue")
        .envs(environment.variables())
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .context("running spot-worker enqueue")?;
    let mut stdin = child.stdin.take().context("enqueue's stdin")?;
    for job in jobs {
        stdin.write_all(job.trim().as_bytes()).await?;
        stdin.write_all(b"\n").await?;
    }
    drop(stdin);
    let status = child
        .wait()
        .await
        .context("waiting for spot-worker enqueue")?;
    if !status.success() {
        bail!("enqueueing the --job bodies failed ({status})");
    }
    Ok(())
}

/// Runs `command` with `variables` as the worker of `emulator`'s VM until
/// Ctrl-C (or SIGTERM), starting it again whenever it exits.
/// `interrupted` is [`crate::interrupted`], installed by the caller.
pub async fn run_worker(
    variables: &[(&'static str, String)],
    emulator: &Emulator,
    command: &[String],
    interrupted: &mut Interrupted,
) -> Result<()> {
    let (program, args) = command.split_first().context("no worker command")?;
    let mut quick_failures = 0;
    for start in 1u64.. {
        // A VM comes back without the event that took it away: wait until
        // no event of this VM is pending or running (a Preempt nobody
        // approves starts at NotBefore, 30 s after its notice).
        let vm = emulator.config().vm_name;
        while emulator.document()["Events"]
            .as_array()
            .is_some_and(|events| !events.is_empty())
        {
            let incarnation = emulator.incarnation();
            tokio::select! {
                _ = &mut *interrupted => return Ok(()),
                () = emulator.wait_for_incarnation(incarnation + 1) => {}
            }
        }
        eprintln!(
            "spot-worker dev: starting the worker of VM {vm} (start {start}): {}",
            command.join(" ")
        );
        let started = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .envs(variables.iter().map(|(key, value)| (key, value)))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the worker command {program:?}"))?;
        let status = tokio::select! {
            status = child.wait() => status.context("waiting for the worker")?,
            _ = &mut *interrupted => return stop(child).await,
        };
        if !status.success() && started.elapsed() < QUICK_FAILURE {
            quick_failures += 1;
            if quick_failures >= QUICK_FAILURES_ALLOWED {
                bail!(
                    "the worker failed {quick_failures} times in a row within {QUICK_FAILURE:?} of \
                     starting ({status}); its output above says why"
                );
            }
        } else {
            quick_failures = 0;
        }
        eprintln!(
            "spot-worker dev: the worker exited ({status}); starting it again, as systemd would"
        );
    }
    Ok(())
}

/// Asks the worker to drain (one SIGTERM to its process group: a `cargo
/// run` in front of it passes nothing on) and waits for it to exit.
async fn stop(mut child: Child) -> Result<()> {
    if let Some(pid) = child.id().and_then(|id| libc::pid_t::try_from(id).ok()) {
        // SAFETY: kill(2) has no memory-safety preconditions; the group is
        // our child's, which leads it (`process_group(0)`).
        unsafe {
            libc::kill(-pid, libc::SIGTERM);
        }
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(status) => {
            let status = status.context("waiting for the worker")?;
            eprintln!("spot-worker dev: the worker stopped ({status})");
            Ok(())
        }
        Err(_) => {
            let _ = child.kill().await;
            bail!("the worker did not stop within {STOP_GRACE:?} of SIGTERM; killed")
        }
    }
}
