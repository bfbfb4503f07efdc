//! `spot-worker demo`: a Spot eviction rehearsed end to end on this machine,
//! with nothing to set up. An in-process IMDS emulator plays Azure, the
//! in-memory backends (or a real Azurite with `--azurite`) play Storage, and
//! the primes job plays the user's work:
//!
//! 1. enqueue N jobs; worker A (VM `spotvmss_0`) takes them;
//! 2. at about 40 % of the work, Azure posts a Preempt for `spotvmss_0` with
//!    its 30 s notice; A drains: handlers checkpoint, their messages go back
//!    to the queue, the event is approved;
//! 3. worker B (VM `spotvmss_1`) resumes from the checkpoints and finishes;
//! 4. every result is checked against an independent count, and the queues
//!    for anything left behind.
//!
//! Every wait is on an event (the job's progress hook, a delivery finishing,
//! a worker returning), never on a sleep.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use serde_json::Value;
use spot_worker_azure::{AzureQueue, AzureStorage, StorageConfig};
use spot_worker_azurite_harness::{Azurite, HarnessError};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, RunningEmulator};
use spot_worker_primes::{PrimesConfig, PrimesHandler, PrimesJob, Progress, expected_result};
use spot_worker_runtime::{
    ImdsSettings, Readiness, RunReport, ShutdownSettings, Trigger, Worker, WorkerConfig,
    WorkerError,
};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, HandlerError, InMemoryCheckpointStore, InMemoryQueue,
    InMemoryResultStore, Job, MessageHandler, MessageQueue, ResultStore, async_trait,
    poison_queue_name,
};
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "jobs";
const CHECKPOINTS: &str = "checkpoints";
const RESULTS: &str = "results";
/// Azure's notice before a Spot VM is evicted.
const PREEMPT_NOTICE: Duration = Duration::from_secs(30);
/// How much of the work is done when the eviction comes, in percent.
const EVICT_AT_PERCENT: u64 = 40;
/// IMDS allows 5 requests per second; 4 leave a margin and notice quickly.
const IMDS_POLL: Duration = Duration::from_millis(250);
/// Numbers per job unless `--size` says otherwise: about 4 s of one core in
/// a release build; a debug build counts about ten times slower.
const DEFAULT_SIZE: u64 = if cfg!(debug_assertions) {
    200_000_000
} else {
    2_000_000_000
};
/// A checkpoint every 0.5 % of a job unless `--chunk-size` says otherwise:
/// tens of milliseconds of work, so a checkpoint write costs little next to
/// it, even on Azurite.
const DEFAULT_CHUNKS_PER_JOB: u64 = 200;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Jobs to enqueue: contiguous ranges of --size numbers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1000))]
    jobs: u64,

    /// Numbers per job [default: 2_000_000_000 in a release build (about 4 s
    /// of one core per job), 200_000_000 in a debug build].
    #[arg(long, value_name = "NUMBERS_PER_JOB", value_parser = parse_count)]
    size: Option<NonZeroU64>,

    /// Numbers counted between two checkpoints [default: 1/200 of --size].
    #[arg(long, value_name = "NUMBERS", value_parser = parse_count)]
    chunk_size: Option<NonZeroU64>,

    /// Jobs each worker runs at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=32))]
    concurrency: u16,

    /// Use a real Azurite through the Azure Storage backends instead of the
    /// in-memory ones (install it with `npm ci --prefix tools/azurite`).
    #[arg(long)]
    azurite: bool,
}

/// A positive count such as `8000000` or `8_000_000`.
fn parse_count(text: &str) -> Result<NonZeroU64, String> {
    let digits: String = text.trim().chars().filter(|&c| c != '_').collect();
    digits
        .parse::<NonZeroU64>()
        .map_err(|e| format!("{text:?} is not a positive whole number: {e}"))
}

/// Runs the demo; an error means it was interrupted, could not run, or one
/// of the final checks failed.
pub async fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    // Ctrl-C (or SIGTERM) asks both workers to drain, as a service manager
    // would; the demo then reports the interruption instead of a summary.
    let interrupted = CancellationToken::new();
    let on_signal = tokio::spawn({
        let interrupted = interrupted.clone();
        async move {
            crate::interrupted().await;
            interrupted.cancel();
        }
    });
    let result = match Demo::set_up(args, interrupted).await {
        Ok(demo) => demo.run(started).await,
        Err(error) => Err(error),
    };
    on_signal.abort();
    result
}

