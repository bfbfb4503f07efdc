//! Part 3, work redone per eviction: a primes job evicted part of the way
//! (gracefully, or with its handler dropped), finished by a peer, and the
//! numbers counted twice, with and without checkpoints; and its table.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rand::Rng as _;
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::faulty::FaultyQueue;
use tokio::time::Instant;

use crate::Options;
use crate::primes_consumer::PrimesConsumer;
use crate::setup::{Bench, all_deleted, median, wait_until};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// A notice: wind down, the handler saves the part it counted.
    Graceful,
    /// No notice: the handler is dropped where it stands (like `SIGKILL`;
    /// the message is released at once here, which does not change the
    /// work redone).
    Hard,
}

#[derive(Clone, Copy)]
pub struct Variant {
    pub checkpoint_every: u64,
    pub eviction: Eviction,
}

/// One eviction and what it cost.
pub struct Redone {
    pub variant: Variant,
    /// Numbers counted twice.
    pub numbers: u64,
    /// Wall time those numbers took (at the job's rate).
    pub time: Duration,
    /// Release answered → peer's handler started.
    pub release_to_redelivery: Duration,
    /// How long the peer had idled on the empty queue before the release.
    pub peer_idle: Duration,
    /// Whether the first delivery's reach was estimated (hard evictions:
    /// the part of a chunk counted when it was dropped is not reported).
    pub estimated: bool,
}

impl Bench {
    pub async fn redone_work(&self, options: &Options) -> Result<Vec<Redone>> {
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
        let queues = self.site.queues("redo").await?;
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(
            self.site
                .storage
                .checkpoint_store(&format!("ckpt-{}", queues.name))?,
        );
        let results: Arc<dyn ResultStore> = Arc::new(
            self.site
                .storage
                .result_store(&format!("res-{}", queues.name))?,
        );
        checkpoints.prepare().await?;
        results.prepare().await?;
        let job = PrimesJob::new("job", 0, span)?;
        queues.queue.send(&job.to_message(), Duration::ZERO).await?;
        let queue = queues.queue;
        let poison: Arc<dyn MessageQueue> = Arc::new(queues.poison);

        // The first worker takes the job; the peer starts polling once it
        // has (and finds the queue empty until the release).
        let first_queue = FaultyQueue::new(queue.clone());
        let first = PrimesConsumer::start(
            Arc::new(first_queue.clone()),
            Arc::clone(&poison),
            Arc::clone(&checkpoints),
            Arc::clone(&results),
            variant.checkpoint_every,
        )?;
        wait_until("the first delivery", || first.first_start().is_some()).await?;
        let first_started = first.first_start().context("started")?;
        let peer_queue = FaultyQueue::new(queue);
        let peer = PrimesConsumer::start(
            Arc::new(peer_queue.clone()),
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
        let released_at = *first_queue
            .faults()
            .released_at()
            .last()
            .context("no release")?;
        // Finished: its message deleted.
        all_deleted(peer_queue.faults(), 1).await?;
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
}

/// Prints the redone-work table and its goal.
pub fn print_redone(redone: &[Redone], options: &Options) {
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
