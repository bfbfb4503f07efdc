//! How many messages per second does a worker move, what do checkpoints
//! cost, how much work does an eviction throw away, and does memory stay
//! flat while a big backlog drains? Each figure is set against a baseline
//! measured in the same run.
//!
//! `cargo bench --bench throughput [-- --messages N --rounds R --backlog M
//! --synthetic-backlog S --evictions E --peer-idle SECS
//! --only throughput|redone|memory]`
//!
//! Under `cargo test` (no `--bench` flag) it runs a few-second smoke version
//! instead, so the benchmark cannot rot unnoticed.
//!
//! Everything runs against one real Azurite (a child process on 127.0.0.1),
//! release build:
//!
//! 1. **Throughput** with a trivial handler, draining a pre-filled queue of N
//!    messages (a fresh queue per run, runs of the loops interleaved round by
//!    round, medians, ratios per round): a spot-worker [`Worker`] (leases on,
//!    checkpoints off, concurrency 32, so batches of 32); the plain loop a
//!    user would write against the same Azure SDK client (`AzureQueue`:
//!    receive 32, delete them all concurrently, repeat); and the Python
//!    `azure-storage-queue` SDK doing that loop (tools/python/bench_loop.py,
//!    sequential deletes as in the SDK samples, and 32 delete threads). For
//!    each run it reads Azurite's CPU time (`/proc/<pid>/stat` of the Azurite
//!    node process, found by its command line) and the client's, to say where
//!    the time goes and how close to Azurite's single-threaded limit we are.
//! 2. **Cost of checkpoints**: the same worker with a checkpoint store and a
//!    handler that writes one checkpoint per message, in the same rounds,
//!    and what each extra blob request costs Azurite and the client.
//!    Then **storage requests per job** by kind (receive, delete, update,
//!    blob read, blob write, create; counted by wrappers around the queue
//!    and the checkpoint store, see `throughput/requests.rs`) for every loop
//!    of 1 and 2, for long jobs that outlive their lease several times
//!    (renewals), each against the fewest the protocol allows.
//! 3. **Work redone per eviction**: a primes job is evicted at a random point
//!    (30 to 70 % of the way), another consumer finishes it, and the numbers
//!    counted twice are computed from the progress hooks: checkpoint every
//!    chunk vs a single chunk (no checkpoint before the end), each with a
//!    graceful eviction (notice: wind down, the handler saves how far it got)
//!    and a hard one (no notice: the handler is dropped, like `SIGKILL`). The
//!    same runs time release-to-redelivery (the drained worker's release
//!    call returning → the peer's handler starting); a separate measurement
//!    does it for peers that have idled on an empty queue for a long time.
//! 4. **Memory**: the RSS (`/proc/<child>/status`) of a worker process (this
//!    binary re-executed with `--serve-worker`, concurrency 32) idle on an
//!    empty queue, and sampled while it drains a backlog of M messages from
//!    Azurite, and S = 100,000 from a synthetic queue in the worker process
//!    (messages made up from a counter as they are received, so the backlog
//!    itself costs no memory; 5 ms per call, like a storage account in the
//!    same region). Why both: Azurite's queue operations cost
//!    time proportional to the queue's length (about 25 msg/s at 10,000
//!    messages on the 2-core machine of the README, against 300 at 2,000),
//!    so a 100,000-message backlog cannot drain from it in a bench run.

#[path = "throughput/requests.rs"]
mod requests;

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rand::Rng as _;
use serde_json::json;
use spot_worker::azure::{AzureQueue, AzureStorage, StorageConfig};
use spot_worker::runtime::{Worker, WorkerConfig};
use spot_worker::storage::{
    CheckpointStore, Consumer, ConsumerConfig, DrainSignals, HandlerError, Job, MessageHandler,
    MessageId, MessageQueue, PopReceipt, QueueMessage, ResultStore, StorageError, async_trait,
    handler_fn, poison_queue_name,
};
use spot_worker_primes::{PrimesConfig, PrimesJob, Progress};
use spot_worker_testkit::Azurite;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use requests::{CountedStore, QueueCounts, Requests};

/// Messages per receive, and the worker's concurrency.
const BATCH: u8 = 32;
/// Lease of every received message (all loops).
const VISIBILITY: Duration = Duration::from_secs(30);
/// Bound on every wait that is not itself measured (and on measured ones).
const PATIENCE: Duration = Duration::from_secs(600);
/// Concurrent sends while filling a queue.
const FILL_CONCURRENCY: usize = 64;
/// The time each call to the synthetic queue takes.
const SYNTHETIC_LATENCY: Duration = Duration::from_millis(5);
/// How the connection string reaches a child worker (not its command line).
const CONNECTION_ENV: &str = "SPOT_WORKER_BENCH_CONNECTION_STRING";
/// As in crates/azure/tests/python_interop.rs.
const PYTHON_SWITCH: &str = "SPOT_WORKER_PYTHON_INTEROP";

struct Options {
    /// Backlog drained per throughput run.
    messages: usize,
    rounds: usize,
    /// Backlog drained from Azurite in the memory measurement.
    backlog: usize,
    /// Backlog of the synthetic queue in the memory measurement.
    synthetic_backlog: usize,
    /// How long the idle worker's RSS is sampled.
    idle_window: Duration,
    /// Evictions per redone-work variant.
    evictions: usize,
    /// Numbers per primes job, and per chunk (checkpoint interval).
    job_span: u64,
    chunk: u64,
    /// Peers for the long-idle release-to-redelivery measurement, and how
    /// long they idle first.
    idle_peers: usize,
    peer_idle: Duration,
    /// The releases come at random moments of this window after the idle
    /// time.
    release_window: Duration,
    /// The long-job run: this many jobs at once, each running this long
    /// under leases of this visibility timeout.
    long_jobs: usize,
    long_job: Duration,
    long_visibility: Duration,
    /// Only this part: `throughput`, `redone` or `memory`.
    only: Option<String>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(at) = args.iter().position(|a| a == "--serve-worker") {
        let queue = args.get(at + 1).context("a queue after --serve-worker")?;
        let synthetic = match args.get(at + 2) {
            Some(count) => Some(count.parse()?),
            None => None,
        };
        return runtime.block_on(serve_worker(queue, synthetic));
    }
    let options = parse_options(&args)?;
    runtime.block_on(run(options))
}

fn parse_options(args: &[String]) -> Result<Options> {
    let benchmarking = args.iter().any(|a| a == "--bench");
    let mut options = if benchmarking {
        Options {
            messages: 2000,
            rounds: 5,
            backlog: 3000,
            synthetic_backlog: 100_000,
            idle_window: Duration::from_secs(5),
            evictions: 5,
            job_span: 2_000_000_000,
            chunk: 100_000_000,
            idle_peers: 8,
            peer_idle: Duration::from_secs(30),
            release_window: Duration::from_secs(10),
            long_jobs: 8,
            long_job: Duration::from_secs(100),
            long_visibility: Duration::from_secs(60),
            only: None,
        }
    } else {
        Options {
            messages: 64,
            rounds: 1,
            backlog: 300,
            synthetic_backlog: 1000,
            idle_window: Duration::from_millis(500),
            evictions: 1,
            job_span: 20_000_000,
            chunk: 2_000_000,
            idle_peers: 2,
            peer_idle: Duration::from_millis(500),
            release_window: Duration::from_millis(500),
            long_jobs: 2,
            long_job: Duration::from_secs(4),
            long_visibility: Duration::from_secs(5),
            only: None,
        }
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().context("a value after the flag");
        match arg.as_str() {
            "--messages" => options.messages = value()?.parse()?,
            "--rounds" => options.rounds = value()?.parse()?,
            "--backlog" => options.backlog = value()?.parse()?,
            "--synthetic-backlog" => options.synthetic_backlog = value()?.parse()?,
            "--evictions" => options.evictions = value()?.parse()?,
            "--peer-idle" => options.peer_idle = Duration::from_secs_f64(value()?.parse()?),
            "--only" => options.only = Some(value()?.clone()),
            // `cargo bench` passes `--bench`, `cargo test` may pass filters;
            // ignore what is not ours.
            _ => {}
        }
    }
    ensure!(
        options.messages > 0 && options.rounds > 0 && options.backlog > 0 && options.evictions > 0,
        "--messages, --rounds, --backlog and --evictions must be at least 1"
    );
    Ok(options)
}

