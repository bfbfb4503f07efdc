//! What `spot-worker run` costs over the program it runs, and how fast a
//! notice reaches that program.
//!
//! `cargo bench --bench command_runner [-- --jobs N --iterations N --programs N]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a smoke
//! version (a few jobs, one drain of 4 programs) so it cannot rot unnoticed.
//!
//! Real parts only: Azurite (a child process on 127.0.0.1), the IMDS
//! emulator in-process, the command handler (`spot-worker-command`) in a
//! real [`Worker`](spot_worker::runtime::Worker), real child processes.
//!
//! 1. **Overhead per job.** N messages, each run by `/bin/true` through the
//!    worker (concurrency 1): the time per job is the interval between two
//!    consecutive handler returns (receive, lease, program, settlement).
//!    Baseline on the same Azurite: a plain loop that receives one message,
//!    runs `/bin/true` and deletes the message: the program's own run time
//!    plus the storage requests such a job needs (a first delivery keyed by
//!    its message id, with no progress saved, needs no checkpoint request:
//!    the runner's are counted and printed, 0 per job). Overhead = runner −
//!    baseline.
//! 2. **Notice → SIGTERM.** A Python program that records
//!    `CLOCK_MONOTONIC` when SIGTERM arrives; a Preempt is scheduled; the
//!    watcher's sighting is the worker's `draining:` log event, stamped with
//!    the same clock by a tracing layer. Twice, interleaved: with an empty
//!    checkpoint directory, and with one at its entry cap looked at every
//!    10 ms (each look walks it beside the loop; the signal never waits).
//! 3. **Notice → exit, 32 programs.** 32 messages in flight, each running
//!    `sleep 600` (which exits on SIGTERM); from the watcher's sighting to
//!    `run()` returning, every message released.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use spot_worker::runtime::Worker;
use spot_worker::storage::{HandlerError, Job, MessageHandler};
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_imds_emulator::EventSpec;
use spot_worker_testkit::bench::{self, BenchArgs, median, percentile};
use spot_worker_testkit::counting::{CountingStore, StoreCalls};
use spot_worker_testkit::worker::{Env, VM_A};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// Bound on every wait that is not itself measured.
const PATIENCE: Duration = Duration::from_secs(120);
/// Files in the checkpoint directory of the second notice → SIGTERM case:
/// as many as a look reads, less the few entries a save may add.
const AT_CAP: usize = spot_worker::storage::files::MAX_ENTRIES - 10;
/// The worker's log event when the watcher's notice starts the drain.
const DRAINING: &str = "draining: intake stopped";

struct Options {
    jobs: usize,
    iterations: usize,
    programs: usize,
}

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut options = if args.benchmarking() {
        Options {
            jobs: 200,
            iterations: 10,
            programs: 32,
        }
    } else {
        Options {
            jobs: 6,
            iterations: 1,
            programs: 4,
        }
    };
    args.each_flag(|flag, value| {
        match flag {
            "--jobs" => options.jobs = value.parse()?,
            "--iterations" => options.iterations = value.parse()?,
            "--programs" => options.programs = value.parse()?,
            _ => {}
        }
        Ok(())
    })?;
    ensure!(options.jobs >= 3 && options.iterations >= 1 && options.programs >= 1);
    let drains = DrainClock::default();
    // Errors only on stderr (the drains' warnings are expected here); every
    // event reaches the drain clock.
    let subscriber = tracing_subscriber::registry().with(drains.clone()).with(
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(LevelFilter::ERROR),
    );
    tracing::subscriber::set_global_default(subscriber).context("installing the log")?;
    bench::runtime()?.block_on(run(options, drains))
}

