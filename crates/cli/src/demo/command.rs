//! `spot-worker demo --command`: the same eviction, with a Python program
//! as the job. `examples/command/primes.py` (built into this binary, written
//! to a temporary directory) runs once per message under `spot-worker-command`'s
//! handler, as `spot-worker run --job-key job_id --result-name
//! '{job_key}.json' -- python3 primes.py` would run it:
//!
//! 1. worker A (VM `spotvmss_0`) takes the job; the program writes its
//!    progress to `SPOT_WORKER_CHECKPOINT`, which the runner saves;
//! 2. Azure posts a Preempt for A: the program gets SIGTERM, saves, exits;
//!    the runner saves the file once more and releases the message;
//! 3. worker B (VM `spotvmss_1`) gets the file back, byte for byte, and the
//!    program resumes from it;
//! 4. the result is checked against an independent count (the Rust one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use spot_worker_command::{CommandConfig, CommandHandler, from_progress};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, RunningEmulator};
use spot_worker_primes::PrimesJob;
use spot_worker_runtime::{DrainSettings, ImdsSettings, Worker, WorkerConfig};
use spot_worker_storage::Checkpoint;
use tokio_util::sync::CancellationToken;

use super::storage::Storage;
use super::workers::{RunningWorker, forward_cancel};
use super::{IMDS_POLL, QUEUE, Who};

/// The Python job, as shipped in `examples/command/`.
const PRIMES_PY: &str = include_str!("../../../../examples/command/primes.py");
/// Numbers in the job unless `--size` says otherwise: a few seconds of one
/// core in Python, so the eviction lands mid-way.
const DEFAULT_SIZE: u64 = 1_000_000_000;
/// How often the demo's program saves its progress: often, so the eviction
/// comes right after the first save, early in the job, however fast the
/// machine counts (the example's own default is 3 s).
const SAVE_EVERY: &str = "0.1";
/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(300);

