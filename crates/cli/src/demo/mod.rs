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

mod board;
mod check;
mod command;
mod format;
mod scenario;
mod storage;
mod workers;

use std::fmt;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use spot_worker_imds_emulator::RunningEmulator;
use spot_worker_primes::PrimesJob;
use spot_worker_runtime::RunReport;
use tokio_util::sync::CancellationToken;

use board::Tracker;
use storage::Storage;

const QUEUE: &str = "jobs";
const CHECKPOINTS: &str = "checkpoints";
const RESULTS: &str = "results";
/// Azure's notice before a Spot VM is evicted.
const PREEMPT_NOTICE: Duration = Duration::from_secs(30);
/// How much of the work is done when the eviction comes, in percent.
const EVICT_AT_PERCENT: u64 = 40;
/// IMDS allows 5 requests per second; 4 leave a margin and notice quickly.
const IMDS_POLL: Duration = Duration::from_millis(250);
/// Numbers per job unless `--size` says otherwise: about 3 s of one core in
/// a release build (2,000 chunks of 1.3 to 1.7 ms: docs/benchmarks.md, "The
/// primes job's pace"); a debug build counts about ten times slower.
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

    /// Numbers per job [default: 2_000_000_000 in a release build (about 3 s
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

    /// The job is a Python program (`examples/command/primes.py`) run by
    /// `spot-worker run`'s handler: evicted mid-way, resumed on worker B
    /// from its checkpoint file, its result checked. Needs `python3`. One
    /// job of --size numbers [default: 1_000_000_000].
    #[arg(long, conflicts_with_all = ["jobs", "chunk_size", "concurrency"])]
    command: bool,
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
    let result = if args.command {
        command::run(args.size.map(NonZeroU64::get), args.azurite, interrupted).await
    } else {
        match Demo::set_up(args, interrupted).await {
            Ok(demo) => demo.run(started).await,
            Err(error) => Err(error),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accept_underscores() {
        assert_eq!(parse_count("8_000_000").map(NonZeroU64::get), Ok(8_000_000));
        assert!(parse_count("0").is_err());
        assert!(parse_count("many").is_err());
    }
}
