//! What starting a program through `spot-worker run`'s handler costs over
//! starting it bare: the delivery directory, the environment, the start
//! on the long-lived spawning thread (only stdin, stdout and stderr kept,
//! every signal at its default, the parent-death signal, marked for the
//! orphan sweep), the reaping of its group, and the settlement.
//!
//! `cargo bench --bench program_start [-- --jobs N --rounds N]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a smoke
//! version. No storage service: the queues and stores are the in-memory
//! ones, so the figures are the runner's and the kernel's alone.
//!
//! 1. **Bare**: `/bin/true` started and waited for with Tokio, one after
//!    another: the baseline, measured in the same run.
//! 2. **Through the handler**: `N` messages, each run by `/bin/true`
//!    through `CommandHandler` in a `Consumer` (one at a time); the time
//!    per job is the interval between two handler returns.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use spot_worker::storage::{
    Consumer, ConsumerConfig, DrainSignals, HandlerError, InMemoryCheckpointStore, InMemoryQueue,
    InMemoryResultStore, Job, MessageHandler, MessageQueue as _,
};
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_testkit::bench::{self, BenchArgs, median, percentile};

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let (mut jobs, mut rounds) = if args.benchmarking() {
        (300, 5)
    } else {
        (10, 1)
    };
    args.each_flag(|flag, value| {
        match flag {
            "--jobs" => jobs = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            _ => {}
        }
        Ok(())
    })?;
    ensure!(jobs >= 3 && rounds >= 1);
    println!("program start benchmark on {}", bench::machine());
    bench::runtime()?.block_on(async {
        let (mut bare, mut handled) = (Vec::new(), Vec::new());
        // Interleaved, so that a change in the machine's load weighs on both.
        for _ in 0..rounds {
            bare.extend(bare_starts(jobs).await?);
            handled.extend(through_the_handler(jobs).await?);
        }
        println!("\n/bin/true, {jobs} jobs × {rounds} rounds, one at a time");
        row("bare (Tokio spawn and wait)", &bare);
        row("through the handler", &handled);
        println!(
            "   the handler's cost per job (median − median): {:.3} ms",
            (median(&handled).as_secs_f64() - median(&bare).as_secs_f64()) * 1e3
        );
        Ok(())
    })
}

async fn bare_starts(jobs: usize) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let started = Instant::now();
        let status = tokio::process::Command::new("/bin/true").status().await?;
        times.push(started.elapsed());
        ensure!(status.success());
    }
    Ok(times)
}

async fn through_the_handler(jobs: usize) -> Result<Vec<Duration>> {
    let (queue, poison) = (
        InMemoryQueue::new("jobs"),
        InMemoryQueue::new("jobs-poison"),
    );
    for job in 0..jobs {
        queue.send(&format!("job {job}"), Duration::ZERO).await?;
    }
    let config = ConsumerConfig {
        batch_size: 1,
        max_in_flight: 1,
        idle_backoff_floor: Duration::from_millis(1),
        idle_backoff_max: Duration::from_millis(5),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config)?
        .with_checkpoints(Arc::new(InMemoryCheckpointStore::new()));
    let handler = Timed {
        inner: CommandHandler::new(
            CommandConfig::new("/bin/true", Vec::<String>::new()),
            Arc::new(InMemoryResultStore::new("results")),
        ),
        returns: Arc::default(),
    };
    let returns = Arc::clone(&handler.returns);
    let signals = DrainSignals::new();
    let running = tokio::spawn({
        let (consumer, signals) = (consumer.clone(), signals.clone());
        async move { consumer.run_until(handler, signals).await }
    });
    let since = Instant::now();
    while returns.lock().map(|r| r.len()).unwrap_or(0) < jobs {
        ensure!(
            since.elapsed() < Duration::from_secs(300),
            "the jobs did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signals.stop_receiving();
    signals.release();
    let stats = running.await?;
    ensure!(stats.succeeded == jobs as u64, "{stats:?}");
    let returns = returns.lock().map(|r| r.clone()).unwrap_or_default();
    Ok(returns.windows(2).map(|w| w[1] - w[0]).collect())
}

/// A handler that notes when each job returns.
struct Timed<H> {
    inner: H,
    returns: Arc<Mutex<Vec<Instant>>>,
}

impl<H: MessageHandler> MessageHandler for Timed<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let result = self.inner.handle(job).await;
        if let Ok(mut returns) = self.returns.lock() {
            returns.push(Instant::now());
        }
        result
    }
}

fn row(label: &str, times: &[Duration]) {
    println!(
        "   {label:<32} median {:>7.3} ms   p99 {:>7.3} ms   n = {}",
        median(times).as_secs_f64() * 1e3,
        percentile(times, 99.0).as_secs_f64() * 1e3,
        times.len()
    );
}