/// Which of the two workers (and so which VM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    A,
    B,
}

impl Who {
    fn vm(self) -> &'static str {
        match self {
            Who::A => "spotvmss_0",
            Who::B => "spotvmss_1",
        }
    }

    fn index(self) -> usize {
        match self {
            Who::A => 0,
            Who::B => 1,
        }
    }
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Who::A => "A",
            Who::B => "B",
        })
    }
}

/// Everything the demo runs with.
struct Demo {
    jobs: Vec<PrimesJob>,
    chunk_size: NonZeroU64,
    concurrency: usize,
    emulator: RunningEmulator,
    /// Worker B's own IMDS: instance metadata names each VM, and the worker
    /// refuses a configured name it contradicts.
    peer_emulator: RunningEmulator,
    storage: Storage,
    tracker: Tracker,
    interrupted: CancellationToken,
}

/// What worker A left behind when it was evicted.
struct Eviction {
    report: RunReport,
    /// Each job's checkpoint right after the drain, in job order.
    saved: Vec<Saved>,
}

/// A job's checkpoint as read from the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Saved {
    Nothing,
    InProgress { cursor: u64, primes: u64 },
    Completed { primes: u64 },
}

impl Demo {
    /// Starts the emulator and the storage, and enqueues the jobs.
    async fn set_up(args: DemoArgs, interrupted: CancellationToken) -> Result<Demo> {
        let size = args.size.map_or(DEFAULT_SIZE, NonZeroU64::get);
        let chunk_size = args.chunk_size.unwrap_or_else(|| {
            NonZeroU64::new(size / DEFAULT_CHUNKS_PER_JOB).unwrap_or(NonZeroU64::MIN)
        });
        let jobs = (0..args.jobs)
            .map(|i| {
                let start = i
                    .checked_mul(size)
                    .context("--jobs times --size is too large")?;
                let end = start
                    .checked_add(size)
                    .context("--jobs times --size is too large")?;
                PrimesJob::new(format!("j{}", i + 1), start, end).context("--jobs and --size")
            })
            .collect::<Result<Vec<_>>>()?;
        let tracker = Tracker::new(&jobs, std::io::stdout().is_terminal());
        tracker.say(
            "spot-worker demo: a Spot eviction rehearsed on this machine (Ctrl-C stops it cleanly)"
                .to_owned(),
        );

        let emulator = Emulator::start(EmulatorConfig::for_vm(Who::A.vm()))
            .await
            .context("starting the IMDS emulator")?;
        let peer_emulator = Emulator::start(EmulatorConfig::for_vm(Who::B.vm()))
            .await
            .context("starting worker B's IMDS emulator")?;
        tracker.say(format!(
            "IMDS emulator (plays Azure's Scheduled Events): {}",
            emulator.url()
        ));
        let storage = if args.azurite {
            Storage::azurite().await?
        } else {
            Storage::in_memory()
        };
        tracker.say(format!("storage: {}", storage.description));

        for job in &jobs {
            storage
                .queue
                .send(&job.to_message(), Duration::ZERO)
                .await
                .with_context(|| format!("enqueueing job {}", job.job_id))?;
        }
        tracker.say(format!(
            "enqueued {} jobs: count the primes in each range, checkpointing every {} numbers",
            jobs.len(),
            grouped(chunk_size.get())
        ));
        for job in &jobs {
            tracker.say(format!(
                "  {:<4} [{}, {})",
                job.job_id,
                grouped(job.start),
                grouped(job.end)
            ));
        }
        Ok(Demo {
            jobs,
            chunk_size,
            concurrency: usize::from(args.concurrency),
            emulator,
            peer_emulator,
            storage,
            tracker,
            interrupted,
        })
    }

    /// Evicts A mid-work, finishes on B, and checks the outcome.
    async fn run(self, started: Instant) -> Result<()> {
        let a = self.start_worker(Who::A).await?;
        let eviction = self.evict(a).await?;
        let b = self.start_worker(Who::B).await?;
        self.finish(b).await?;
        let outcome = self.check(&eviction, started).await;
        self.storage.close().await;
        outcome
    }

