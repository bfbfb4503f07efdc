//! A consumer running the primes job one message at a time, noting its
//! progress reports and when each delivery started: what the redone-work
//! measurement reads its figures from.

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use spot_worker::storage::{
    CheckpointStore, Consumer, ConsumerStats, DrainSignals, HandlerError, Job, MessageHandler,
    MessageQueue, ResultStore,
};
use spot_worker_primes::{PrimesConfig, Progress};
use tokio::time::Instant;

use crate::PATIENCE;
use crate::redelivery::one_at_a_time;

/// Progress reports with their times.
pub type Reports = Arc<Mutex<Vec<(Instant, Progress)>>>;

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
pub struct PrimesConsumer {
    pub signals: DrainSignals,
    running: tokio::task::JoinHandle<ConsumerStats>,
    pub reports: Reports,
    started: Arc<Mutex<Vec<Instant>>>,
}

impl PrimesConsumer {
    pub fn start(
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
                checkpoint_every: Some(Duration::ZERO),
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

    pub fn reports(&self) -> Vec<(Instant, Progress)> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn first_start(&self) -> Option<Instant> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .copied()
    }

    pub async fn stopped(self) -> Result<ConsumerStats> {
        tokio::time::timeout(PATIENCE, self.running)
            .await
            .context("the consumer did not stop")?
            .context("the consumer panicked")
    }
}