async fn run(options: Options, drains: DrainClock) -> Result<()> {
    println!("command benchmark on {}", bench::machine());
    let env = Env::start().await;
    let python = which("python3").context("python3 is needed for the SIGTERM probe")?;
    let scratch = tempfile::tempdir()?;

    let baseline = plain_loop(&env, options.jobs).await?;
    let (runner, calls) = runner_jobs(&env, options.jobs).await?;
    println!(
        "\n1. per job, /bin/true, {} jobs, concurrency 1",
        options.jobs
    );
    print_row("plain loop (receive, run, delete)", &baseline);
    print_row("spot-worker run", &runner);
    let per_job = |n: u64| n as f64 / options.jobs as f64;
    println!(
        "   runner's checkpoint requests per job: {:.2} reads, {:.2} writes, {:.2} deletes (baseline: none)",
        per_job(calls.reads()),
        per_job(calls.writes()),
        per_job(calls.deletes())
    );
    let overhead = median(&runner).as_secs_f64() - median(&baseline).as_secs_f64();
    println!(
        "   overhead (median − median): {:.2} ms (goal < 5 ms)",
        overhead * 1e3
    );

    // Interleaved: an empty checkpoint directory, and one at the cap
    // looked at every 10 ms (a look beside the loop at almost any time).
    let (mut sigterm, mut at_cap) = (Vec::new(), Vec::new());
    for _ in 0..options.iterations {
        sigterm.push(notice_to_sigterm(&env, &drains, &python, scratch.path(), 0).await?);
        at_cap.push(notice_to_sigterm(&env, &drains, &python, scratch.path(), AT_CAP).await?);
    }
    println!(
        "\n2. notice (watcher) → SIGTERM at the program, {} drain(s) each",
        sigterm.len()
    );
    print_row("notice → SIGTERM", &sigterm);
    print_row(
        "notice → SIGTERM, checkpoint dir at the cap, looked at every 10 ms",
        &at_cap,
    );
    println!("   goal: < 50 ms");

    let mut exits = Vec::new();
    for _ in 0..options.iterations.min(3) {
        exits.push(notice_to_exit(&env, &drains, options.programs).await?);
    }
    println!(
        "\n3. notice (watcher) → worker exit, {} programs exiting on SIGTERM",
        options.programs
    );
    print_row("notice → exit", &exits);
    println!("   goal: p99 < 2 s");
    Ok(())
}

/// The baseline: receive one, run the program, delete, per job.
async fn plain_loop(env: &Env, jobs: usize) -> Result<Vec<Duration>> {
    fill(env, jobs).await?;
    let mut times = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let started = Instant::now();
        let messages = env.queue.receive(1, Duration::from_secs(30)).await?;
        let message = messages.first().context("the queue ran dry")?;
        let status = tokio::process::Command::new("/bin/true").status().await?;
        ensure!(status.success());
        env.queue.delete(&message.id, &message.pop_receipt).await?;
        times.push(started.elapsed());
    }
    Ok(times)
}

/// The runner: intervals between handler returns with a full queue, and
/// its checkpoint requests.
async fn runner_jobs(env: &Env, jobs: usize) -> Result<(Vec<Duration>, Arc<StoreCalls>)> {
    fill(env, jobs).await?;
    let mut config = env.config(VM_A);
    config.concurrency = 1;
    let counting = CountingStore::new(env.storage.checkpoint_store(&config.checkpoint_container)?);
    let calls = Arc::clone(counting.calls());
    let worker = Worker::new(config, env.queue.clone(), env.poison.clone())
        .with_checkpoints(Arc::new(counting));
    let stop = worker.shutdown_token();
    let done = Arc::new(Mutex::new(Vec::new()));
    let handler = Timed {
        inner: CommandHandler::new(
            CommandConfig::new("/bin/true", Vec::<String>::new()),
            env.results.clone(),
        ),
        done: Arc::clone(&done),
    };
    let running = tokio::spawn(worker.run(handler));
    bounded("the jobs", async {
        while done.lock().unwrap().len() < jobs {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    stop.cancel();
    bounded("the worker to stop", running).await???;
    let ends = done.lock().unwrap().clone();
    Ok((ends.windows(2).map(|w| w[1] - w[0]).collect(), calls))
}

/// Sends `jobs` messages (bodies are ignored by `/bin/true`).
async fn fill(env: &Env, jobs: usize) -> Result<()> {
    for i in 0..jobs {
        env.queue
            .send(&format!("{{\"n\":{i}}}"), Duration::ZERO)
            .await?;
    }
    Ok(())
}

/// A handler that records when each job returned.
struct Timed<H> {
    inner: H,
    done: Arc<Mutex<Vec<Instant>>>,
}

impl<H: MessageHandler> MessageHandler for Timed<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let outcome = self.inner.handle(job).await;
        self.done.lock().unwrap().push(Instant::now());
        outcome
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        self.inner.job_key(body)
    }

    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        self.inner.verify_completed(body, result)
    }
}

/// The Python probe: marks itself ready, then writes CLOCK_MONOTONIC in ns
/// when SIGTERM arrives, and exits.
const PROBE: &str = r#"
import os, signal, sys, time
out = os.path.join(sys.argv[1], os.environ["SPOT_WORKER_MESSAGE_ID"])
for i in range(int(sys.argv[2])):
    open(os.path.join(os.environ["SPOT_WORKER_CHECKPOINT_DIR"], "f%05d" % i), "w").close()
def on_term(_s, _f):
    t = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    with open(out + ".term", "w") as f:
        f.write(str(t))
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(out + ".ready", "w").close()
while True:
    time.sleep(60)
"#;

