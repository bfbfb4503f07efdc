//! Release-to-redelivery: from a drained worker's release to a peer's
//! handler starting, for peers that have idled on an empty queue for a long
//! time (the redone-work runs give it for fresh peers), and its table.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rand::Rng as _;
use spot_worker::runtime::WorkerConfig;
use spot_worker::storage::{
    Consumer, ConsumerConfig, DrainSignals, HandlerError, Job, MessageQueue, handler_fn,
};
use spot_worker_testkit::faulty::FaultyQueue;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::redone::Redone;
use crate::setup::{Bench, Queues, bounded, lock, median, set, wait_until};
use crate::{Options, PATIENCE, VISIBILITY};

impl Bench {
    /// Release-to-redelivery for peers that have been polling an empty queue
    /// for `peer_idle`, as in a fleet where every message is leased: each of
    /// `idle_peers` pairs (own queue) holds a message until a release at a
    /// random moment of `release_window` after the idle time.
    pub async fn idle_peer_redelivery(&self, options: &Options) -> Result<Vec<Duration>> {
        let mut pairs = JoinSet::new();
        for _ in 0..options.idle_peers {
            let queues = self.site.queues("idle").await?;
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
pub fn one_at_a_time() -> ConsumerConfig {
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
    let queue = FaultyQueue::new(queues.queue);
    let poison: Arc<dyn MessageQueue> = Arc::new(queues.poison);
    let holder = Consumer::new(Arc::new(queue.clone()), Arc::clone(&poison), config.clone())?;
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
    let peer = Consumer::new(Arc::new(queue.clone()), poison, config)?;
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
    let released_at = *queue.faults().released_at().last().context("no release")?;
    wait_until("the idle peer taking the message", || {
        lock(&started).is_some()
    })
    .await?;
    peer_signals.release();
    tokio::time::timeout(PATIENCE, peering).await??;
    let started = lock(&started).context("started")?;
    Ok(started.saturating_duration_since(released_at))
}

/// Prints the release-to-redelivery table and its goal.
pub fn print_redelivery(redone: &[Redone], idle_peers: &[Duration], options: &Options) {
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