async fn run(options: Options) -> Result<()> {
    let bench = Bench::start().await?;
    println!(
        "throughput benchmark: {} messages per run, {} interleaved round(s); one Azurite (pid {}) on 127.0.0.1; {} CPUs, load average {}\n",
        options.messages,
        options.rounds,
        bench.azurite_pid,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );

    let wanted = |part: &str| options.only.as_deref().is_none_or(|only| only == part);
    if wanted("throughput") {
        let throughput = bench.throughput(&options).await?;
        print_throughput(&throughput, &options);
        let long = bench.long_jobs(&options).await?;
        print_requests(&throughput, &long, &options);
    }
    if wanted("redone") {
        let redone = bench.redone_work(&options).await?;
        print_redone(&redone, &options);
        let idle_peers = bench.idle_peer_redelivery(&options).await?;
        print_redelivery(&redone, &idle_peers, &options);
    }
    if wanted("memory") {
        let memory = bench.memory(&options).await?;
        print_memory(&memory, &options);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Set-up

struct Bench {
    azurite: Azurite,
    storage: AzureStorage,
    azurite_pid: u32,
    python: Option<PathBuf>,
}

/// A run's queue and its poison queue, prepared.
struct Queues {
    name: String,
    queue: AzureQueue,
    poison: AzureQueue,
}

impl Bench {
    async fn start() -> Result<Bench> {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await?
            .context("starting azurite (run `npm ci --prefix tools/azurite`)")?;
        let storage = AzureStorage::new(StorageConfig::from_connection_string(
            &azurite.connection_string(),
        )?)?;
        let azurite_pid = azurite_pid(&azurite)?;
        Ok(Bench {
            azurite,
            storage,
            azurite_pid,
            python: python()?,
        })
    }

    async fn queues(&self, prefix: &str) -> Result<Queues> {
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let queues = Queues {
            queue: self.storage.queue(&name)?,
            poison: self.storage.queue(&poison_queue_name(&name))?,
            name,
        };
        bounded("preparing the queues", async {
            queues.queue.prepare().await?;
            queues.poison.prepare().await?;
            Ok(())
        })
        .await?;
        Ok(queues)
    }

    /// A prepared queue holding `count` small messages.
    async fn filled(&self, prefix: &str, count: usize) -> Result<Queues> {
        let queues = self.queues(prefix).await?;
        fill(&queues.queue, count).await?;
        Ok(queues)
    }

    fn cpu(&self) -> Result<Cpu> {
        Ok(Cpu {
            azurite: cpu_time(&self.azurite_pid.to_string())?,
            this: cpu_time("self")?,
        })
    }
}

/// Sends `count` messages, `FILL_CONCURRENCY` at a time.
async fn fill(queue: &AzureQueue, count: usize) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut senders = JoinSet::new();
    for _ in 0..FILL_CONCURRENCY.min(count) {
        let (queue, next) = (queue.clone(), Arc::clone(&next));
        senders.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count as u64 {
                    return Ok::<_, StorageError>(());
                }
                queue.send(&format!("message {i}"), Duration::ZERO).await?;
            }
        });
    }
    bounded("filling the queue", async {
        while let Some(sent) = senders.join_next().await {
            sent??;
        }
        Ok(())
    })
    .await
}

/// The node process of `azurite`, found by its `--queuePort` (the harness
/// does not expose its child's pid).
fn azurite_pid(azurite: &Azurite) -> Result<u32> {
    let endpoint = azurite.queue_endpoint();
    let port = endpoint
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .context("the queue endpoint's port")?
        .to_owned();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args
            .windows(2)
            .any(|w| w[0] == b"--queuePort" && w[1] == port.as_bytes())
        {
            return Ok(pid);
        }
    }
    bail!("no process with --queuePort {port} in /proc")
}

/// User + system CPU time of `/proc/<pid>`.
fn cpu_time(pid: &str) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("a /proc stat line")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15; `fields` starts at field 3.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).unwrap_or(100).max(1);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// VmRSS of `/proc/<pid>`, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("VmRSS in /proc status")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("a VmRSS value")?
        .parse()?)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/python")
}

/// The venv's interpreter; `None` if Python baselines are switched off
/// (like the interop tests: a missing venv is an error otherwise).
fn python() -> Result<Option<PathBuf>> {
    let disabled = std::env::var(PYTHON_SWITCH).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "disabled"
        )
    });
    if disabled {
        return Ok(None);
    }
    let interpreter = std::env::var_os("SPOT_WORKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| python_dir().join(".venv/bin/python"));
    ensure!(
        interpreter.exists(),
        "{} is missing: run scripts/test.sh (or set {PYTHON_SWITCH}=0 to skip the Python baseline)",
        interpreter.display()
    );
    Ok(Some(interpreter))
}

async fn bounded<T>(what: &str, future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(PATIENCE, future)
        .await
        .with_context(|| format!("{what}: timed out after {PATIENCE:?}"))?
}

/// Polls `done` every 5 ms until it holds, at most `PATIENCE`.
async fn wait_until(what: &str, done: impl Fn() -> bool) -> Result<()> {
    bounded(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    })
    .await
}

#[derive(Clone, Copy)]
struct Cpu {
    azurite: Duration,
    this: Duration,
}

// ---------------------------------------------------------------------------
// A queue that counts what is asked of it

/// Wraps a queue, counting calls, and timing the first receive, the
/// `target`-th delete and the last release (visibility set to zero).
struct Counted {
    inner: Arc<dyn MessageQueue>,
    target: u64,
    counts: QueueCounts,
    received: AtomicU64,
    deleted: watch::Sender<u64>,
    first_receive: Mutex<Option<Instant>>,
    target_reached: Mutex<Option<Instant>>,
    released_at: Mutex<Option<Instant>>,
}

impl Counted {
    fn new(inner: Arc<dyn MessageQueue>, target: u64) -> Arc<Counted> {
        Arc::new(Counted {
            inner,
            target,
            counts: QueueCounts::default(),
            received: AtomicU64::new(0),
            deleted: watch::channel(0).0,
            first_receive: Mutex::new(None),
            target_reached: Mutex::new(None),
            released_at: Mutex::new(None),
        })
    }

    /// Resolves once `target` messages are deleted.
    async fn all_deleted(&self) -> Result<()> {
        let mut deleted = self.deleted.subscribe();
        bounded("draining the queue", async {
            deleted
                .wait_for(|n| *n >= self.target)
                .await
                .map(drop)
                .context("the counter closed")
        })
        .await
    }

    /// First receive sent → `target`-th delete answered.
    fn elapsed(&self) -> Result<Duration> {
        let first = lock(&self.first_receive).context("no receive")?;
        let last = lock(&self.target_reached).context("target not reached")?;
        Ok(last - first)
    }
}

fn lock<T: Copy>(cell: &Mutex<T>) -> T {
    *cell.lock().unwrap_or_else(|p| p.into_inner())
}

