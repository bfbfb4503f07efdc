//! How long from an eviction notice to a worker that has exited with every
//! in-flight message handed back, and how does that compare with what most
//! workers do on SIGTERM?
//!
//! `cargo bench --bench shutdown [-- --iterations N --baseline-iterations N]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a few-second
//! smoke version instead (K in {1, 4}, one run each, baseline capped at 2 s),
//! so the benchmark cannot rot unnoticed.
//!
//! Everything is real except the cloud: a real Azurite (a child process, on
//! 127.0.0.1), the IMDS emulator in-process, a release build. For each K
//! (messages in flight) and each run:
//!
//! 1. a fresh queue, checkpoint container and results container; K primes
//!    jobs far too long to finish during the measurement, counted in chunks
//!    of 10^6 with a checkpoint per chunk (so cancellation is prompt);
//! 2. a [`Worker`] with concurrency K and an IMDS poll interval of 250 ms
//!    takes them; we wait (progress hook + `watch`, no sleeps) until all K
//!    jobs have reported progress, i.e. K messages are in flight;
//! 3. a Preempt for the worker's VM is scheduled in the emulator; we time
//!    from the instant it became visible to `run()` returning ("notice to
//!    exit", which includes detection), note the worker's own
//!    `notice_to_drained`, check every message was released within the
//!    deadline, and receive them again at once from the test side
//!    (release-to-redelivery).
//!
//! The baseline, measured in the same run on the same jobs, is the strategy
//! most workers use on SIGTERM: stop taking messages and wait for the
//! in-flight handlers to finish (no cancellation, no checkpoint, no release),
//! i.e. the storage [`Consumer`] with [`DrainSignals::stop_receiving`]
//! only, capped at the 30 s an eviction notice gives. Its clock starts at the
//! stop itself (no detection), which favours it.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::runtime::{RunReport, Worker, WorkerConfig};
use spot_worker::storage::{
    CheckpointStore, Consumer, ConsumerConfig, DrainSignals, MessageQueue, ResultStore,
    poison_queue_name,
};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, RunningEmulator};
use spot_worker_primes::{PrimesConfig, PrimesHandler, PrimesJob, ProgressHook};
use spot_worker_testkit::Azurite;
use spot_worker_testkit::bench::{self, BenchArgs};
use tokio::sync::watch;

/// The VM the emulator serves and the worker runs as.
const VM: &str = "spotvmss_0";
/// The worker's Scheduled Events poll interval: detection adds at most this.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Numbers per job: 2*10^10, so that not even the baseline's 30 s of
/// undisturbed work finishes one, on any machine.
const JOB_SPAN: u64 = 20_000_000_000;
/// Numbers per chunk, i.e. between checkpoints and cancellation checks.
const CHUNK: NonZeroU64 = NonZeroU64::new(1_000_000).unwrap();
/// Message lease, renewed while a handler runs (both sides).
const VISIBILITY: Duration = Duration::from_secs(30);
/// Bound on every wait that is not itself measured.
const PATIENCE: Duration = Duration::from_secs(60);

struct Options {
    /// Messages in flight, for spot-worker.
    ks: Vec<usize>,
    iterations: usize,
    /// Messages in flight, for the baseline.
    baseline_ks: Vec<usize>,
    baseline_iterations: usize,
    /// The baseline's cap: the eviction notice.
    budget: Duration,
}

fn main() -> Result<()> {
    let options = parse_options(&BenchArgs::from_env())?;
    bench::init_logs();
    bench::runtime()?.block_on(run(options))
}

fn parse_options(args: &BenchArgs) -> Result<Options> {
    let mut options = if args.benchmarking() {
        Options {
            ks: vec![1, 8, 32],
            iterations: 10,
            baseline_ks: vec![8, 32],
            baseline_iterations: 3,
            budget: Duration::from_secs(30),
        }
    } else {
        Options {
            ks: vec![1, 4],
            iterations: 1,
            baseline_ks: vec![4],
            baseline_iterations: 1,
            budget: Duration::from_secs(2),
        }
    };
    args.each_flag(|flag, value| {
        match flag {
            "--iterations" => options.iterations = value.parse()?,
            "--baseline-iterations" => options.baseline_iterations = value.parse()?,
            _ => {}
        }
        Ok(())
    })?;
    if options.iterations == 0 || options.baseline_iterations == 0 {
        bail!("--iterations and --baseline-iterations must be at least 1");
    }
    Ok(options)
}