    /// Builds a worker for `who`'s VM on the shared queue and stores, and
    /// runs it in a task.
    async fn start_worker(&self, who: Who) -> Result<RunningWorker> {
        // Bound here rather than by the worker so the port can be printed.
        let health = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .context("binding a port for the health endpoints")?;
        let health_addr = health.local_addr().context("reading the health port")?;
        let defaults = WorkerConfig::default();
        let config = WorkerConfig {
            queue: QUEUE.to_owned(),
            concurrency: self.concurrency,
            health_addr,
            imds: ImdsSettings {
                enabled: true,
                endpoint: match who {
                    Who::A => self.emulator.url(),
                    Who::B => self.peer_emulator.url(),
                },
                vm_name: Some(who.vm().to_owned()),
                poll_interval: IMDS_POLL,
            },
            // Both workers share this process: a watchdog would end the
            // whole demo, and signals are the demo's to handle.
            shutdown: ShutdownSettings {
                watchdog: false,
                handle_signals: false,
                ..defaults.shutdown
            },
            ..defaults
        };
        let worker = Worker::new(
            config,
            Arc::clone(&self.storage.queue),
            Arc::clone(&self.storage.poison),
        )
        .with_checkpoints(Arc::clone(&self.storage.checkpoints))
        .with_health_listener(health);
        let stop = worker.shutdown_token();
        let tracker = self.tracker.clone();
        let primes = PrimesConfig {
            chunk_size: self.chunk_size,
            on_progress: Some(Arc::new(move |p: &Progress| tracker.chunk(who, p))),
        };
        let handler = Reporting {
            job: spot_worker_primes::handler(Arc::clone(&self.storage.results), primes),
            tracker: self.tracker.clone(),
        };
        self.tracker.say(format!(
            "\nworker {who} starts as VM {} (concurrency {}, readiness at http://{health_addr}/readyz)",
            who.vm(),
            self.concurrency
        ));
        tokio::spawn(announce_ready(
            worker.readiness(),
            self.tracker.clone(),
            who,
            Instant::now(),
        ));
        tokio::spawn(forward_cancel(self.interrupted.clone(), stop.clone()));
        Ok(RunningWorker {
            stop,
            task: tokio::spawn(worker.run(handler)),
        })
    }

    /// Lets A work until about 40 % of the numbers are counted, has Azure
    /// post a Preempt for A's VM, and shows how A drains.
    async fn evict(&self, mut a: RunningWorker) -> Result<Eviction> {
        let total = self.total_numbers();
        let threshold = total / 100 * EVICT_AT_PERCENT;
        tokio::select! {
            () = self.tracker.wait_until(|t| t.counted >= threshold) => {}
            ended = &mut a.task => return Err(self.stopped_early(Who::A, ended)),
        }
        let posted = SystemTime::now();
        let event = self
            .emulator
            .schedule(EventSpec::preempt().resources([Who::A.vm()]))
            .context("scheduling the Preempt")?;
        self.tracker.say(format!(
            "\n>>> {:.0} % of the work done: Azure posts Preempt {} for {} (30 s notice)",
            percent(self.tracker.totals().counted, total),
            event.id,
            Who::A.vm()
        ));
        let ended = match tokio::time::timeout(PREEMPT_NOTICE, &mut a.task).await {
            Ok(ended) => ended,
            Err(_) => {
                a.stop.cancel();
                bail!("worker A did not drain within the 30 s notice");
            }
        };
        self.tracker.end_status();
        let report = self.joined(Who::A, ended)?;
        let Trigger::Event(notice) = &report.shutdown.trigger else {
            return Err(self.stopped_early(Who::A, Ok(Ok(report))));
        };
        let seen_after = notice.first_seen.duration_since(posted).unwrap_or_default();
        let drain = &report.shutdown;
        self.tracker.say(format!(
            "A saw the notice {} after it was posted (polling every {}) and drained in {}",
            millis(seen_after),
            millis(IMDS_POLL),
            millis(drain.notice_to_drained)
        ));
        self.tracker.say(format!(
            "  messages released to the queue: {}; handlers cut off at the deadline: {}",
            report.stats.released,
            if drain.released_running_handlers {
                "yes"
            } else {
                "none"
            }
        ));
        let mut saved = Vec::with_capacity(self.jobs.len());
        for job in &self.jobs {
            let state = self.read_checkpoint(job).await?;
            self.tracker
                .say(format!("  {:<4} {}", job.job_id, describe(job, state)));
            saved.push(state);
        }
        let approved = self
            .emulator
            .approvals()
            .iter()
            .any(|approval| approval.event_id == event.id);
        self.tracker.say(if approved && drain.approved_event {
            "  event approved after the drain: yes (Azure may evict now rather than in 30 s)"
                .to_owned()
        } else {
            format!(
                "  event approved after the drain: no (worker says {}, emulator recorded {})",
                drain.approved_event, approved
            )
        });
        Ok(Eviction { report, saved })
    }