fn set<T>(cell: &Mutex<T>, value: T) {
    *cell.lock().unwrap_or_else(|p| p.into_inner()) = value;
}

#[async_trait]
impl MessageQueue for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.counts.prepare.fetch_add(1, Ordering::Relaxed);
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        {
            let mut first = self.first_receive.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(Instant::now);
        }
        self.counts.receive.fetch_add(1, Ordering::Relaxed);
        let messages = self.inner.receive(max_messages, visibility_timeout).await?;
        self.received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        Ok(messages)
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        self.counts.update.fetch_add(1, Ordering::Relaxed);
        let receipt = self
            .inner
            .update_visibility(id, pop_receipt, visibility_timeout)
            .await?;
        if visibility_timeout.is_zero() {
            set(&self.released_at, Some(Instant::now()));
        }
        Ok(receipt)
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.counts.delete.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(id, pop_receipt).await?;
        let mut reached = false;
        self.deleted.send_modify(|n| {
            *n += 1;
            reached = *n == self.target;
        });
        if reached {
            set(&self.target_reached, Some(Instant::now()));
        }
        Ok(())
    }

    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.inner.send(body, delay).await
    }
}

// ---------------------------------------------------------------------------
// 1 + 2: throughput

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Loop {
    SpotWorker,
    SpotWorkerCheckpoints,
    RawRust,
    PythonSequential,
    PythonThreads,
}

impl Loop {
    fn label(self) -> &'static str {
        match self {
            Loop::SpotWorker => "spot-worker `Worker` (leases, no checkpoints)",
            Loop::SpotWorkerCheckpoints => "spot-worker `Worker`, 1 checkpoint write per message",
            Loop::RawRust => "raw Rust loop (`AzureQueue`: receive 32, 32 concurrent deletes)",
            Loop::PythonSequential => "Python SDK loop, sequential deletes",
            Loop::PythonThreads => "Python SDK loop, 32 delete threads",
        }
    }
}

/// One drained backlog.
#[derive(Clone, Copy)]
struct Drained {
    elapsed: Duration,
    messages: u64,
    receives: u64,
    /// Every storage request of the run, by kind.
    requests: Requests,
    /// CPU seconds over the run: Azurite's, and the client's (this process
    /// for the Rust loops, the Python process for Python).
    azurite_cpu: Duration,
    client_cpu: Duration,
    /// Wall time the CPU figures cover (a little more than `elapsed` for
    /// the worker, whose warm-up gate is in it).
    cpu_window: Duration,
}

impl Drained {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

type Rounds = Vec<HashMap<Loop, Drained>>;

/// What the worker's handler does with each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Nothing: the queue path alone.
    Trivial,
    /// Reads its checkpoint and writes it once.
    Checkpoint,
    /// Runs for `duration` under leases of `visibility`, renewed as it goes.
    Long {
        duration: Duration,
        visibility: Duration,
    },
}

impl Bench {
    async fn throughput(&self, options: &Options) -> Result<Rounds> {
        let mut loops = vec![Loop::SpotWorker, Loop::RawRust, Loop::SpotWorkerCheckpoints];
        if self.python.is_some() {
            loops.extend([Loop::PythonThreads, Loop::PythonSequential]);
        }
        let mut rounds = Vec::new();
        for round in 0..options.rounds {
            let mut results = HashMap::new();
            // Rotate the order so no loop always runs first (or after the
            // slowest).
            for i in 0..loops.len() {
                let which = loops[(i + round) % loops.len()];
                let drained = self.drain(which, options.messages).await?;
                eprintln!(
                    "round {}: {:<45} {:>8.0} msg/s",
                    round + 1,
                    format!("{which:?}"),
                    drained.rate()
                );
                results.insert(which, drained);
            }
            rounds.push(results);
        }
        Ok(rounds)
    }

    /// Jobs that outlive their lease several times: what renewals cost.
    async fn long_jobs(&self, options: &Options) -> Result<Drained> {
        let queues = self.filled("long", options.long_jobs).await?;
        let work = Work::Long {
            duration: options.long_job,
            visibility: options.long_visibility,
        };
        let drained = self.drain_worker(queues, options.long_jobs, work).await?;
        eprintln!(
            "long jobs: {} of {:?} under a {:?} lease: {:.2} updates per job",
            options.long_jobs,
            options.long_job,
            options.long_visibility,
            drained.requests.update / options.long_jobs as f64
        );
        Ok(drained)
    }

    async fn drain(&self, which: Loop, count: usize) -> Result<Drained> {
        let queues = self.filled("tput", count).await?;
        match which {
            Loop::SpotWorker => self.drain_worker(queues, count, Work::Trivial).await,
            Loop::SpotWorkerCheckpoints => self.drain_worker(queues, count, Work::Checkpoint).await,
            Loop::RawRust => self.drain_raw(queues, count).await,
            Loop::PythonSequential => self.drain_python(queues, count, "sequential").await,
            Loop::PythonThreads => self.drain_python(queues, count, "threads").await,
        }
    }

    async fn drain_worker(&self, queues: Queues, count: usize, work: Work) -> Result<Drained> {
        let counted = Counted::new(Arc::new(queues.queue), count as u64);
        let mut config = worker_config(&queues.name);
        if let Work::Long { visibility, .. } = work {
            config.visibility_timeout = visibility;
        }
        let mut worker = Worker::new(
            config,
            Arc::clone(&counted) as Arc<dyn MessageQueue>,
            Arc::new(queues.poison),
        );
        let mut counted_store = None;
        if work == Work::Checkpoint {
            let store = self
                .storage
                .checkpoint_store(&format!("ckpt-{}", queues.name))?;
            store.prepare().await?;
            let store = CountedStore::new(Arc::new(store));
            counted_store = Some(Arc::clone(&store));
            worker = worker.with_checkpoints(store);
        }
        let stop = worker.shutdown_token();
        let before = self.cpu()?;
        let started = Instant::now();
        let running = match work {
            Work::Checkpoint => tokio::spawn(worker.run(handler_fn(|job: Job| async move {
                let mut checkpoint = job.checkpoint().await?;
                checkpoint.save_progress(json!({ "done": 1 })).await?;
                Ok::<(), HandlerError>(())
            }))),
            Work::Trivial => tokio::spawn(
                worker.run(handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) })),
            ),
            // The job's own duration: simulated work, not a wait for anything.
            Work::Long { duration, .. } => {
                tokio::spawn(worker.run(handler_fn(move |_job: Job| async move {
                    tokio::time::sleep(duration).await;
                    Ok::<(), HandlerError>(())
                })))
            }
        };
        counted.all_deleted().await?;
        let after = self.cpu()?;
        let cpu_window = started.elapsed();
        stop.cancel();
        let report = tokio::time::timeout(PATIENCE, running)
            .await
            .context("the worker did not stop")???;
        ensure!(
            report.stats.succeeded == count as u64,
            "the worker handled {} of {count} messages",
            report.stats.succeeded
        );
        Ok(Drained {
            elapsed: counted.elapsed()?,
            messages: count as u64,
            receives: counted.counts.receive.load(Ordering::Relaxed),
            requests: requests::requests(&counted.counts, counted_store.as_deref()),
            azurite_cpu: after.azurite - before.azurite,
            client_cpu: after.this - before.this,
            cpu_window,
        })
    }

    /// What a user writes without a framework: receive 32, handle, delete
    /// all 32 concurrently, repeat; the same SDK client as the worker.
    async fn drain_raw(&self, queues: Queues, count: usize) -> Result<Drained> {
        let queue = queues.queue;
        let before = self.cpu()?;
        let started = Instant::now();
        let mut deleted = 0;
        let mut receives = 0;
        bounded("the raw loop", async {
            while deleted < count {
                let batch = queue.receive(BATCH, VISIBILITY).await?;
                receives += 1;
                let deletes = batch
                    .iter()
                    .map(|message| queue.delete(&message.id, &message.pop_receipt));
                for result in futures_util::future::join_all(deletes).await {
                    result?;
                }
                deleted += batch.len();
            }
            Ok(())
        })
        .await?;
        let elapsed = started.elapsed();
        let after = self.cpu()?;
        Ok(Drained {
            elapsed,
            messages: deleted as u64,
            receives,
            requests: Requests {
                receive: receives as f64,
                delete: deleted as f64,
                ..Requests::default()
            },
            azurite_cpu: after.azurite - before.azurite,
            client_cpu: after.this - before.this,
            cpu_window: elapsed,
        })
    }

    async fn drain_python(&self, queues: Queues, count: usize, mode: &str) -> Result<Drained> {
        let interpreter = self.python.as_ref().context("no Python")?;
        let mut command = Command::new(interpreter);
        command
            .arg(python_dir().join("bench_loop.py"))
            .arg(&queues.name)
            .arg(count.to_string())
            .arg(mode)
            .arg(PATIENCE.as_secs().to_string())
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                self.azurite.connection_string(),
            )
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .kill_on_drop(true);
        let before = self.cpu()?;
        let started = Instant::now();
        let output = tokio::time::timeout(PATIENCE + Duration::from_secs(10), command.output())
            .await
            .context("bench_loop.py did not finish")??;
        let window = started.elapsed();
        let after = self.cpu()?;
        ensure!(
            output.status.success(),
            "bench_loop.py {mode} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .context("bench_loop.py prints one JSON object")?;
        let number = |key: &str| {
            report[key]
                .as_f64()
                .with_context(|| format!("`{key}` in {report}"))
        };
        let elapsed = Duration::from_secs_f64(number("seconds")?);
        // One delete per message; the SDK adds nothing else.
        let requests = Requests {
            receive: number("receives")?,
            delete: number("deleted")?,
            ..Requests::default()
        };
        Ok(Drained {
            elapsed,
            messages: number("deleted")? as u64,
            receives: number("receives")? as u64,
            requests,
            azurite_cpu: after.azurite - before.azurite,
            client_cpu: Duration::from_secs_f64(number("cpu_seconds")?),
            // Azurite's CPU is read around the whole process (interpreter
            // start-up included, when Azurite idles).
            cpu_window: window,
        })
    }
}