async fn run(options: Options) -> Result<()> {
    let bench = Bench::start().await?;
    print_setup(&options);

    let mut ours = Vec::new();
    for &k in &options.ks {
        let mut drains = Vec::new();
        for _ in 0..options.iterations {
            drains.push(bench.spot_worker_drain(k).await?);
        }
        ours.push((k, drains));
    }
    let mut baseline = Vec::new();
    for &k in &options.baseline_ks {
        let mut waits = Vec::new();
        for _ in 0..options.baseline_iterations {
            waits.push(bench.baseline_wait(k, options.budget).await?);
        }
        baseline.push((k, waits));
    }

    print_spot_worker(&ours);
    print_baseline(&baseline, options.budget);
    print_ratios(&ours, &baseline, options.budget);
    print_goal(&ours);
    let failed: usize = ours.iter().map(|(k, d)| failed_checks(*k, d)).sum();
    if failed > 0 {
        bail!("{failed} spot-worker run(s) failed a check (see the checks table)");
    }
    Ok(())
}

fn print_setup(options: &Options) {
    println!(
        "shutdown benchmark: K in {:?} messages in flight, {} run(s) each; baseline K in {:?}, {} run(s) each, capped at {:?}",
        options.ks,
        options.iterations,
        options.baseline_ks,
        options.baseline_iterations,
        options.budget
    );
    println!(
        "jobs: primes over {JOB_SPAN} numbers each (none finishes), chunks of {CHUNK} with a checkpoint each; \
         lease {VISIBILITY:?}; Azurite + in-process IMDS emulator on 127.0.0.1"
    );
    println!(
        "worker: concurrency K, IMDS poll interval {POLL_INTERVAL:?} (adds at most that to detection), \
         default drain budget and release margin, event approved after the drain\n"
    );
}

/// One spot-worker run.
struct Drain {
    /// Preempt visible in IMDS → `run()` returned.
    notice_to_exit: Duration,
    /// `report.drain.notice_to_drained`: seen → drained.
    seen_to_drained: Duration,
    released: u64,
    met_deadline: bool,
    released_running_handlers: bool,
    /// Distinct messages received again right after the drain.
    redelivered: usize,
    /// IMDS requests the emulator answered 429 (it limits to 5 per second,
    /// like IMDS; the watcher and the approval share that budget).
    throttled: u64,
}

/// One baseline run: how long waiting for the handlers took, or `None` if
/// it ran past the budget.
type Waited = Option<Duration>;

/// Azurite, a storage client for it, and the IMDS emulator, shared by every
/// run (each run gets its own queue and containers).
struct Bench {
    _azurite: Azurite,
    storage: AzureStorage,
    emulator: RunningEmulator,
}

/// A run's queue, poison queue and containers, prepared, with K jobs queued.
struct Stores {
    queue_name: String,
    checkpoint_container: String,
    queue: Arc<dyn MessageQueue>,
    poison: Arc<dyn MessageQueue>,
    checkpoints: Arc<dyn CheckpointStore>,
    results: Arc<dyn ResultStore>,
}

impl Bench {
    async fn start() -> Result<Bench> {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await?
            .context("starting azurite (run `npm ci --prefix tools/azurite`)")?;
        let config = StorageConfig::from_connection_string(&azurite.connection_string())?;
        let storage = AzureStorage::new(config)?;
        let emulator = Emulator::start(EmulatorConfig::for_vm(VM)).await?;
        Ok(Bench {
            _azurite: azurite,
            storage,
            emulator,
        })
    }