    /// Runs B until every job has its result, then stops it.
    async fn finish(&self, mut b: RunningWorker) -> Result<()> {
        let jobs = self.jobs.len() as u64;
        tokio::select! {
            () = self.tracker.wait_until(|t| t.finished >= jobs) => {}
            ended = &mut b.task => return Err(self.stopped_early(Who::B, ended)),
        }
        b.stop.cancel();
        let ended = (&mut b.task).await;
        self.tracker.end_status();
        let report = self.joined(Who::B, ended)?;
        self.tracker.say(format!(
            "every job has its result; B stopped ({}) in {}",
            report.shutdown.trigger,
            millis(report.shutdown.notice_to_drained)
        ));
        Ok(())
    }

    /// Verifies the outcome, prints the summary, and fails unless every
    /// check holds.
    async fn check(&self, eviction: &Eviction, started: Instant) -> Result<()> {
        let n = self.jobs.len() as u64;
        self.tracker.say(
            "\nverifying: counting every range again in one pass (no chunks, no checkpoints)..."
                .to_owned(),
        );
        let expected = tokio::select! {
            expected = expected_results(&self.jobs) => expected?,
            () = self.interrupted.cancelled() => bail!("interrupted while verifying the results"),
        };
        let mut done = 0;
        let mut verified = 0;
        for (job, expected) in self.jobs.iter().zip(&expected) {
            let name = job.result_name();
            let stored = self
                .storage
                .results
                .get(&name)
                .await
                .with_context(|| format!("reading result {name}"))?;
            if let Some(bytes) = stored {
                done += 1;
                if serde_json::from_slice::<Value>(&bytes).ok().as_ref() == Some(expected) {
                    verified += 1;
                }
            }
        }
        let (queued, poisoned) = self.storage.messages_left().await?;
        let finished = self.tracker.totals().finished;
        let duplicates = finished.saturating_sub(n);
        let drain = &eviction.report.shutdown;
        let drained_in_time = drain.met_deadline && drain.notice_to_drained < PREEMPT_NOTICE;
        let [counted_a, counted_b] = [Who::A, Who::B].map(|who| self.tracker.counted(who));
        let counted = counted_a + counted_b;
        let total = self.total_numbers();
        let interrupted_jobs = eviction
            .saved
            .iter()
            .filter(|s| matches!(s, Saved::InProgress { .. }))
            .count() as u64;
        let allowed = interrupted_jobs * self.chunk_size.get();
        let redone = counted.saturating_sub(total);
        let resumed_right = self.resumed_at_checkpoints(&eviction.saved);

        let mut failed = Vec::new();
        let mut check = |ok: bool, line: String| {
            if !ok {
                failed.push(line.clone());
            }
            self.tracker
                .say(format!("  {line}{}", if ok { "" } else { "   <-- FAILED" }));
        };
        self.tracker.say("\nsummary".to_owned());
        check(done == n, format!("jobs done {done}/{n}"));
        check(
            verified == n,
            format!("results verified {verified}/{n} (equal to count_primes over each range)"),
        );
        check(
            done == n && queued == 0 && poisoned == 0,
            format!(
                "lost {} ({queued} messages left in the queue, {poisoned} in the poison queue)",
                n - done + poisoned
            ),
        );
        check(
            duplicates == 0 && finished >= n,
            format!("duplicates {duplicates} ({finished} deliveries ran to the end for {n} jobs)"),
        );
        check(
            drained_in_time,
            format!(
                "drain {} from the notice to every message settled or released (Azure gives 30 s)",
                millis(drain.notice_to_drained)
            ),
        );
        check(
            resumed_right,
            "B resumed every job where its checkpoint was".to_owned(),
        );
        check(
            counted >= total && redone <= allowed,
            format!(
                "work redone after the eviction {} numbers (A counted {}, B {}, ranges {}; \
                 at most one chunk per interrupted job: {})",
                grouped(redone),
                grouped(counted_a),
                grouped(counted_b),
                grouped(total),
                grouped(allowed)
            ),
        );
        self.tracker.say(format!(
            "  wall time {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("demo check failed: {}", failed.join("; "))
        }
    }

    /// Whether B's first report on each job started where A's checkpoint
    /// said (or at the start for jobs A never touched; B never reports on
    /// a job A completed).
    fn resumed_at_checkpoints(&self, saved: &[Saved]) -> bool {
        self.jobs
            .iter()
            .zip(saved)
            .enumerate()
            .all(|(i, (job, saved))| {
                let first = self.tracker.first_report(i, Who::B);
                match *saved {
                    Saved::Nothing => first == Some(job.start) || job.start == job.end,
                    Saved::InProgress { cursor, .. } => first == Some(cursor) || cursor == job.end,
                    Saved::Completed { .. } => first.is_none(),
                }
            })
    }

    /// `job`'s checkpoint, read from the store as the next worker will.
    async fn read_checkpoint(&self, job: &PrimesJob) -> Result<Saved> {
        let read = self
            .storage
            .checkpoints
            .read(&job.job_id)
            .await
            .with_context(|| format!("reading the checkpoint of {}", job.job_id))?;
        let field = |value: &Value, name: &str| value.get(name).and_then(Value::as_u64);
        Ok(match read {
            None => Saved::Nothing,
            Some((Checkpoint::InProgress { progress }, _)) => Saved::InProgress {
                cursor: field(&progress, "cursor").unwrap_or(job.start),
                primes: field(&progress, "primes").unwrap_or(0),
            },
            Some((Checkpoint::Completed { result }, _)) => Saved::Completed {
                primes: field(&result, "primes").unwrap_or(0),
            },
        })
    }

    /// The worker's report, or why there is none.
    fn joined(
        &self,
        who: Who,
        ended: Result<Result<RunReport, WorkerError>, JoinError>,
    ) -> Result<RunReport> {
        ended
            .with_context(|| format!("worker {who} crashed"))?
            .with_context(|| format!("worker {who}"))
    }

    /// Why a worker returned before the demo asked it to.
    fn stopped_early(
        &self,
        who: Who,
        ended: Result<Result<RunReport, WorkerError>, JoinError>,
    ) -> anyhow::Error {
        if self.interrupted.is_cancelled() {
            return anyhow!(
                "interrupted: worker {who} drained and handed its unfinished jobs back to the queue"
            );
        }
        match self.joined(who, ended) {
            Ok(report) => anyhow!(
                "worker {who} stopped unexpectedly ({})",
                report.shutdown.trigger
            ),
            Err(error) => error,
        }
    }

    /// Numbers in all the jobs' ranges together.
    fn total_numbers(&self) -> u64 {
        self.jobs.iter().map(|j| j.end - j.start).sum()
    }
}

/// A worker running in a task.
struct RunningWorker {
    stop: CancellationToken,
    task: JoinHandle<Result<RunReport, WorkerError>>,
}

/// Prints when `who` passes its warmup gate and starts taking jobs.
async fn announce_ready(
    mut readiness: watch::Receiver<Readiness>,
    tracker: Tracker,
    who: Who,
    since: Instant,
) {
    // An error means the worker stopped before it was ready: nothing to say.
    if readiness.wait_for(Readiness::is_ready).await.is_ok() {
        tracker.say(format!(
            "{who} ready after {}: IMDS watched, storage reachable; taking jobs",
            millis(since.elapsed())
        ));
    }
}

/// Cancels `to` when `from` is cancelled; ends early once `to` is.
async fn forward_cancel(from: CancellationToken, to: CancellationToken) {
    tokio::select! {
        () = from.cancelled() => to.cancel(),
        () = to.cancelled() => {}
    }
}

/// Each job's correct result, from [`expected_result`] (one pass of
/// `count_primes` over the whole range). On plain threads, one per job,
/// rather than tokio's blocking pool, so that Ctrl-C need not wait for them.
async fn expected_results(jobs: &[PrimesJob]) -> Result<Vec<Value>> {
    let mut pending = Vec::with_capacity(jobs.len());
    for job in jobs {
        let (send, receive) = oneshot::channel();
        let job = job.clone();
        std::thread::Builder::new()
            .name(format!("verify-{}", job.job_id))
            .spawn(move || {
                let _ = send.send(expected_result(&job));
            })
            .context("starting a verification thread")?;
        pending.push(receive);
    }
    let mut expected = Vec::with_capacity(pending.len());
    for receive in pending {
        expected.push(receive.await.context("a verification thread died")?);
    }
    Ok(expected)
}

/// The primes job, telling the tracker when a delivery ran to the end.
struct Reporting {
    job: PrimesHandler,
    tracker: Tracker,
}

#[async_trait]
impl MessageHandler for Reporting {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.job.handle(job).await?;
        self.tracker.finished();
        Ok(())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        self.job.job_key(body)
    }

    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        self.job.verify_completed(body, result)
    }
}

