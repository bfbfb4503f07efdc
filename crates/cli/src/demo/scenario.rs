//! The scenario: set up, worker A, the eviction, worker B.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec};
use spot_worker_primes::{PrimesConfig, PrimesJob, Progress};
use spot_worker_runtime::{
    DrainSettings, DrainTrigger, ImdsSettings, RunReport, Worker, WorkerConfig, WorkerError,
};
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use super::board::Tracker;
use super::format::{describe, grouped, millis, percent};
use super::storage::Storage;
use super::workers::{Reporting, RunningWorker, announce_ready, forward_cancel};
use super::{
    DEFAULT_CHUNKS_PER_JOB, DEFAULT_SIZE, Demo, DemoArgs, EVICT_AT_PERCENT, Eviction, IMDS_POLL,
    PREEMPT_NOTICE, QUEUE, Who,
};

impl Demo {
    /// Starts the emulator and the storage, and enqueues the jobs.
    pub(super) async fn set_up(args: DemoArgs, interrupted: CancellationToken) -> Result<Demo> {
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
    pub(super) async fn run(self, started: Instant) -> Result<()> {
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
    pub(super) async fn start_worker(&self, who: Who) -> Result<RunningWorker> {
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
            drain: DrainSettings {
                watchdog: false,
                handle_signals: false,
                ..defaults.drain
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
            // The demo shows every checkpoint.
            checkpoint_every: Some(Duration::ZERO),
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
    pub(super) async fn evict(&self, mut a: RunningWorker) -> Result<Eviction> {
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
        let DrainTrigger::Event(notice) = &report.drain.trigger else {
            return Err(self.stopped_early(Who::A, Ok(Ok(report))));
        };
        let seen_after = notice.first_seen.duration_since(posted).unwrap_or_default();
        let drain = &report.drain;
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
    pub(super) async fn finish(&self, mut b: RunningWorker) -> Result<()> {
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
            report.drain.trigger,
            millis(report.drain.notice_to_drained)
        ));
        Ok(())
    }

    /// The worker's report, or why there is none.
    pub(super) fn joined(
        &self,
        who: Who,
        ended: Result<Result<RunReport, WorkerError>, JoinError>,
    ) -> Result<RunReport> {
        ended
            .with_context(|| format!("worker {who} crashed"))?
            .with_context(|| format!("worker {who}"))
    }

    /// Why a worker returned before the demo asked it to.
    pub(super) fn stopped_early(
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
                report.drain.trigger
            ),
            Err(error) => error,
        }
    }

    /// Numbers in all the jobs' ranges together.
    pub(super) fn total_numbers(&self) -> u64 {
        self.jobs.iter().map(|j| j.end - j.start).sum()
    }
}
