//! [`Worker`]: wires the Scheduled Events watcher, the warmup gate, the
//! queue consumer and the health endpoint into one lifecycle:
//!
//! 1. serve `/healthz` and `/readyz`; start watching Scheduled Events;
//! 2. open the warmup gate (IMDS, storage, the application's warmup);
//! 3. consume until the first trigger (eviction notice, SIGTERM, request);
//! 4. drain: stop receiving, wind handlers down so they checkpoint, release
//!    what is left before the deadline;
//! 5. after a drain for an event: approve it if it concerns this VM alone
//!    (once every other worker on the VM has drained) and exit, or park (not ready, taking nothing) until it starts (exit) or is
//!    cancelled (take work again, from step 3);
//! 6. stop the watcher, flush telemetry, close the health server: all under
//!    the watchdog, which stays armed until `run` returns;
//! 7. for a worker that owns its process ([`Worker::owning_the_process`]):
//!    end the process if it has not exited [`EXIT_GRACE`] after `run`
//!    returned (a handler's blocking code keeping the runtime up).

mod drain;
mod finish;
mod lanes;
mod lifetime;
mod pod_cost;
mod process;
mod report;
mod serve;
mod services;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_consumer::{HandlerError, MessageHandler};
use spot_worker_decisions::cadence::{CadenceView, CheckpointCadence, FLUSH_EVERY};
use spot_worker_storage::{CheckpointStore, FleetLedger, MessageQueue, ResultStore};
use spot_worker_telemetry::{CheckpointEstimates, Metrics, Telemetry};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::gate::WarmupFn;
use crate::health::{self, Readiness};
use crate::scale_in_protection::ScaleInProtection;
use crate::shutdown::{EXIT_GRACE, Triggers, exit_after};

use finish::{Finished, final_step};
use lanes::LaneQueues;
pub use report::{DrainReport, RunReport};
use spot_worker_lanes::{SpotCapacity, SwitchCost};

/// The longest the last addition to the fleet's interruption counts may
/// take as the worker stops: it runs beside the approval and the telemetry
/// flush, within the exit's bounds.
const LEDGER_LAST_ADD: Duration = Duration::from_secs(1);

/// The checkpoint interval's estimates as the metrics report them.
fn checkpoint_estimates(view: &CadenceView) -> CheckpointEstimates {
    let estimates = view.estimates;
    CheckpointEstimates {
        interval_seconds: view.interval.as_secs_f64(),
        save_cost_seconds: view.cost.estimate().map(|cost| cost.as_secs_f64()),
        evictions_per_hour: estimates.evictions_per_hour,
        late_per_hour: estimates.evictions_per_hour * estimates.late_share,
        unsaved_per_hour: estimates.evictions_per_hour * estimates.unsaved_share,
        no_outcome_per_hour: estimates.no_outcome_per_hour,
        losing_per_hour: estimates.losing_per_hour(),
    }
}