/// Where the jobs, checkpoints and results live.
struct Storage {
    queue: Arc<dyn MessageQueue>,
    poison: Arc<dyn MessageQueue>,
    checkpoints: Arc<dyn CheckpointStore>,
    results: Arc<dyn ResultStore>,
    /// The same queues, concretely, to count what is left in them.
    queues: Queues,
    description: String,
}

/// The queues once more, as their own types: the traits cannot count.
enum Queues {
    Memory(InMemoryQueue, InMemoryQueue),
    Azure {
        queue: AzureQueue,
        poison: AzureQueue,
        azurite: Azurite,
    },
}

impl Storage {
    fn in_memory() -> Storage {
        let queue = InMemoryQueue::new(QUEUE);
        let poison = InMemoryQueue::new(&poison_queue_name(QUEUE));
        Storage {
            queue: Arc::new(queue.clone()),
            poison: Arc::new(poison.clone()),
            checkpoints: Arc::new(InMemoryCheckpointStore::new()),
            results: Arc::new(InMemoryResultStore::new(RESULTS)),
            queues: Queues::Memory(queue, poison),
            description: "in memory (--azurite for a real Azurite through the Azure backends)"
                .to_owned(),
        }
    }

    /// Starts Azurite and creates the queues and containers in it.
    async fn azurite() -> Result<Storage> {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await
            .context("starting Azurite")?
            .map_err(|error| match error {
                // Its log is many lines; the reason is enough here.
                HarnessError::NotReady { reason, .. } => anyhow!("Azurite did not start: {reason}"),
                HarnessError::NotInstalled(path) => anyhow!(
                    "Azurite is not installed at {} (install it with \
                     `npm ci --prefix tools/azurite`, set AZURITE_BIN, or leave out --azurite)",
                    path.display()
                ),
                other => anyhow!(other),
            })?;
        let config = StorageConfig::from_connection_string(&azurite.connection_string())
            .context("Azurite's connection string")?;
        let account = AzureStorage::new(config).context("configuring Azure Storage")?;
        let queue = account.queue(QUEUE)?;
        let poison = account.queue(&poison_queue_name(QUEUE))?;
        let checkpoints = account.checkpoint_store(CHECKPOINTS)?;
        let results = account.result_store(RESULTS)?;
        queue.prepare().await.context("creating the queue")?;
        poison
            .prepare()
            .await
            .context("creating the poison queue")?;
        checkpoints
            .prepare()
            .await
            .context("creating the checkpoint container")?;
        results
            .prepare()
            .await
            .context("creating the results container")?;
        Ok(Storage {
            queue: Arc::new(queue.clone()),
            poison: Arc::new(poison.clone()),
            checkpoints: Arc::new(checkpoints),
            results: Arc::new(results),
            description: format!(
                "Azurite (queue {QUEUE}, containers {CHECKPOINTS} and {RESULTS}) at {}",
                azurite.queue_endpoint()
            ),
            queues: Queues::Azure {
                queue,
                poison,
                azurite,
            },
        })
    }