fn worker_config(queue: &str) -> WorkerConfig {
    let mut config = WorkerConfig {
        queue: queue.to_owned(),
        concurrency: usize::from(BATCH),
        visibility_timeout: VISIBILITY,
        health_addr: "127.0.0.1:0".parse().expect("a socket address"),
        ..WorkerConfig::default()
    };
    // No IMDS here: the figures are the queue path's.
    config.imds.enabled = false;
    config.drain.watchdog = false;
    config.drain.handle_signals = false;
    config
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn print_throughput(rounds: &Rounds, options: &Options) {
    let loops = [
        Loop::SpotWorker,
        Loop::RawRust,
        Loop::PythonThreads,
        Loop::PythonSequential,
        Loop::SpotWorkerCheckpoints,
    ];
    let of = |which: Loop| -> Vec<Drained> {
        rounds
            .iter()
            .filter_map(|r| r.get(&which).copied())
            .collect()
    };
    // Per-round ratio against `base`, then the median of those.
    let ratio = |which: Loop, base: Loop| {
        median(
            rounds
                .iter()
                .filter_map(|r| Some(r.get(&which)?.rate() / r.get(&base)?.rate()))
                .collect(),
        )
    };
    println!(
        "## 1. Throughput: draining {} pre-filled messages, trivial handler ({} round(s), medians)\n",
        options.messages, options.rounds
    );
    println!(
        "Azurite ceiling = messages/s if Azurite's node process had a whole core (1 / its CPU seconds per message).\n"
    );
    println!(
        "| loop | msg/s | min | max | ratio to raw Rust | Azurite CPU, cores | Azurite CPU per msg | client CPU per msg | msgs per receive | % of Azurite ceiling |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for which in loops {
        let runs = of(which);
        if runs.is_empty() {
            continue;
        }
        let rates: Vec<f64> = runs.iter().map(Drained::rate).collect();
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        let az_cores = median(
            runs.iter()
                .map(|d| d.azurite_cpu.as_secs_f64() / d.cpu_window.as_secs_f64())
                .collect(),
        );
        let az_per_msg = median(
            runs.iter()
                .map(|d| d.azurite_cpu.as_secs_f64() / d.messages as f64)
                .collect(),
        );
        let client_per_msg = median(
            runs.iter()
                .map(|d| d.client_cpu.as_secs_f64() / d.messages as f64)
                .collect(),
        );
        let per_receive = median(
            runs.iter()
                .map(|d| d.messages as f64 / d.receives.max(1) as f64)
                .collect(),
        );
        let of_ceiling = median(
            runs.iter()
                .map(|d| d.rate() * d.azurite_cpu.as_secs_f64() / d.messages as f64)
                .collect(),
        );
        println!(
            "| {} | {:.0} | {min:.0} | {max:.0} | {:.2} | {az_cores:.2} | {:.0} µs | {:.0} µs | {per_receive:.1} | {:.0} % |",
            which.label(),
            median(rates.clone()),
            ratio(which, Loop::RawRust),
            az_per_msg * 1e6,
            client_per_msg * 1e6,
            of_ceiling * 100.0
        );
    }
    let worker_vs_raw = ratio(Loop::SpotWorker, Loop::RawRust);
    println!(
        "\ngoal spot-worker ≥ 0.9 × raw Rust loop: {} (median per-round ratio {worker_vs_raw:.2})",
        if worker_vs_raw >= 0.9 {
            "met"
        } else {
            "NOT met"
        }
    );
    if !of(Loop::PythonThreads).is_empty() {
        println!(
            "spot-worker / Python (32 delete threads): {:.2}; / Python (sequential): {:.2}",
            ratio(Loop::SpotWorker, Loop::PythonThreads),
            ratio(Loop::SpotWorker, Loop::PythonSequential)
        );
    }
    let checkpoints = ratio(Loop::SpotWorkerCheckpoints, Loop::SpotWorker);
    println!(
        "\n## 2. Cost of checkpoints (same rounds)\n\nspot-worker with one checkpoint write per message / without: {checkpoints:.2} of the throughput \
         (goal ≥ 0.75: {}; each message costs 2 blob requests more: the consumer's completed-checkpoint read, which `job.checkpoint()` reuses, and the write)",
        if checkpoints >= 0.75 {
            "met"
        } else {
            "NOT met"
        }
    );
    // Where the time goes: what the extra requests cost Azurite and the
    // client, per request.
    let per_message = |which: Loop, cpu: fn(&Drained) -> Duration| {
        median(
            of(which)
                .iter()
                .map(|d| cpu(d).as_secs_f64() / d.messages as f64)
                .collect(),
        )
    };
    let blob_requests = |which: Loop| {
        median(
            of(which)
                .iter()
                .map(|d| {
                    let per_job = d.requests.per(d.messages);
                    per_job.blob_read + per_job.blob_write + per_job.create
                })
                .collect(),
        )
    };
    let extra = blob_requests(Loop::SpotWorkerCheckpoints) - blob_requests(Loop::SpotWorker);
    if extra > 0.0 {
        let azurite = |d: &Drained| d.azurite_cpu;
        let client = |d: &Drained| d.client_cpu;
        let cost = |cpu: fn(&Drained) -> Duration| {
            (per_message(Loop::SpotWorkerCheckpoints, cpu) - per_message(Loop::SpotWorker, cpu))
                / extra
                * 1e6
        };
        println!(
            "where the time goes: {extra:.2} blob requests more per message, each costing Azurite {:.0} µs of CPU and the client {:.0} µs \
             (Azurite CPU per message without checkpoints: {:.0} µs)\n",
            cost(azurite),
            cost(client),
            per_message(Loop::SpotWorker, azurite) * 1e6
        );
    }
}

/// Requests per job by kind, each loop's median run, against the minimum.
fn print_requests(rounds: &Rounds, long: &Drained, options: &Options) {
    let per_job = |which: Loop| -> Option<Requests> {
        let mut runs: Vec<&Drained> = rounds.iter().filter_map(|r| r.get(&which)).collect();
        runs.sort_by(|a, b| a.requests.total().total_cmp(&b.requests.total()));
        let median = runs.get(runs.len() / 2)?;
        Some(median.requests.per(median.messages))
    };
    // A lease must be renewed once for each further period the job runs.
    let renewals = |job: Duration, lease: Duration| {
        ((job.as_secs_f64() / lease.as_secs_f64()).ceil() as u64).saturating_sub(1)
    };
    println!(
        "## Storage requests per job (median run; `create` = checkpoint creates and queue/container creation)
"
    );
    println!("{}", Requests::HEADER);
    let rows = [
        (Loop::SpotWorker, "spot-worker, trivial handler"),
        (Loop::RawRust, "raw Rust SDK loop, trivial"),
        (Loop::PythonThreads, "Python SDK loop (threads), trivial"),
        (
            Loop::PythonSequential,
            "Python SDK loop (sequential), trivial",
        ),
    ];
    for (which, label) in rows {
        if let Some(requests) = per_job(which) {
            println!("{}", requests.row(label));
        }
    }
    println!(
        "{}",
        Requests::minimum(BATCH, false, 0).row("protocol minimum, trivial")
    );
    if let Some(requests) = per_job(Loop::SpotWorkerCheckpoints) {
        println!(
            "{}",
            requests.row("spot-worker, one checkpoint write per job")
        );
    }
    println!(
        "{}",
        Requests::minimum(BATCH, true, 0).row("protocol minimum, one checkpoint write")
    );
    let long_label = format!(
        "spot-worker, {} jobs of {:?} under a {:?} lease",
        options.long_jobs, options.long_job, options.long_visibility
    );
    println!("{}", long.requests.per(long.messages).row(&long_label));
    let minimum = Requests::minimum(
        BATCH,
        false,
        renewals(options.long_job, options.long_visibility),
    );
    // The long jobs all fit into one receive, not a 32nd of one each.
    let minimum = Requests {
        receive: 1.0 / options.long_jobs as f64,
        ..minimum
    };
    println!("{}", minimum.row("protocol minimum, same long jobs"));
    println!();
}

// ---------------------------------------------------------------------------
// 3: work redone per eviction, and release-to-redelivery

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eviction {
    /// A notice: wind down, the handler saves the part it counted.
    Graceful,
    /// No notice: the handler is dropped where it stands (like `SIGKILL`;
    /// the message is released at once here, which does not change the
    /// work redone).
    Hard,
}

#[derive(Clone, Copy)]
struct Variant {
    checkpoint_every: u64,
    eviction: Eviction,
}

struct Redone {
    variant: Variant,
    /// Numbers counted twice.
    numbers: u64,
    /// Wall time those numbers took (at the job's rate).
    time: Duration,
    /// Release answered → peer's handler started.
    release_to_redelivery: Duration,
    /// How long the peer had idled on the empty queue before the release.
    peer_idle: Duration,
    /// Whether the first delivery's reach was estimated (hard evictions:
    /// the part of a chunk counted when it was dropped is not reported).
    estimated: bool,
}

/// Progress reports with their times.
type Reports = Arc<Mutex<Vec<(Instant, Progress)>>>;

/// A handler that notes when each delivery started, then runs `inner`.
struct Timed<H> {
    inner: H,
    started: Arc<Mutex<Vec<Instant>>>,
}

impl<H: MessageHandler> MessageHandler for Timed<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Instant::now());
        self.inner.handle(job).await
    }
}