/// A queue worker for a Spot VM, built in a few lines and run once.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use spot_worker_runtime::{HandlerError, Job, Worker, WorkerConfig, handler_fn};
/// use spot_worker_storage::{InMemoryQueue, MessageQueue};
///
/// let queue = InMemoryQueue::new("jobs");
/// queue.send("hello", Duration::ZERO).await.unwrap();
///
/// let mut config = WorkerConfig::default();
/// config.imds.enabled = false; // not on an Azure VM
/// config.health_addr = "127.0.0.1:0".parse().unwrap();
/// config.drain.handle_signals = false;
/// config.drain.watchdog = false;
///
/// let worker = Worker::new(config, Arc::new(queue.clone()), Arc::new(InMemoryQueue::new("jobs-poison")));
/// let stop = worker.shutdown_token();
/// let report = worker
///     .run(handler_fn(move |job: Job| {
///         let stop = stop.clone();
///         async move {
///             println!("got {}", job.text()?);
///             stop.cancel(); // one message is enough here
///             Ok::<(), HandlerError>(())
///         }
///     }))
///     .await
///     .unwrap();
/// assert_eq!(report.stats.succeeded, 1);
/// assert!(queue.is_empty());
/// # });
/// ```
pub struct Worker {
    config: WorkerConfig,
    queue: Arc<dyn MessageQueue>,
    poison: Arc<dyn MessageQueue>,
    checkpoints: Option<Arc<dyn CheckpointStore>>,
    poison_bodies: Option<Arc<dyn ResultStore>>,
    warmup: Option<WarmupFn>,
    telemetry: Option<Telemetry>,
    metrics: Metrics,
    requested: CancellationToken,
    readiness: watch::Sender<Readiness>,
    health_listener: Option<tokio::net::TcpListener>,
    owns_process: bool,
    /// The checkpoint interval every delivery follows, kept in step with
    /// the fleet's interruption counts while the worker serves.
    cadence: Arc<CheckpointCadence>,
    /// Cancelled when the warmup gate opens: the store is ready then.
    gate_opened: CancellationToken,
    /// The two lanes, for a worker that serves one of them.
    lanes: Option<LaneQueues>,
    /// d, the switch cost the lane rule uses, kept in step with the
    /// fleet's measurements.
    switch_cost: Arc<SwitchCost>,
    /// Whether the fleet's Spot capacity is there, made with the
    /// checkpoint store on first use.
    spot_capacity: std::sync::OnceLock<Arc<SpotCapacity>>,
    /// The note of this Spot worker's eviction in the fleet's sightings,
    /// running in the background; waited for (within a bound) at exit, so
    /// that an idle worker's quick drain does not cut it short.
    eviction_note: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// How many messages the handler holds, for whoever follows busy and
    /// idle periods.
    activity: crate::activity::WorkerActivity,
    /// This VM's protection from scale-in and the idle grace, if kept.
    scale_in_protection: Option<(Arc<dyn ScaleInProtection>, Duration)>,
    /// This worker's part of the fleet's bill, from its construction
    /// (`worker/lifetime.rs`).
    lifetime: Arc<lifetime::Lifetime>,
    /// This pod's deletion cost, kept in step with its work (`pod_cost`).
    pod_cost: pod_cost::PodCost,
}

impl Worker {
    /// A worker for `queue`, moving messages it gives up on to `poison`.
    pub fn new(
        config: WorkerConfig,
        queue: Arc<dyn MessageQueue>,
        poison: Arc<dyn MessageQueue>,
    ) -> Self {
        let cadence = Arc::new(CheckpointCadence::new(config.interval_source()));
        let switch_cost = lanes::seeded_switch_cost(config.lanes.switch_cost);
        let lifetime = lifetime::Lifetime::start_now(
            config.consumed_queue(),
            config.lanes.lane,
            config.imds.vm_name.as_deref(),
            config.imds.enabled,
        );
        Worker {
            config,
            queue,
            poison,
            checkpoints: None,
            poison_bodies: None,
            warmup: None,
            telemetry: None,
            metrics: Metrics::noop(),
            requested: CancellationToken::new(),
            readiness: watch::channel(Readiness::default()).0,
            health_listener: None,
            owns_process: false,
            cadence,
            gate_opened: CancellationToken::new(),
            lanes: None,
            switch_cost,
            spot_capacity: std::sync::OnceLock::new(),
            eviction_note: std::sync::Mutex::default(),
            activity: crate::activity::WorkerActivity::default(),
            scale_in_protection: None,
            lifetime,
            pod_cost: pod_cost::PodCost::default(),
        }
    }

    /// The checkpoint interval this worker's deliveries follow, and what it
    /// rests on ([`CheckpointCadence::view`]).
    pub fn cadence(&self) -> &Arc<CheckpointCadence> {
        &self.cadence
    }