async fn notice_to_sigterm(
    env: &Env,
    drains: &DrainClock,
    python: &Path,
    dir: &Path,
    files: usize,
) -> Result<Duration> {
    env.queue.send("{}", Duration::ZERO).await?;
    let config = env.config(VM_A);
    let worker = env.worker(config);
    let handler = CommandHandler::new(
        CommandConfig::new(
            python,
            [
                "-c".to_owned(),
                PROBE.to_owned(),
                dir.display().to_string(),
                files.to_string(),
            ],
        )
        .with_checkpoint_every(Duration::from_millis(10)),
        env.results.clone(),
    );
    let running = tokio::spawn(worker.run(handler));
    let ready = bounded("the probe to start", wait_for_suffix(dir, ".ready")).await?;
    let id = ready.file_stem().unwrap().to_string_lossy().into_owned();
    let seen_before = drains.count();
    let event = env.emulator.schedule(EventSpec::preempt())?;
    let report = bounded("the drain", running).await???;
    ensure!(
        report.stats.released >= 1,
        "the probe's message was released"
    );
    env.emulator.complete_event(&event.id)?;
    let term =
        std::fs::read_to_string(dir.join(format!("{id}.term"))).context("the probe got SIGTERM")?;
    let term_ns: u64 = term.trim().parse()?;
    let seen_ns = drains.nth(seen_before).context("the drain's log event")?;
    clear(env).await?;
    std::fs::remove_file(&ready)?;
    Ok(Duration::from_nanos(term_ns.saturating_sub(seen_ns)))
}

async fn notice_to_exit(env: &Env, drains: &DrainClock, programs: usize) -> Result<Duration> {
    let mut config = env.config(VM_A);
    config.concurrency = programs;
    config.visibility_timeout = Duration::from_secs(60);
    fill(env, programs).await?;
    let worker = env.worker(config);
    let started = Arc::new(Mutex::new(0usize));
    let handler = Counted {
        inner: CommandHandler::new(CommandConfig::new("sleep", ["600"]), env.results.clone()),
        started: Arc::clone(&started),
    };
    let running = tokio::spawn(worker.run(handler));
    bounded("every program to start", async {
        while *started.lock().unwrap() < programs {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    let seen_before = drains.count();
    let event = env.emulator.schedule(EventSpec::preempt())?;
    let report = bounded("the drain", running).await???;
    let exited = monotonic_ns();
    env.emulator.complete_event(&event.id)?;
    ensure!(
        report.stats.released as usize == programs,
        "released {} of {programs}",
        report.stats.released
    );
    let seen_ns = drains.nth(seen_before).context("the drain's log event")?;
    clear(env).await?;
    Ok(Duration::from_nanos(exited.saturating_sub(seen_ns)))
}

/// A handler that counts the jobs it started.
struct Counted<H> {
    inner: H,
    started: Arc<Mutex<usize>>,
}

impl<H: MessageHandler> MessageHandler for Counted<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        *self.started.lock().unwrap() += 1;
        self.inner.handle(job).await
    }
}

/// Deletes whatever a drain released, so the next run starts empty.
async fn clear(env: &Env) -> Result<()> {
    for _ in 0..100 {
        let left = env.queue.receive(32, Duration::from_secs(30)).await?;
        if left.is_empty() {
            return Ok(());
        }
        for message in left {
            env.queue.delete(&message.id, &message.pop_receipt).await?;
        }
    }
    bail!("the queue does not empty")
}

async fn wait_for_suffix(dir: &Path, suffix: &str) -> PathBuf {
    loop {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().ends_with(suffix) {
                    return entry.path();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Awaits `future`, an error after [`PATIENCE`].
async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(PATIENCE, future)
        .await
        .with_context(|| format!("{what}: timed out after {PATIENCE:?}"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
}

/// CLOCK_MONOTONIC in ns: the clock Python's probe reads.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// When the worker logged each drain start, on CLOCK_MONOTONIC.
#[derive(Clone, Default)]
struct DrainClock(Arc<Mutex<Vec<u64>>>);

impl DrainClock {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn nth(&self, n: usize) -> Option<u64> {
        self.0.lock().unwrap().get(n).copied()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DrainClock {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let at = monotonic_ns();
        let mut message = MessageOf(String::new());
        event.record(&mut message);
        if message.0.starts_with(DRAINING) {
            self.0.lock().unwrap().push(at);
        }
    }
}

struct MessageOf(String);

impl tracing::field::Visit for MessageOf {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

fn print_row(label: &str, times: &[Duration]) {
    println!(
        "   {label:<36} median {:>8.2} ms   p99 {:>8.2} ms   n = {}",
        median(times).as_secs_f64() * 1e3,
        percentile(times, 99.0).as_secs_f64() * 1e3,
        times.len()
    );
}