/// One consumer running the primes job on `queue`, with its progress
/// reports and delivery start times.
struct PrimesConsumer {
    signals: DrainSignals,
    running: tokio::task::JoinHandle<spot_worker::storage::ConsumerStats>,
    reports: Reports,
    started: Arc<Mutex<Vec<Instant>>>,
}

impl PrimesConsumer {
    fn start(
        queue: Arc<dyn MessageQueue>,
        poison: Arc<dyn MessageQueue>,
        checkpoints: Arc<dyn CheckpointStore>,
        results: Arc<dyn ResultStore>,
        chunk: u64,
    ) -> Result<PrimesConsumer> {
        let config = one_at_a_time();
        let consumer = Consumer::new(queue, poison, config)?.with_checkpoints(checkpoints);
        let reports: Reports = Arc::default();
        let hook_reports = Arc::clone(&reports);
        let primes = spot_worker_primes::handler(
            results,
            PrimesConfig {
                chunk_size: NonZeroU64::new(chunk).context("a chunk of at least 1")?,
                // Every chunk is a checkpoint interval here.
                checkpoint_every: Duration::ZERO,
                on_progress: Some(Arc::new(move |progress: &Progress| {
                    hook_reports
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), progress.clone()));
                })),
            },
        );
        let started = Arc::default();
        let handler = Timed {
            inner: primes,
            started: Arc::clone(&started),
        };
        let signals = DrainSignals::new();
        let running = tokio::spawn({
            let signals = signals.clone();
            async move { consumer.run_until(handler, signals).await }
        });
        Ok(PrimesConsumer {
            signals,
            running,
            reports,
            started,
        })
    }

    fn reports(&self) -> Vec<(Instant, Progress)> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn first_start(&self) -> Option<Instant> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .copied()
    }

    async fn stopped(self) -> Result<spot_worker::storage::ConsumerStats> {
        tokio::time::timeout(PATIENCE, self.running)
            .await
            .context("the consumer did not stop")?
            .context("the consumer panicked")
    }
}

impl Bench {
    async fn redone_work(&self, options: &Options) -> Result<Vec<Redone>> {
        // How long a whole job takes, to evict at a random point of it.
        let span = options.job_span;
        let probe = span / 20;
        let timed = Instant::now();
        tokio::task::spawn_blocking(move || spot_worker_primes::count_primes(0, probe)).await?;
        let job_time = timed.elapsed() * 20;
        eprintln!("redone work: a whole job takes about {job_time:?} here");
        let variants = [
            (options.chunk, Eviction::Graceful),
            (options.chunk, Eviction::Hard),
            (span, Eviction::Graceful),
            (span, Eviction::Hard),
        ];
        let mut all = Vec::new();
        for _ in 0..options.evictions {
            for (checkpoint_every, eviction) in variants {
                let at = job_time.mul_f64(rand::rng().random_range(0.3..0.7));
                let variant = Variant {
                    checkpoint_every,
                    eviction,
                };
                all.push(self.evict_in_time(variant, span, at).await?);
            }
        }
        Ok(all)
    }

    /// [`Bench::evict_once`], earlier each time the job finished before its
    /// eviction: the job's duration is estimated from a probe, which a busy
    /// machine (other builds on the 2 cores) can make too long.
    async fn evict_in_time(&self, variant: Variant, span: u64, at: Duration) -> Result<Redone> {
        let mut at = at;
        for _ in 0..6 {
            if let Some(redone) = self.evict_once(variant, span, at).await? {
                return Ok(redone);
            }
            eprintln!(
                "redone work: the job finished before its eviction at {at:?}; again, earlier"
            );
            at /= 2;
        }
        bail!("the job always finished before its eviction, even at {at:?}")
    }

