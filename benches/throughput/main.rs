//! How many messages per second does a worker move, what do checkpoints
//! cost, how much work does an eviction throw away, and does memory stay
//! flat while a big backlog drains? Each figure is set against a baseline
//! measured in the same run.
//!
//! `cargo bench --bench throughput [-- --messages N --rounds R --backlog M
//! --synthetic-backlog S --evictions E --peer-idle SECS --primes-jobs P
//! --only throughput|requests|redone|memory]`
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
//!    node process the testkit started) and the client's, to say where
//!    the time goes and how close to Azurite's single-threaded limit we are.
//! 2. **Cost of checkpoints**: the same worker with a checkpoint store and a
//!    handler that writes one checkpoint per message, in the same rounds,
//!    and what each extra blob request costs Azurite and the client.
//!    Then **storage requests per job** by kind (receive, delete, update,
//!    blob read, blob write, create; counted by the testkit's doubles around
//!    the queue and the checkpoint store, see `requests.rs`) for every loop
//!    of 1 and 2, for long jobs that outlive their lease several times
//!    (renewals), each against the fewest the protocol allows.
//!    `--only requests` counts the same for **the deployed worker**: P
//!    one-chunk `primes` jobs (default 200) drained by one worker of 2 slots,
//!    the result store counted too (`primes_requests.rs`).
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

mod memory;
mod primes_consumer;
mod primes_requests;
mod redelivery;
mod redone;
mod requests;
mod rounds;
mod rounds_report;
mod setup;
mod worker_mode;

use std::time::Duration;

use anyhow::{Result, ensure};
use spot_worker_testkit::bench::{self, BenchArgs};

use setup::Bench;

/// Messages per receive, and the worker's concurrency.
const BATCH: u8 = 32;
/// Lease of every received message (all loops).
const VISIBILITY: Duration = Duration::from_secs(30);
/// Bound on every wait that is not itself measured (and on measured ones).
const PATIENCE: Duration = Duration::from_secs(600);

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
    /// One-chunk primes jobs of the deployed worker's request count.
    primes_jobs: usize,
    /// Only this part: `throughput`, `requests`, `redone` or `memory`.
    only: Option<String>,
}

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    bench::init_logs();
    let runtime = bench::runtime()?;
    if let Some(child) = args.after(worker_mode::FLAG) {
        return runtime.block_on(worker_mode::serve(child));
    }
    let options = parse_options(&args)?;
    runtime.block_on(run(options))
}

fn parse_options(args: &BenchArgs) -> Result<Options> {
    let mut options = if args.benchmarking() {
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
            primes_jobs: 200,
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
            primes_jobs: 20,
            only: None,
        }
    };
    args.each_flag(|flag, value| {
        match flag {
            "--messages" => options.messages = value.parse()?,
            "--rounds" => options.rounds = value.parse()?,
            "--backlog" => options.backlog = value.parse()?,
            "--synthetic-backlog" => options.synthetic_backlog = value.parse()?,
            "--evictions" => options.evictions = value.parse()?,
            "--peer-idle" => options.peer_idle = value.seconds()?,
            "--primes-jobs" => options.primes_jobs = value.parse()?,
            "--only" => options.only = Some(value.text()?),
            _ => {}
        }
        Ok(())
    })?;
    ensure!(
        options.messages > 0
            && options.rounds > 0
            && options.backlog > 0
            && options.evictions > 0
            && options.primes_jobs > 0,
        "--messages, --rounds, --backlog, --evictions and --primes-jobs must be at least 1"
    );
    Ok(options)
}

/// The table of contents: each part measures, then prints its tables.
async fn run(options: Options) -> Result<()> {
    let bench = Bench::start().await?;
    let azurite_pid = bench.site.azurite.processes().first().map_or(0, |p| p.pid);
    println!(
        "throughput benchmark: {} messages per run, {} interleaved round(s); one Azurite (pid {}) on 127.0.0.1; {}\n",
        options.messages,
        options.rounds,
        azurite_pid,
        bench::machine()
    );

    let wanted = |part: &str| options.only.as_deref().is_none_or(|only| only == part);
    if wanted("throughput") {
        let throughput = bench.throughput(&options).await?;
        rounds_report::print_throughput(&throughput, &options);
        let long = bench.long_jobs(&options).await?;
        requests::print_requests(&throughput, &long, &options);
    }
    if wanted("requests") {
        let primes = bench.primes_requests(&options).await?;
        primes_requests::print_primes_requests(&primes);
    }
    if wanted("redone") {
        let redone = bench.redone_work(&options).await?;
        redone::print_redone(&redone, &options);
        let idle_peers = bench.idle_peer_redelivery(&options).await?;
        redelivery::print_redelivery(&redone, &idle_peers, &options);
    }
    if wanted("memory") {
        let memory = bench.memory(&options).await?;
        memory::print_memory(&memory, &options);
    }
    Ok(())
}