    /// How many messages the handler holds (0: idle), as it changes: the
    /// one signal of busy and idle periods ([`crate::activity`]).
    pub fn activity(&self) -> watch::Receiver<usize> {
        self.activity.subscribe()
    }

    /// Keeps this VM protected from scale-in while it holds work and until
    /// it has been idle for `idle_grace`, through `target` (on a scale set:
    /// `spot_worker_azure::ArmScaleInProtection`); released as the worker
    /// exits ([`crate::scale_in_protection::keep`]).
    pub fn with_scale_in_protection(
        mut self,
        target: Arc<dyn ScaleInProtection>,
        idle_grace: Duration,
    ) -> Self {
        self.scale_in_protection = Some((target, idle_grace));
        self
    }

    /// Serves the health endpoints on `listener` instead of binding
    /// `health_addr` (for callers that must know the port before running).
    pub fn with_health_listener(mut self, listener: tokio::net::TcpListener) -> Self {
        self.health_listener = Some(listener);
        self
    }

    /// Gives handlers checkpoints (`Job::checkpoint`) kept in `store`,
    /// which also keeps the attempt records that decide poisoning.
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    /// Where poisoned originals too big for their poison record are kept
    /// (a claim check; usually the blob container `poison`). Without it
    /// such a message stays in the queue rather than lose its body.
    pub fn with_poison_bodies(mut self, store: Arc<dyn ResultStore>) -> Self {
        self.poison_bodies = Some(store);
        self
    }

    /// The application's warmup, run (and retried while it fails) before
    /// anything is taken from the queue.
    pub fn with_warmup<F, Fut>(mut self, warmup: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.warmup = Some(Arc::new(move || Box::pin(warmup())));
        self
    }