    /// One job evicted `at` after it started; `None` if it finished first.
    async fn evict_once(
        &self,
        variant: Variant,
        span: u64,
        at: Duration,
    ) -> Result<Option<Redone>> {
        let queues = self.queues("redo").await?;
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(
            self.storage
                .checkpoint_store(&format!("ckpt-{}", queues.name))?,
        );
        let results: Arc<dyn ResultStore> =
            Arc::new(self.storage.result_store(&format!("res-{}", queues.name))?);
        checkpoints.prepare().await?;
        results.prepare().await?;
        let job = PrimesJob::new("job", 0, span)?;
        queues.queue.send(&job.to_message(), Duration::ZERO).await?;
        let queue: Arc<dyn MessageQueue> = Arc::new(queues.queue);
        let poison: Arc<dyn MessageQueue> = Arc::new(queues.poison);

        // The first worker takes the job; the peer starts polling once it
        // has (and finds the queue empty until the release).
        let first_queue = Counted::new(Arc::clone(&queue), 0);
        let first = PrimesConsumer::start(
            Arc::clone(&first_queue) as Arc<dyn MessageQueue>,
            Arc::clone(&poison),
            Arc::clone(&checkpoints),
            Arc::clone(&results),
            variant.checkpoint_every,
        )?;
        wait_until("the first delivery", || first.first_start().is_some()).await?;
        let first_started = first.first_start().context("started")?;
        let peer_queue = Counted::new(Arc::clone(&queue), 1);
        let peer = PrimesConsumer::start(
            Arc::clone(&peer_queue) as Arc<dyn MessageQueue>,
            poison,
            checkpoints,
            results,
            variant.checkpoint_every,
        )?;
        let peer_started_polling = Instant::now();

        tokio::time::sleep_until(first_started + at).await;
        let evicted_at = Instant::now();
        match variant.eviction {
            Eviction::Graceful => first
                .signals
                .wind_down(Some(evicted_at + Duration::from_secs(10))),
            Eviction::Hard => first.signals.release(),
        }
        let first_reports = Arc::clone(&first.reports);
        let first_stats = first.stopped().await?;
        // After the stop: a graceful eviction reports its last, partial save.
        let first_reports = first_reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if first_stats.succeeded == 1 && first_stats.released == 0 {
            peer.signals.release();
            peer.stopped().await?;
            return Ok(None);
        }
        ensure!(
            first_stats.released == 1,
            "the evicted delivery was not released: {first_stats:?}"
        );
        let released_at = lock(&first_queue.released_at).context("no release")?;
        // Finished: its message deleted.
        peer_queue.all_deleted().await?;
        let peer_reports = peer.reports();
        let peer_start = peer.first_start().context("the peer never started")?;
        peer.signals.release();
        let peer_stats = peer.stopped().await?;
        ensure!(
            peer_stats.succeeded == 1,
            "the peer did not finish: {peer_stats:?}"
        );

        // Where the peer resumed, and its rate (uninterrupted, same chunks).
        let (_, resumed) = peer_reports.first().context("no peer progress")?;
        let resumed_at = resumed.chunk_start;
        let (peer_done, _) = peer_reports.last().context("no peer progress")?;
        let rate = (span - resumed_at) as f64 / (*peer_done - peer_start).as_secs_f64();
        // How far the first delivery got.
        let (saved, saved_at) = first_reports
            .iter()
            .rfind(|(at, _)| *at <= evicted_at || variant.eviction == Eviction::Graceful)
            .map_or((0, first_started), |(at, p)| (p.cursor, *at));
        let (reach, estimated) = match variant.eviction {
            // The partial chunk was saved and reported.
            Eviction::Graceful => (saved, false),
            // Counted since the last save, at the job's rate, and not past
            // the chunk it was in.
            Eviction::Hard => {
                let since = (evicted_at - saved_at).as_secs_f64() * rate;
                let chunk_end = (saved + variant.checkpoint_every).min(span);
                ((saved + since as u64).min(chunk_end), true)
            }
        };
        let numbers = reach.saturating_sub(resumed_at);
        Ok(Some(Redone {
            variant,
            numbers,
            time: Duration::from_secs_f64(numbers as f64 / rate),
            release_to_redelivery: peer_start.saturating_duration_since(released_at),
            peer_idle: released_at - peer_started_polling,
            estimated,
        }))
    }

    /// Release-to-redelivery for peers that have been polling an empty queue
    /// for `peer_idle`, as in a fleet where every message is leased: each of
    /// `idle_peers` pairs (own queue) holds a message until a release at a
    /// random moment of `release_window` after the idle time.
    async fn idle_peer_redelivery(&self, options: &Options) -> Result<Vec<Duration>> {
        let mut pairs = JoinSet::new();
        for _ in 0..options.idle_peers {
            let queues = self.queues("idle").await?;
            queues.queue.send("hold me", Duration::ZERO).await?;
            let delay = options.peer_idle
                + options
                    .release_window
                    .mul_f64(rand::rng().random_range(0.0..1.0));
            pairs.spawn(release_to_idle_peer(queues, delay));
        }
        bounded("the idle peers", async {
            let mut samples = Vec::new();
            while let Some(sample) = pairs.join_next().await {
                samples.push(sample??);
            }
            Ok(samples)
        })
        .await
    }
}

/// A consumer taking one message at a time, idling like a `Worker` does (its
/// idle poll is capped, 1 s by default).
fn one_at_a_time() -> ConsumerConfig {
    ConsumerConfig {
        max_in_flight: 1,
        batch_size: 1,
        visibility_timeout: VISIBILITY,
        idle_backoff_max: WorkerConfig::default().idle_poll_max,
        ..ConsumerConfig::default()
    }
}

async fn release_to_idle_peer(queues: Queues, release_after: Duration) -> Result<Duration> {
    let config = one_at_a_time();
    let queue = Counted::new(Arc::new(queues.queue), 0);
    let poison: Arc<dyn MessageQueue> = Arc::new(queues.poison);
    let holder = Consumer::new(
        Arc::clone(&queue) as Arc<dyn MessageQueue>,
        Arc::clone(&poison),
        config.clone(),
    )?;
    let held = Arc::new(tokio::sync::Notify::new());
    let holder_signals = DrainSignals::new();
    let holding = tokio::spawn({
        let (signals, held) = (holder_signals.clone(), Arc::clone(&held));
        async move {
            let handler = handler_fn(move |job: Job| {
                let held = Arc::clone(&held);
                async move {
                    held.notify_one();
                    job.cancellation().cancelled().await;
                    Err::<(), HandlerError>("evicted".into())
                }
            });
            holder.run_until(handler, signals).await
        }
    });
    tokio::time::timeout(PATIENCE, held.notified())
        .await
        .context("the holder never got its message")?;
    let peer = Consumer::new(Arc::clone(&queue) as Arc<dyn MessageQueue>, poison, config)?;
    let started = Arc::new(Mutex::new(None));
    let peer_signals = DrainSignals::new();
    let peering = tokio::spawn({
        let (signals, started) = (peer_signals.clone(), Arc::clone(&started));
        async move {
            let handler = handler_fn(move |_job: Job| {
                let started = Arc::clone(&started);
                async move {
                    set(&started, Some(Instant::now()));
                    Ok::<(), HandlerError>(())
                }
            });
            peer.run_until(handler, signals).await
        }
    });
    tokio::time::sleep(release_after).await;
    holder_signals.wind_down(Some(Instant::now() + Duration::from_secs(5)));
    let stats = tokio::time::timeout(PATIENCE, holding).await??;
    ensure!(stats.released == 1, "the holder did not release: {stats:?}");
    let released_at = lock(&queue.released_at).context("no release")?;
    wait_until("the idle peer taking the message", || {
        lock(&started).is_some()
    })
    .await?;
    peer_signals.release();
    tokio::time::timeout(PATIENCE, peering).await??;
    let started = lock(&started).context("started")?;
    Ok(started.saturating_duration_since(released_at))
}