    async fn fresh_stores(&self, k: usize) -> Result<Stores> {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let queue_name = format!("shutdown-{suffix}");
        let checkpoint_container = format!("checkpoints-{suffix}");
        let stores = Stores {
            queue: Arc::new(self.storage.queue(&queue_name)?),
            poison: Arc::new(self.storage.queue(&poison_queue_name(&queue_name))?),
            checkpoints: Arc::new(self.storage.checkpoint_store(&checkpoint_container)?),
            results: Arc::new(self.storage.result_store(&format!("results-{suffix}"))?),
            queue_name,
            checkpoint_container,
        };
        bounded("preparing storage", async {
            stores.queue.prepare().await?;
            stores.poison.prepare().await?;
            stores.checkpoints.prepare().await?;
            stores.results.prepare().await?;
            for i in 0..k as u64 {
                let job = PrimesJob::new(format!("job{i}"), i * JOB_SPAN, (i + 1) * JOB_SPAN)?;
                stores.queue.send(&job.to_message(), Duration::ZERO).await?;
            }
            Ok(())
        })
        .await?;
        Ok(stores)
    }

    fn worker_config(&self, stores: &Stores, k: usize) -> WorkerConfig {
        let mut config = WorkerConfig {
            queue: stores.queue_name.clone(),
            checkpoint_container: stores.checkpoint_container.clone(),
            concurrency: k,
            visibility_timeout: VISIBILITY,
            health_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            ..WorkerConfig::default()
        };
        config.imds.endpoint = self.emulator.url();
        config.imds.vm_name = Some(VM.to_owned());
        config.imds.poll_interval = POLL_INTERVAL;
        config.drain.watchdog = false;
        config.drain.handle_signals = false;
        config
    }

    /// A worker with K jobs in flight is evicted; how long until it exits?
    async fn spot_worker_drain(&self, k: usize) -> Result<Drain> {
        self.emulator.reset();
        let stores = self.fresh_stores(k).await?;
        let in_flight = InFlight::default();
        let worker = Worker::new(
            self.worker_config(&stores, k),
            Arc::clone(&stores.queue),
            Arc::clone(&stores.poison),
        )
        .with_checkpoints(Arc::clone(&stores.checkpoints));
        let mut running = tokio::spawn(worker.run(primes(&stores, &in_flight)));
        in_flight.reached(k).await?;

        let event = self
            .emulator
            .schedule(EventSpec::preempt().resources([VM]))?;
        let report: RunReport = tokio::time::timeout(PATIENCE, &mut running)
            .await
            .context("run() did not return after the Preempt")???;
        let notice_to_exit = event.visible_at.elapsed();
        let throttled = self.emulator.stats().throttled;
        let redelivered = redelivered(stores.queue.as_ref(), k).await?;
        Ok(Drain {
            notice_to_exit,
            seen_to_drained: report.drain.notice_to_drained,
            released: report.stats.released,
            met_deadline: report.drain.met_deadline,
            released_running_handlers: report.drain.released_running_handlers,
            redelivered,
            throttled,
        })
    }

    /// Stop receiving and wait for K in-flight handlers, at most `budget`;
    /// then release whatever is left to clean up.
    async fn baseline_wait(&self, k: usize, budget: Duration) -> Result<Waited> {
        let stores = self.fresh_stores(k).await?;
        let in_flight = InFlight::default();
        let config = ConsumerConfig {
            max_in_flight: k,
            batch_size: u8::try_from(k.min(32))?,
            visibility_timeout: VISIBILITY,
            ..ConsumerConfig::default()
        };
        let consumer = Consumer::new(
            Arc::clone(&stores.queue),
            Arc::clone(&stores.poison),
            config,
        )?
        .with_checkpoints(Arc::clone(&stores.checkpoints));
        let signals = DrainSignals::new();
        let handler = primes(&stores, &in_flight);
        let mut running = tokio::spawn({
            let signals = signals.clone();
            async move { consumer.run_until(handler, signals).await }
        });
        in_flight.reached(k).await?;

        let stopped_at = Instant::now();
        signals.stop_receiving();
        if let Ok(joined) = tokio::time::timeout(budget, &mut running).await {
            joined?;
            return Ok(Some(stopped_at.elapsed()));
        }
        signals.release();
        tokio::time::timeout(PATIENCE, running)
            .await
            .context("the baseline consumer did not stop after the release")??;
        Ok(None)
    }
}