    /// Records metrics through `telemetry`, and flushes and shuts it down
    /// (within 2 s) before returning.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.metrics = telemetry.metrics();
        self.telemetry = Some(telemetry);
        self
    }

    /// Cancel it to drain and stop, as a signal would.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.requested.clone()
    }

    /// The readiness `/readyz` reports, to watch in-process.
    pub fn readiness(&self) -> watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    /// Runs the whole lifecycle and returns after a graceful drain; the
    /// caller should then exit (with [`RunReport::exit_code`]), and a worker
    /// [owning its process](Self::owning_the_process) makes sure it does.
    /// Errors only when the worker cannot start (bad configuration, busy
    /// health port, a `vm_name` instance metadata contradicts) or the gate
    /// timed out; storage and IMDS failures while running are retried, not
    /// returned.
    pub async fn run<H: MessageHandler>(self, handler: H) -> Result<RunReport, WorkerError> {
        let exit_guard = self.owns_process && self.config.drain.watchdog;
        let (result, _drain_watchdog) = match self.run_lifecycle(handler).await {
            Ok(finished) => (Ok(finished.report), finished.watchdog),
            Err(error) => (Err(error), None),
        };
        if exit_guard {
            exit_after(EXIT_GRACE, process::exit_code(&result));
        }
        // The drain's watchdog (`_drain_watchdog`) is disarmed only now, as
        // `run` returns, after the exit guard took over.
        result
    }

    /// Everything `run` does until the process is to exit.
    async fn run_lifecycle<H: MessageHandler>(
        mut self,
        handler: H,
    ) -> Result<Finished, WorkerError> {
        self.config.validate()?;
        let stop_health = CancellationToken::new();
        let listener = self.health_listener.take();
        let health_task = self.serve_health(listener, &stop_health).await?;
        self.metrics.set_ready(false);

        let (watcher, event_signal) = self.watch_events()?;
        let triggers = Triggers::new(event_signal, self.requested.clone());
        if self.config.drain.handle_signals {
            triggers.listen_for_signals();
        }
        // Left (the file removed) when `run` returns; a crash leaves it
        // unlocked, which the other workers treat the same.
        let rendezvous = self.join_peers().await;

        let cadence = Arc::clone(&self.cadence);
        self.metrics
            .observe_checkpoint_estimates(move || checkpoint_estimates(&cadence.view()));
        // The fleet's interruption counts, kept in step while the worker
        // runs; added to once more as it stops (docs/checkpoint-interval.md).
        let stop_ledger = CancellationToken::new();
        let ledger_task = self.checkpoints.as_ref().map(|store| {
            let ledger = FleetLedger::for_queue(Arc::clone(store), &self.config.queue);
            let (cadence, stop) = (Arc::clone(&self.cadence), stop_ledger.clone());
            let gate_opened = self.gate_opened.clone();
            tokio::spawn(async move {
                // Not before the gate has made the store ready; a worker
                // that stops before has run nothing to count.
                if !gate_opened_before(&gate_opened, &stop).await {
                    return;
                }
                ledger
                    .keep(cadence, FLUSH_EVERY, stop, LEDGER_LAST_ADD)
                    .await;
            })
        });
        let switch_cost_task = self.keep_switch_cost(stop_ledger.clone());
        let pod_cost_task = self.keep_pod_deletion_cost(stop_ledger.clone())?;
        let stop_protection = CancellationToken::new();
        let protection_task = self.keep_scale_in_protection(&stop_protection);
        let lifetime_task = self.keep_lifetime(&stop_ledger);
        let mut result = self
            .gate_then_serve(handler, &triggers, watcher.as_ref(), &rendezvous)
            .await;
        self.lifetime.exited();
        // Its last addition runs beside the approval and the telemetry flush.
        stop_ledger.cancel();
        // Nothing is held any more: the VM may be scaled in.
        stop_protection.cancel();
        // Stop polling before approving: IMDS allows 5 requests a second,
        // and the approval must not queue behind (or be throttled by) polls.
        if let Some(watcher) = watcher {
            watcher.stop().await;
        }
        let exit_by = result.as_ref().ok().and_then(|f| f.exit_by);
        if let Ok(finished) = &mut result
            && let Some(chosen) = finished.approve.take()
        {
            finished.report.drain.approved_event = self
                .approve(&chosen.event, &chosen.scope, final_step(exit_by, 2))
                .await;
        }
        self.metrics.set_ready(false);
        // Shut the exporters down within a bound: merely dropping them would
        // make the SDK block on a final export for as long as it likes.
        if let Some(telemetry) = self.telemetry.take()
            && let Err(error) = telemetry.shutdown(final_step(exit_by, 2)).await
        {
            tracing::warn!(%error, "flushing telemetry failed");
        }
        if let Some(task) = protection_task {
            // Started above, beside the approval and the flush; bounded by
            // its own timeout (`LAST_RELEASE_WITHIN`) and half the time
            // left before the hard deadline: an ARM call takes seconds.
            let _ = tokio::time::timeout(final_step(exit_by, 10), task).await;
        }
        for task in [ledger_task, switch_cost_task, lifetime_task, pod_cost_task]
            .into_iter()
            .flatten()
        {
            // Bounded by its own timeout (`LEDGER_LAST_ADD`) and the exit's.
            let _ = tokio::time::timeout(final_step(exit_by, 2), task).await;
        }
        if let Some(note) = self.take_eviction_note() {
            // Bounded by its own timeout (`EVICTION_NOTE_WITHIN`) and the
            // exit's: half the time left before the hard deadline.
            let _ = tokio::time::timeout(final_step(exit_by, 10), note).await;
        }
        health::stop(health_task, &stop_health).await;
        result
    }
}

/// True once the gate has opened (`gate_opened` cancelled: the stores are
/// ready), false if `stop` comes first: each keeper waits for this before
/// its first call, and a worker that stops before has nothing to keep.
async fn gate_opened_before(gate_opened: &CancellationToken, stop: &CancellationToken) -> bool {
    stop.run_until_cancelled(gate_opened.cancelled())
        .await
        .is_some()
}