    /// Messages still in the queue and in the poison queue, visible or not.
    async fn messages_left(&self) -> Result<(u64, u64)> {
        Ok(match &self.queues {
            Queues::Memory(queue, poison) => (queue.len() as u64, poison.len() as u64),
            Queues::Azure { queue, poison, .. } => (
                queue
                    .approximate_message_count()
                    .await
                    .context("counting the queue")?,
                poison
                    .approximate_message_count()
                    .await
                    .context("counting the poison queue")?,
            ),
        })
    }

    /// Stops Azurite, if started, off the runtime's threads (it waits for
    /// the process to exit).
    async fn close(self) {
        if let Queues::Azure { azurite, .. } = self.queues {
            let _ = tokio::task::spawn_blocking(move || drop(azurite)).await;
        }
    }
}

/// The jobs' progress as the workers report it, shared with the progress
/// hook. It also owns stdout, so progress and messages never mix mid-line.
#[derive(Clone)]
struct Tracker {
    board: Arc<Mutex<Board>>,
    totals: Arc<watch::Sender<Totals>>,
}

/// What the demo waits on.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    /// Numbers counted (and checkpointed) by either worker.
    counted: u64,
    /// Deliveries whose handler ran to the end (result written).
    finished: u64,
}

/// The tracker's state, behind its lock.
struct Board {
    jobs: Vec<JobState>,
    counted: [u64; 2],
    finished: u64,
    /// Redraw one status line (stdout is a terminal) rather than print a
    /// line per job and 10 %.
    tty: bool,
    /// The status line on screen, if any.
    status: Option<String>,
}