fn print_redone(redone: &[Redone], options: &Options) {
    println!(
        "## 3. Work redone per eviction (primes job of {} numbers, evicted 30-70 % of the way, {} eviction(s) per row)\n",
        options.job_span, options.evictions
    );
    println!(
        "| checkpoints | eviction | redone numbers: median | max | in checkpoint intervals (max) | redone time: median | max |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut rows: Vec<(u64, Eviction)> = Vec::new();
    for r in redone {
        let key = (r.variant.checkpoint_every, r.variant.eviction);
        if !rows.contains(&key) {
            rows.push(key);
        }
    }
    for (every, eviction) in rows {
        let runs: Vec<&Redone> = redone
            .iter()
            .filter(|r| r.variant.checkpoint_every == every && r.variant.eviction == eviction)
            .collect();
        let numbers: Vec<f64> = runs.iter().map(|r| r.numbers as f64).collect();
        let max_numbers = numbers.iter().copied().fold(0.0, f64::max);
        let times: Vec<f64> = runs.iter().map(|r| r.time.as_secs_f64() * 1000.0).collect();
        let max_time = times.iter().copied().fold(0.0, f64::max);
        let checkpoints = if every >= options.job_span {
            "none before the end (1 chunk)".to_owned()
        } else {
            format!("every {every} numbers")
        };
        let how = match eviction {
            Eviction::Graceful => "notice (wind down)",
            Eviction::Hard => "none (handler dropped)",
        };
        let estimated = if runs.iter().any(|r| r.estimated) {
            " (est.)"
        } else {
            ""
        };
        println!(
            "| {checkpoints} | {how} | {:.3e}{estimated} | {max_numbers:.3e} | {:.2} | {:.0} ms | {max_time:.0} ms |",
            median(numbers.clone()),
            max_numbers / options.chunk as f64,
            median(times),
        );
    }
    let chunked_max = redone
        .iter()
        .filter(|r| r.variant.checkpoint_every == options.chunk)
        .map(|r| r.numbers)
        .max()
        .unwrap_or(0);
    println!(
        "\ngoal (with checkpoints, at most one checkpoint interval = {} numbers redone): {} (worst {chunked_max})",
        options.chunk,
        if chunked_max <= options.chunk {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "(est.: a dropped handler's last partial chunk is not reported; it is estimated from the time since its last checkpoint at the peer's measured rate, capped at the chunk's end)\n"
    );
}

fn print_redelivery(redone: &[Redone], idle_peers: &[Duration], options: &Options) {
    println!("## Release-to-redelivery (release answered → peer's handler started)\n");
    println!("| peer | runs | median | max | peer idle before the release: median |");
    println!("|---|---|---|---|---|");
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let fresh: Vec<f64> = redone
        .iter()
        .filter(|r| r.variant.checkpoint_every == options.chunk)
        .map(|r| ms(&r.release_to_redelivery))
        .collect();
    let fresh_idle = median(redone.iter().map(|r| ms(&r.peer_idle)).collect());
    println!(
        "| started polling when the job started (the redone-work runs, checkpointed) | {} | {:.0} ms | {:.0} ms | {fresh_idle:.0} ms |",
        fresh.len(),
        median(fresh.clone()),
        fresh.iter().copied().fold(0.0, f64::max),
    );
    let idle: Vec<f64> = idle_peers.iter().map(ms).collect();
    println!(
        "| idle on an empty queue for ≥ {:?} (the worker's idle poll, at most 1 s) | {} | {:.0} ms | {:.0} ms | ≥ {:.0} ms |",
        options.peer_idle,
        idle.len(),
        median(idle.clone()),
        idle.iter().copied().fold(0.0, f64::max),
        ms(&options.peer_idle),
    );
    let worst = fresh.iter().chain(&idle).copied().fold(0.0, f64::max);
    println!(
        "\ngoal (release to redelivery under 1 s): {} (worst {worst:.0} ms; an idle peer's next poll comes after its idle backoff, which `ConsumerConfig::idle_backoff_max` caps)\n",
        if worst < 1000.0 { "met" } else { "NOT met" }
    );
}

// ---------------------------------------------------------------------------
// 4: memory

/// Child mode: a worker (concurrency 32, trivial handler) on Azurite queue
/// `queue`, or on a synthetic queue of `synthetic` messages; prints `ready`
/// once its gate is open (then, for a synthetic queue, `left N` every 100 ms
/// until none are), stops when stdin closes.
async fn serve_worker(queue: &str, synthetic: Option<u64>) -> Result<()> {
    let connection = std::env::var(CONNECTION_ENV).context(CONNECTION_ENV)?;
    let storage = AzureStorage::new(StorageConfig::from_connection_string(&connection)?)?;
    let poison = Arc::new(storage.queue(&poison_queue_name(queue))?);
    let worker = match synthetic {
        Some(count) => {
            let synthetic = Arc::new(Synthetic::new(queue, count));
            let progress = Arc::clone(&synthetic);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let left = progress.left();
                    println!("left {left}");
                    if left == 0 {
                        return;
                    }
                }
            });
            Worker::new(worker_config(queue), synthetic, poison)
        }
        None => Worker::new(
            worker_config(queue),
            Arc::new(storage.queue(queue)?),
            poison,
        ),
    };
    let stop = worker.shutdown_token();
    let mut readiness = worker.readiness();
    tokio::spawn(async move {
        if readiness.wait_for(|r| r.is_ready()).await.is_ok() {
            println!("ready");
        }
    });
    tokio::task::spawn_blocking(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        stop.cancel();
    });
    worker
        .run(handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) }))
        .await?;
    Ok(())
}

/// A queue of `total` messages that exist only as a counter: each receive
/// makes up the next ones, each delete counts one as done. Every call takes
/// `SYNTHETIC_LATENCY`, a storage round trip within an Azure region, so the
/// drain runs at a real account's pace rather than Azurite's.
struct Synthetic {
    name: String,
    total: u64,
    next: AtomicU64,
    deleted: AtomicU64,
}

impl Synthetic {
    fn new(name: &str, total: u64) -> Self {
        Synthetic {
            name: name.to_owned(),
            total,
            next: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
        }
    }