/// The primes job for this run's stores, reporting progress to `in_flight`.
fn primes(stores: &Stores, in_flight: &InFlight) -> PrimesHandler {
    spot_worker_primes::handler(
        Arc::clone(&stores.results),
        PrimesConfig {
            chunk_size: CHUNK,
            checkpoint_every: Some(Duration::ZERO),
            on_progress: Some(in_flight.hook()),
        },
    )
}

/// The jobs that have reported progress, watchable.
#[derive(Clone)]
struct InFlight(Arc<watch::Sender<HashSet<String>>>);

impl Default for InFlight {
    fn default() -> Self {
        InFlight(Arc::new(watch::channel(HashSet::new()).0))
    }
}

impl InFlight {
    fn hook(&self) -> ProgressHook {
        let seen = Arc::clone(&self.0);
        Arc::new(move |progress| {
            seen.send_if_modified(|jobs| jobs.insert(progress.job_id.clone()));
        })
    }

    /// Resolves once `k` jobs have reported progress.
    async fn reached(&self, k: usize) -> Result<()> {
        let mut seen = self.0.subscribe();
        let waited = tokio::time::timeout(PATIENCE, seen.wait_for(|jobs| jobs.len() >= k)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => bail!("the progress channel closed"),
            Err(_) => bail!("{k} jobs did not all start within {PATIENCE:?}"),
        }
    }
}

/// How many distinct messages the test side receives right away (1 s
/// visibility), up to `k`.
async fn redelivered(queue: &dyn MessageQueue, k: usize) -> Result<usize> {
    let mut bodies = HashSet::new();
    while bodies.len() < k {
        let batch = bounded("receiving the released messages", async {
            Ok(queue.receive(32, Duration::from_secs(1)).await?)
        })
        .await?;
        if batch.is_empty() {
            break;
        }
        bodies.extend(batch.into_iter().map(|m| m.body));
    }
    Ok(bodies.len())
}

async fn bounded<T>(what: &str, future: impl Future<Output = Result<T>>) -> Result<T> {
    bench::bounded(what, PATIENCE, future).await
}

fn print_spot_worker(ours: &[(usize, Vec<Drain>)]) {
    println!(
        "## spot-worker: notice to exit (Preempt visible in IMDS → `run()` returned, detection included)\n"
    );
    summary_table(
        ours.iter()
            .map(|(k, d)| (*k, Summary::of(d.iter().map(|d| d.notice_to_exit)))),
    );
    println!("\n## spot-worker: seen to drained (`report.drain.notice_to_drained`)\n");
    summary_table(
        ours.iter()
            .map(|(k, d)| (*k, Summary::of(d.iter().map(|d| d.seen_to_drained)))),
    );
    println!(
        "\n## spot-worker: the rest (notice to exit − seen to drained: detection, event approval, teardown)\n"
    );
    summary_table(ours.iter().map(|(k, d)| {
        let rest = d
            .iter()
            .map(|d| d.notice_to_exit.saturating_sub(d.seen_to_drained));
        (*k, Summary::of(rest))
    }));
    println!("\n## spot-worker: checks (runs passing / runs)\n");
    println!(
        "| K | released == K | deadline met | none cut off at release time | redelivered at once == K | IMDS 429s (all runs) |"
    );
    println!("|---|---|---|---|---|---|");
    for (k, drains) in ours {
        let count = |pass: &dyn Fn(&Drain) -> bool| {
            format!(
                "{}/{}",
                drains.iter().filter(|d| pass(d)).count(),
                drains.len()
            )
        };
        println!(
            "| {k} | {} | {} | {} | {} | {} |",
            count(&|d| d.released == *k as u64),
            count(&|d| d.met_deadline),
            count(&|d| !d.released_running_handlers),
            count(&|d| d.redelivered == *k),
            drains.iter().map(|d| d.throttled).sum::<u64>(),
        );
    }
}