/// One job, as far as the progress reports go.
struct JobState {
    id: String,
    start: u64,
    end: u64,
    cursor: u64,
    /// The last multiple of 10 % printed.
    shown_tenths: u64,
    /// Where each worker's first report on the job began.
    first_report: [Option<u64>; 2],
}

impl JobState {
    /// How many tenths of the range are done.
    fn tenths(&self) -> u64 {
        // An empty range is all done.
        ((self.cursor - self.start) * 10)
            .checked_div(self.end - self.start)
            .unwrap_or(10)
    }
}

impl Tracker {
    fn new(jobs: &[PrimesJob], tty: bool) -> Tracker {
        let jobs = jobs
            .iter()
            .map(|job| JobState {
                id: job.job_id.clone(),
                start: job.start,
                end: job.end,
                cursor: job.start,
                shown_tenths: 0,
                first_report: [None, None],
            })
            .collect();
        Tracker {
            board: Arc::new(Mutex::new(Board {
                jobs,
                counted: [0, 0],
                finished: 0,
                tty,
                status: None,
            })),
            totals: Arc::new(watch::channel(Totals::default()).0),
        }
    }

    // Printing never panics while the lock is held, so a poisoned lock
    // still guards consistent data.
    fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The progress hook: a chunk of `p.job_id` was counted and
    /// checkpointed by `who`.
    fn chunk(&self, who: Who, p: &Progress) {
        let mut board = self.board();
        board.counted[who.index()] += p.cursor.saturating_sub(p.chunk_start);
        let tty = board.tty;
        let mut lines = Vec::new();
        if let Some(job) = board.jobs.iter_mut().find(|j| j.id == p.job_id) {
            if job.first_report[who.index()].is_none() {
                job.first_report[who.index()] = Some(p.chunk_start);
                if who == Who::B {
                    lines.push(if p.chunk_start == job.start {
                        format!("  {who}  {:<4} started at the beginning", job.id)
                    } else {
                        format!(
                            "  {who}  {:<4} resumed at {:.1} % ({}), where A's checkpoint was",
                            job.id,
                            percent(p.chunk_start - job.start, job.end - job.start),
                            grouped(p.chunk_start)
                        )
                    });
                }
            }
            job.cursor = p.cursor;
            let tenths = job.tenths();
            if tenths > job.shown_tenths {
                job.shown_tenths = tenths;
                if !tty {
                    lines.push(format!("  {who}  {:<4} {:>3} %", job.id, tenths * 10));
                }
            }
        }
        let status = tty.then(|| board.status_line(who));
        if !lines.is_empty() || (status.is_some() && status != board.status) {
            if status.is_some() {
                board.status = status;
            }
            board.print(&lines);
        }
        let totals = board.totals();
        drop(board);
        self.totals.send_replace(totals);
    }