/// Runs the command demo; an error means it could not run or a check failed.
pub(super) async fn run(
    size: Option<u64>,
    azurite: bool,
    interrupted: CancellationToken,
) -> Result<()> {
    let started = Instant::now();
    let python =
        which("python3").context("demo --command runs a Python program: python3 is not on PATH")?;
    let dir = std::env::temp_dir().join(format!("spot-worker-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let script = dir.join("primes.py");
    std::fs::write(&script, PRIMES_PY).context("writing primes.py")?;
    let outcome = rehearse(
        &python,
        &script,
        size.unwrap_or(DEFAULT_SIZE),
        azurite,
        interrupted,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn rehearse(
    python: &Path,
    script: &Path,
    size: u64,
    azurite: bool,
    interrupted: CancellationToken,
) -> Result<()> {
    println!("spot-worker demo --command: a Python job evicted mid-way, resumed on another worker");
    let job = PrimesJob::new("py1", 0, size).context("--size")?;
    let emulators = [
        Emulator::start(EmulatorConfig::for_vm(Who::A.vm()))
            .await
            .context("starting the IMDS emulator")?,
        Emulator::start(EmulatorConfig::for_vm(Who::B.vm()))
            .await
            .context("starting B's IMDS emulator")?,
    ];
    let storage = if azurite {
        Storage::azurite().await?
    } else {
        Storage::in_memory()
    };
    println!("storage: {}", storage.description);
    println!(
        "program: {} {} (examples/command/primes.py), keyed by job_id, result {{job_key}}.json",
        python.display(),
        script.display()
    );
    storage
        .queue
        .send(&job.to_message(), Duration::ZERO)
        .await
        .context("enqueueing the job")?;
    println!(
        "enqueued {}",
        String::from_utf8_lossy(job.to_message().as_bytes())
    );

    let a = start(
        &storage,
        &emulators[0],
        Who::A,
        python,
        script,
        &interrupted,
    );
    let at_work = bounded("the program's first saved progress", async {
        loop {
            if let Some(cursor) = saved_cursor(&storage, &job.job_id).await? {
                return Ok::<_, anyhow::Error>(cursor);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    println!(
        "A: the program saved its progress file (cursor {at_work} of {size}); the runner stored it"
    );

    let event = emulators[0]
        .schedule(EventSpec::preempt().resources([Who::A.vm()]))
        .context("posting the Preempt")?;
    println!(
        "Azure: Preempt {} for {} (30 s notice)",
        event.id,
        Who::A.vm()
    );
    let report = bounded("A's drain", a.task).await?.context("worker A")??;
    ensure!(
        report.stats.released == 1,
        "A released {} messages, not 1",
        report.stats.released
    );
    ensure!(
        report.drain.approved_event,
        "A did not approve the Preempt after its drain"
    );
    let evicted_at = saved_cursor(&storage, &job.job_id)
        .await?
        .context("no progress saved at the eviction")?;
    println!(
        "A: drained in {} ms: SIGTERM to the program, its file saved (cursor {evicted_at}), message released, event approved",
        report.drain.notice_to_drained.as_millis()
    );
    ensure!(
        evicted_at < size,
        "the job finished before the eviction: use a larger --size"
    );

    let b = start(
        &storage,
        &emulators[1],
        Who::B,
        python,
        script,
        &interrupted,
    );
    println!(
        "B: takes the job and hands the program its checkpoint file back (cursor {evicted_at})"
    );
    let name = format!("{}.json", job.job_id);
    let bytes = bounded("the result", async {
        loop {
            if let Some(bytes) = storage.results.get(&name).await? {
                return Ok::<_, anyhow::Error>(bytes);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    b.stop.cancel();
    bounded("B to stop", b.task).await?.context("worker B")??;
    let result: serde_json::Value =
        serde_json::from_slice(&bytes).context("the result is not JSON")?;
    let expected = spot_worker_primes::expected_result(&job);
    println!("B: result {name} = {result}");
    if result != expected {
        bail!("the result {result} is not the independent count {expected}");
    }
    let (left, poisoned) = storage.messages_left().await?;
    ensure!(
        left == 0 && poisoned == 0,
        "{left} message(s) left in the queue, {poisoned} poisoned"
    );
    println!(
        "verified: equals the Rust count, resumed from cursor {evicted_at} (not from 0); queue and poison queue empty"
    );
    storage.close().await;
    Ok(())
}

/// Worker `who` on the shared stores, running the Python job.
fn start(
    storage: &Storage,
    emulator: &RunningEmulator,
    who: Who,
    python: &Path,
    script: &Path,
    interrupted: &CancellationToken,
) -> RunningWorker {
    let defaults = WorkerConfig::default();
    let config = WorkerConfig {
        queue: QUEUE.to_owned(),
        concurrency: 1,
        health_addr: ([127, 0, 0, 1], 0).into(),
        imds: ImdsSettings {
            enabled: true,
            endpoint: emulator.url(),
            vm_name: Some(who.vm().to_owned()),
            poll_interval: IMDS_POLL,
        },
        // Both workers share this process (see scenario.rs).
        drain: DrainSettings {
            watchdog: false,
            handle_signals: false,
            ..defaults.drain
        },
        ..defaults
    };
    let worker = Worker::new(
        config,
        Arc::clone(&storage.queue),
        Arc::clone(&storage.poison),
    )
    .with_checkpoints(Arc::clone(&storage.checkpoints));
    let program = CommandConfig::new(
        python,
        [
            script.display().to_string(),
            "--save-every".to_owned(),
            SAVE_EVERY.to_owned(),
        ],
    )
    .with_job_key("job_id")
    .with_result_name("{job_key}.json")
    // The demo shows progress as the program saves it.
    .with_checkpoint_every(Duration::from_secs(1));
    let handler = CommandHandler::new(program, Arc::clone(&storage.results));
    println!("worker {who} starts as VM {}", who.vm());
    let stop = worker.shutdown_token();
    tokio::spawn(forward_cancel(interrupted.clone(), stop.clone()));
    RunningWorker {
        stop,
        task: tokio::spawn(worker.run(handler)),
    }
}

/// The cursor in the job's saved checkpoint file, if any.
async fn saved_cursor(storage: &Storage, key: &str) -> Result<Option<u64>> {
    let Some(stored) = storage.checkpoints.read(key).await? else {
        return Ok(None);
    };
    let progress = match stored.checkpoint {
        Checkpoint::InProgress { progress } => progress,
        Checkpoint::Completed { .. } => {
            bail!("job {key} finished before the eviction: give it a larger --size")
        }
    };
    let bytes = from_progress(&progress).context("the saved checkpoint file")?;
    let file: serde_json::Value =
        serde_json::from_slice(&bytes).context("primes.py's checkpoint file")?;
    Ok(file["cursor"].as_u64())
}

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(PATIENCE, future)
        .await
        .with_context(|| format!("{what}: nothing after {PATIENCE:?}"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .collect::<Vec<_>>()
        })?
        .into_iter()
        .find(|path| path.is_file())
}
