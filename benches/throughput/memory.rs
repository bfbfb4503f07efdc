//! Part 4, memory: the RSS of a worker process idle on an empty queue, and
//! sampled while it drains a backlog from Azurite and a far larger
//! synthetic one; and its table.

use std::time::Duration;

use anyhow::Result;
use spot_worker_testkit::procfs::{self, Process};
use tokio::time::Instant;

use crate::Options;
use crate::setup::{Bench, FILL_CONCURRENCY, bounded, median};
use crate::worker_mode::WorkerProcess;

/// What part 4 measured.
pub struct Memory {
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
    pub async fn memory(&self, options: &Options) -> Result<Memory> {
        eprintln!("memory: idle worker");
        let idle_queue = self.site.queues("idle").await?;
        let worker = WorkerProcess::spawn(self, &idle_queue.name, None).await?;
        let mut idle_kib = Vec::new();
        let until = Instant::now() + options.idle_window;
        while Instant::now() < until {
            idle_kib.push(procfs::rss_kib(Process::Id(worker.pid))?);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        worker.stop().await?;

        eprintln!("memory: filling {} messages", options.backlog);
        let filling = Instant::now();
        let queues = self.site.filled("backlog", options.backlog).await?;
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
        let synthetic_queue = self.site.queues("synthetic").await?;
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
            samples.push((
                started.elapsed(),
                procfs::rss_kib(Process::Id(worker.pid))?,
                remaining,
            ));
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
        samples.push((
            started.elapsed(),
            procfs::rss_kib(Process::Id(worker.pid))?,
            0,
        ));
    }
    Ok(Drain {
        backlog,
        samples,
        time,
    })
}

/// Prints the memory table and its goal.
pub fn print_memory(memory: &Memory, options: &Options) {
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