/// Runs of `drains` that failed a hard check (release, deadline,
/// redelivery).
fn failed_checks(k: usize, drains: &[Drain]) -> usize {
    drains
        .iter()
        .filter(|d| d.released != k as u64 || !d.met_deadline || d.redelivered != k)
        .count()
}

fn print_baseline(baseline: &[(usize, Vec<Waited>)], budget: Duration) {
    println!(
        "\n## Baseline: stop receiving, wait for in-flight handlers (the usual SIGTERM handling), capped at {budget:?}\n"
    );
    println!(
        "Measured from the stop itself (no detection). A capped run means the VM is gone first.\n"
    );
    println!("| K | median | p90 | p99 | max | outcome |");
    println!("|---|---|---|---|---|---|");
    for (k, waits) in baseline {
        let capped = waits.iter().filter(|w| w.is_none()).count();
        let summary = Summary::of(waits.iter().map(|w| w.unwrap_or(budget)));
        let outcome = match capped {
            0 => "exited within the budget".to_owned(),
            n if n == waits.len() => format!(
                "> {} s (budget exceeded; the VM is gone with {k} jobs lost until their leases expire)",
                budget.as_secs()
            ),
            n => format!("{n} of {} runs exceeded the budget", waits.len()),
        };
        let cell = |ms: f64| capped_cell(ms, budget);
        println!(
            "| {k} | {} | {} | {} | {} | {outcome} |",
            cell(summary.median),
            cell(summary.p90),
            cell(summary.p99),
            cell(summary.max)
        );
    }
}

fn print_ratios(ours: &[(usize, Vec<Drain>)], baseline: &[(usize, Vec<Waited>)], budget: Duration) {
    println!("\n## Ratio spot-worker / baseline (medians; spot-worker's notice to exit)\n");
    println!("| K | spot-worker | baseline | ratio |");
    println!("|---|---|---|---|");
    for (k, waits) in baseline {
        let Some((_, drains)) = ours.iter().find(|(ko, _)| ko == k) else {
            continue;
        };
        let ours = Summary::of(drains.iter().map(|d| d.notice_to_exit)).median;
        let theirs = Summary::of(waits.iter().map(|w| w.unwrap_or(budget))).median;
        let capped = theirs >= ms(budget);
        println!(
            "| {k} | {ours:.1} ms | {} | {}{:.4} |",
            capped_cell(theirs, budget),
            if capped { "< " } else { "" },
            ours / theirs
        );
    }
}

fn print_goal(ours: &[(usize, Vec<Drain>)]) {
    let Some((_, drains)) = ours.iter().find(|(k, _)| *k == 32) else {
        println!(
            "\ngoal (K = 32: notice to exit median < 1000 ms, p99 < 2000 ms): not measured in this run"
        );
        return;
    };
    let summary = Summary::of(drains.iter().map(|d| d.notice_to_exit));
    let met = summary.median < 1000.0 && summary.p99 < 2000.0;
    println!(
        "\ngoal (K = 32: notice to exit median < 1000 ms, p99 < 2000 ms): {} (median {:.1} ms, p99 {:.1} ms)",
        if met { "met" } else { "NOT met" },
        summary.median,
        summary.p99
    );
}

fn summary_table(rows: impl Iterator<Item = (usize, Summary)>) {
    println!("| K | median | p90 | p99 | max |");
    println!("|---|---|---|---|---|");
    for (k, s) in rows {
        println!(
            "| {k} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            s.median, s.p90, s.p99, s.max
        );
    }
}

/// A baseline figure: `> budget` when it is the cap.
fn capped_cell(value_ms: f64, budget: Duration) -> String {
    if value_ms >= ms(budget) {
        format!("> {:.0} ms", ms(budget))
    } else {
        format!("{value_ms:.1} ms")
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Milliseconds.
struct Summary {
    median: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Summary {
    fn of(samples: impl Iterator<Item = Duration>) -> Summary {
        let mut sorted: Vec<f64> = samples.map(ms).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let at = |q: f64| sorted[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
        Summary {
            median: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: sorted[n - 1],
        }
    }
}