    /// A delivery ran to the end.
    fn finished(&self) {
        let totals = {
            let mut board = self.board();
            board.finished += 1;
            board.totals()
        };
        self.totals.send_replace(totals);
    }

    /// Prints a line (or several), above the status line if there is one.
    fn say(&self, text: String) {
        self.board().print(&[text]);
    }

    /// Leaves the status line on screen as it is and starts a new line.
    fn end_status(&self) {
        let mut board = self.board();
        if board.status.take().is_some() {
            // Nothing useful to do if stdout is gone.
            let _ = writeln!(std::io::stdout());
        }
    }

    /// The totals now.
    fn totals(&self) -> Totals {
        *self.totals.borrow()
    }

    /// Resolves once `done` holds for the totals.
    async fn wait_until(&self, done: impl FnMut(&Totals) -> bool) {
        let mut totals = self.totals.subscribe();
        // The sender lives as long as `self`, so this ends only when `done`
        // holds.
        let _ = totals.wait_for(done).await;
    }

    /// Numbers `who` counted and checkpointed.
    fn counted(&self, who: Who) -> u64 {
        self.board().counted[who.index()]
    }

    /// Where `who`'s first report on the `job`-th job began: where it
    /// started or resumed.
    fn first_report(&self, job: usize, who: Who) -> Option<u64> {
        self.board()
            .jobs
            .get(job)
            .and_then(|j| j.first_report[who.index()])
    }
}

impl Board {
    fn totals(&self) -> Totals {
        Totals {
            counted: self.counted.iter().sum(),
            finished: self.finished,
        }
    }

    /// The status line for a terminal: each job's share done while `who`
    /// works.
    fn status_line(&self, who: Who) -> String {
        // A line that wraps could not be redrawn in place: a few jobs only.
        const SHOWN: usize = 6;
        let mut line = format!("  {who}");
        for job in self.jobs.iter().take(SHOWN) {
            let done = percent(job.cursor - job.start, job.end - job.start);
            line.push_str(&format!(" | {} {done:>3.0} %", job.id));
        }
        if self.jobs.len() > SHOWN {
            line.push_str(&format!(" | +{} more", self.jobs.len() - SHOWN));
        }
        let done = self.jobs.iter().map(|j| j.cursor - j.start).sum();
        let size = self.jobs.iter().map(|j| j.end - j.start).sum();
        line.push_str(&format!(" | all {:.0} %", percent(done, size)));
        line
    }

    /// Writes `lines`, then redraws the status line below them.
    fn print(&self, lines: &[String]) {
        let mut out = std::io::stdout().lock();
        // A closed stdout (`| head`) must not stop the demo halfway: the
        // workers would be left mid-drain. Write errors are ignored.
        if self.status.is_some() {
            let _ = write!(out, "\r\x1b[2K");
        }
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        if let Some(status) = &self.status {
            let _ = write!(out, "{status}");
        }
        let _ = out.flush();
    }
}

/// What a checkpoint says, for people.
fn describe(job: &PrimesJob, saved: Saved) -> String {
    let size = job.end - job.start;
    match saved {
        Saved::Nothing => "no checkpoint: not started".to_owned(),
        Saved::InProgress { cursor, primes } => format!(
            "checkpointed at {:.1} % (cursor {}, {} primes so far)",
            percent(cursor - job.start, size),
            grouped(cursor),
            grouped(primes)
        ),
        Saved::Completed { primes } => format!("completed: {} primes", grouped(primes)),
    }
}

/// `part` as a percentage of `whole` (100 for an empty whole).
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Milliseconds, with a decimal below 10 ms (a drain can take less than one).
fn millis(duration: Duration) -> String {
    if duration < Duration::from_millis(10) {
        format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accept_underscores() {
        assert_eq!(parse_count("8_000_000").map(NonZeroU64::get), Ok(8_000_000));
        assert!(parse_count("0").is_err());
        assert!(parse_count("many").is_err());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(2_000_000_000), "2,000,000,000");
    }
}