    fn left(&self) -> u64 {
        self.total
            .saturating_sub(self.deleted.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl MessageQueue for Synthetic {
    fn name(&self) -> &str {
        &self.name
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        Ok(())
    }

    async fn receive(
        &self,
        max_messages: u8,
        _visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        let first = self
            .next
            .fetch_add(u64::from(max_messages), Ordering::Relaxed);
        let end = (first + u64::from(max_messages)).min(self.total);
        Ok((first.min(end)..end)
            .map(|i| QueueMessage {
                id: MessageId::new(format!("{i:016x}")),
                pop_receipt: PopReceipt::new(format!("receipt-{i}")),
                body: format!("message {i}"),
                dequeue_count: 1,
                inserted_at: None,
            })
            .collect())
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        _pop_receipt: &PopReceipt,
        _visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        Ok(PopReceipt::new(format!("renewed-{id}")))
    }

    async fn delete(&self, _id: &MessageId, _pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        self.deleted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn send(&self, _body: &str, _delay: Duration) -> Result<MessageId, StorageError> {
        Err(StorageError::InvalidArgument(
            "the synthetic queue takes no messages".to_owned(),
        ))
    }
}

/// A worker child, killed on drop.
struct WorkerProcess {
    child: Child,
    pid: u32,
    /// What it prints after `ready`: the latest `left N` of a synthetic
    /// queue.
    left: watch::Receiver<Option<u64>>,
}

impl WorkerProcess {
    async fn spawn(bench: &Bench, queue: &str, synthetic: Option<usize>) -> Result<WorkerProcess> {
        let mut command = Command::new(std::env::current_exe()?);
        command.arg("--serve-worker").arg(queue);
        if let Some(count) = synthetic {
            command.arg(count.to_string());
        }
        let mut child = command
            .env(CONNECTION_ENV, bench.azurite.connection_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the worker process")?;
        let pid = child.id().context("the worker's pid")?;
        let stdout = child.stdout.take().context("the worker's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .context("the worker did not become ready")??;
        ensure!(
            line.as_deref() == Some("ready"),
            "the worker said {line:?} instead of ready"
        );
        let (tell, left) = watch::channel(None);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(n) = line.strip_prefix("left ").and_then(|n| n.parse().ok()) {
                    tell.send_replace(Some(n));
                }
            }
        });
        Ok(WorkerProcess { child, pid, left })
    }

    async fn stop(mut self) -> Result<()> {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .context("the worker did not exit")??;
        ensure!(status.success(), "the worker exited with {status}");
        Ok(())
    }
}

struct Memory {
    idle_kib: Vec<u64>,
    fill_time: Duration,
    azurite: Drain,
    synthetic: Drain,
}

struct Drain {
    backlog: usize,
    /// (time since start, RSS KiB, messages left).
    samples: Vec<(Duration, u64, u64)>,
    time: Duration,
}

impl Bench {
    async fn memory(&self, options: &Options) -> Result<Memory> {
        eprintln!("memory: idle worker");
        let idle_queue = self.queues("idle").await?;
        let worker = WorkerProcess::spawn(self, &idle_queue.name, None).await?;
        let mut idle_kib = Vec::new();
        let until = Instant::now() + options.idle_window;
        while Instant::now() < until {
            idle_kib.push(rss_kib(worker.pid)?);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        worker.stop().await?;

        eprintln!("memory: filling {} messages", options.backlog);
        let filling = Instant::now();
        let queues = self.filled("backlog", options.backlog).await?;
        let fill_time = filling.elapsed();
        eprintln!("memory: filled in {fill_time:?}; draining");
        let worker = WorkerProcess::spawn(self, &queues.name, None).await?;
        let azurite = sample_drain(&worker, options.backlog, async || {
            Ok(queues.queue.approximate_message_count().await?)
        })
        .await?;
        worker.stop().await?;

        eprintln!(
            "memory: draining a synthetic backlog of {}",
            options.synthetic_backlog
        );
        let synthetic_queue = self.queues("synthetic").await?;
        let worker =
            WorkerProcess::spawn(self, &synthetic_queue.name, Some(options.synthetic_backlog))
                .await?;
        let left = worker.left.clone();
        let backlog = options.synthetic_backlog as u64;
        let synthetic = sample_drain(&worker, options.synthetic_backlog, async || {
            Ok((*left.borrow()).unwrap_or(backlog))
        })
        .await?;
        worker.stop().await?;
        Ok(Memory {
            idle_kib,
            fill_time,
            azurite,
            synthetic,
        })
    }
}

/// Samples the worker's RSS every 100 ms while `left` (asked every 0.5 s)
/// falls to zero, and for 1 s after.
async fn sample_drain(
    worker: &WorkerProcess,
    backlog: usize,
    left: impl AsyncFn() -> Result<u64>,
) -> Result<Drain> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut remaining = backlog as u64;
    let mut asked = None::<Instant>;
    bounded("draining the backlog", async {
        loop {
            if asked.is_none_or(|at| at.elapsed() >= Duration::from_millis(500)) {
                remaining = left().await?;
                asked = Some(Instant::now());
                if samples.len() % 100 == 0 {
                    eprintln!("memory: {remaining} left after {:?}", started.elapsed());
                }
            }
            samples.push((started.elapsed(), rss_kib(worker.pid)?, remaining));
            if remaining == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await?;
    let time = started.elapsed();
    // A little after the drain: does memory come back down?
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        samples.push((started.elapsed(), rss_kib(worker.pid)?, 0));
    }
    Ok(Drain {
        backlog,
        samples,
        time,
    })
}

fn print_memory(memory: &Memory, options: &Options) {
    let mib = |kib: f64| kib / 1024.0;
    let idle: Vec<f64> = memory.idle_kib.iter().map(|k| *k as f64).collect();
    let idle_median = median(idle.clone());
    let idle_max = idle.iter().copied().fold(0.0, f64::max);
    println!("## 4. Memory: worker process RSS (concurrency 32, trivial handler)\n");
    println!(
        "Azurite backlog: {} messages, sent in {:.1} s ({FILL_CONCURRENCY} concurrent sends), drained in {:.1} s ({:.0} msg/s). \
         Synthetic backlog: {} messages, drained in {:.1} s ({:.0} msg/s).\n",
        options.backlog,
        memory.fill_time.as_secs_f64(),
        memory.azurite.time.as_secs_f64(),
        memory.azurite.backlog as f64 / memory.azurite.time.as_secs_f64(),
        memory.synthetic.backlog,
        memory.synthetic.time.as_secs_f64(),
        memory.synthetic.backlog as f64 / memory.synthetic.time.as_secs_f64(),
    );
    println!(
        "| phase | idle, empty Azurite queue | draining {} from Azurite | draining {} synthetic |",
        memory.azurite.backlog, memory.synthetic.backlog
    );
    println!("|---|---|---|---|");
    let at = |drain: &Drain, fraction: f64| {
        let total = drain.backlog as f64;
        drain
            .samples
            .iter()
            .find(|(_, _, left)| (total - *left as f64) / total >= fraction)
            .map_or("?".to_owned(), |(_, kib, _)| {
                format!("{:.1} MiB", mib(*kib as f64))
            })
    };
    println!(
        "| median of {} samples | {:.1} MiB (max {:.1}) | | |",
        idle.len(),
        mib(idle_median),
        mib(idle_max)
    );
    for (label, fraction) in [
        ("first sample", 0.0),
        ("25 % drained", 0.25),
        ("50 % drained", 0.5),
        ("75 % drained", 0.75),
        ("drained", 1.0),
    ] {
        println!(
            "| {label} | | {} | {} |",
            at(&memory.azurite, fraction),
            at(&memory.synthetic, fraction)
        );
    }
    let peak = |drain: &Drain| {
        drain
            .samples
            .iter()
            .map(|(_, kib, _)| *kib as f64)
            .fold(0.0, f64::max)
    };
    let last = |drain: &Drain| {
        drain
            .samples
            .last()
            .map_or(f64::NAN, |(_, kib, _)| mib(*kib as f64))
    };
    println!(
        "| peak while draining | | {:.1} MiB ({} samples) | {:.1} MiB ({} samples) |",
        mib(peak(&memory.azurite)),
        memory.azurite.samples.len(),
        mib(peak(&memory.synthetic)),
        memory.synthetic.samples.len()
    );
    println!(
        "| 1 s after the drain | | {:.1} MiB | {:.1} MiB |",
        last(&memory.azurite),
        last(&memory.synthetic)
    );
    let worst = peak(&memory.azurite).max(peak(&memory.synthetic));
    println!(
        "\npeak while draining / idle median: {:.2} (goal: flat, bounded by the concurrency, not the backlog)",
        worst / idle_median
    );
}
