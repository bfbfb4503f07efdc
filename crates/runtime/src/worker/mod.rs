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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_consumer::{Consumer, ConsumerConfig, ConsumerStats, HandlerError, MessageHandler};
use spot_worker_decisions::cadence::{CadenceView, CheckpointCadence, FLUSH_EVERY};
use spot_worker_imds::{
    ImdsClient, ImdsConfig, NoticePolicy, NoticeSignal, RunningWatcher, Watcher, WatcherConfig,
};
use spot_worker_storage::{CheckpointStore, FleetLedger, MessageQueue, QueueMessage, ResultStore};
use spot_worker_telemetry::{CheckpointEstimates, Metrics, Telemetry, message_span};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::after_drain::{Next, wait_after_drain};
use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::gate::{self, Checks, WarmupFn};
use crate::health::{self, Readiness};
use crate::keeper_retry::KeeperReport;
use crate::metered::{
    MeteredCheckpoints, MeteredHandler, MeteredQueue, deadline_observer, goodput_observer,
    settlement_observer,
};
use crate::rendezvous::Rendezvous;
use crate::scale_in_protection::{Backoff, ProtectionKeeper, ScaleInProtection};
use crate::shutdown::{DrainTrigger, EXIT_GRACE, Triggers, exit_after};

use finish::{Finished, final_step, wrong_vm_name};
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
                if stop
                    .run_until_cancelled(gate_opened.cancelled())
                    .await
                    .is_none()
                {
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

    /// The scale-in protection keeper, running until `stop`, if kept.
    fn keep_scale_in_protection(
        &self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (target, idle_grace) = self.scale_in_protection.clone()?;
        let keeper = ProtectionKeeper::new(
            target,
            idle_grace,
            Backoff::default(),
            tokio::time::Instant::now(),
        )
        .with_report(KeeperReport::new(
            self.metrics.clone(),
            self.readiness.clone(),
        ));
        let (activity, stop) = (self.activity.subscribe(), stop.clone());
        Some(tokio::spawn(async move {
            crate::scale_in_protection::keep(keeper, activity, stop).await;
        }))
    }

    async fn serve_health(
        &self,
        listener: Option<tokio::net::TcpListener>,
        stop: &CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, WorkerError> {
        let addr = self.config.health_addr;
        let listener = match listener {
            Some(listener) => listener,
            None => health::bind(addr)
                .await
                .map_err(|source| WorkerError::HealthServer { addr, source })?,
        };
        let bound = listener.local_addr().unwrap_or(addr);
        tracing::info!(addr = %bound, "health endpoints: /healthz, /readyz");
        let readiness = self.readiness.subscribe();
        let stop = stop.clone();
        Ok(tokio::spawn(async move {
            if let Err(error) = health::serve(listener, readiness, stop).await {
                tracing::error!(%error, "health endpoint failed");
            }
        }))
    }

    fn watch_events(&self) -> Result<(Option<RunningWatcher>, Option<NoticeSignal>), WorkerError> {
        if !self.config.imds.enabled {
            return Ok((None, None));
        }
        let client = ImdsClient::new(self.imds_config()).map_err(WorkerError::Imds)?;
        let mut watcher = Watcher::new(
            client,
            WatcherConfig {
                poll_interval: self.config.imds.poll_interval,
                vm_name: self.config.imds.vm_name.clone(),
                ..WatcherConfig::default()
            },
        );
        let signal = watcher.notice_signal(NoticePolicy::default());
        Ok((Some(watcher.spawn()), Some(signal)))
    }

    /// Joins the other workers on this VM (those watching the same IMDS),
    /// unless Scheduled Events are not watched at all.
    async fn join_peers(&self) -> Rendezvous {
        if !self.config.imds.enabled {
            return Rendezvous::Unavailable("Scheduled Events are not watched".into());
        }
        let about = format!("pid {}, queue {}", std::process::id(), self.queue.name());
        Rendezvous::join(
            self.config.drain.runtime_dir.as_deref(),
            &self.config.imds.endpoint,
            &about,
            self.config.drain.approve_events,
        )
        .await
    }

    fn imds_config(&self) -> ImdsConfig {
        ImdsConfig::default().with_endpoint(self.config.imds.endpoint.clone())
    }

    async fn gate_then_serve<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
        watcher: Option<&RunningWatcher>,
        rendezvous: &Rendezvous,
    ) -> Result<Finished, WorkerError> {
        let checks = Checks {
            imds: watcher.map(RunningWatcher::health),
            queue: Arc::clone(&self.queue),
            poison: Arc::clone(&self.poison),
            checkpoints: self.checkpoints.clone(),
            poison_bodies: self.poison_bodies.clone(),
            other_lane: self.other_lane_queue(),
            warmup: self.warmup.clone(),
        };
        let gate = gate::open(checks, &self.readiness);
        let gate_timeout = async {
            match self.config.gate_timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let wrong_name = async {
            match watcher {
                Some(watcher) => wrong_vm_name(watcher.health()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(gate, gate_timeout, wrong_name);
        loop {
            tokio::select! {
                () = &mut gate => break,
                trigger = triggers.first() => {
                    // Nothing was taken yet: there is nothing to drain. An
                    // event is still approved or waited for as after a
                    // drain: exiting would only restart into it.
                    tracing::info!(%trigger, "stopping before the warmup gate opened");
                    let report = self.stopped_before_start(trigger);
                    let next = wait_after_drain(
                        &report.drain.trigger,
                        triggers,
                        watcher,
                        &mut None,
                        &self.readiness,
                        rendezvous,
                        &self.config.drain,
                    )
                    .await;
                    match next {
                        Next::Resume => {
                            tracing::warn!("the notice was withdrawn; waiting for the gate again");
                            self.readiness.send_modify(|r| r.shutting_down = None);
                        }
                        Next::Exit { approve, parked } => {
                            let mut finished = Finished::at_once(report);
                            finished.approve = approve;
                            if parked {
                                finished.rearm(self.config.drain.watchdog);
                            }
                            return Ok(finished);
                        }
                    }
                }
                error = &mut wrong_name => return Err(error.into()),
                () = &mut gate_timeout => {
                    let waiting_for = self.readiness.borrow().waiting_for().join(", ");
                    return Err(WorkerError::GateTimeout {
                        waited: self.config.gate_timeout.unwrap_or_default(),
                        waiting_for,
                    });
                }
            }
        }
        tracing::info!(queue = self.queue.name(), "warmup gate open; taking work");
        // The gate does not wait for instance metadata when the name is
        // configured; if it answers later and contradicts the name, events
        // are being matched against the wrong VM: drain as on a request
        // (nothing in flight is lost), then refuse as before the gate.
        let serving = self.serve(handler, triggers, watcher, rendezvous);
        tokio::pin!(serving);
        tokio::select! {
            finished = &mut serving => finished,
            error = &mut wrong_name => {
                tracing::error!(%error, "draining: the configured VM name is wrong");
                self.requested.cancel();
                let _ = serving.await;
                Err(error.into())
            }
        }
    }

    fn stopped_before_start(&self, trigger: DrainTrigger) -> RunReport {
        self.lifetime.draining();
        self.readiness
            .send_modify(|r| r.shutting_down = Some(trigger.to_string()));
        RunReport {
            stats: ConsumerStats::default(),
            drain: DrainReport {
                trigger,
                notice_to_drained: Duration::ZERO,
                released_running_handlers: false,
                met_deadline: true,
                approved_event: false,
                resumed: 0,
            },
        }
    }

    /// Consumes and drains, again after every withdrawn notice, until the
    /// worker is to exit.
    async fn serve<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
        watcher: Option<&RunningWatcher>,
        rendezvous: &Rendezvous,
    ) -> Result<Finished, WorkerError> {
        let consumer = self.consumer()?;
        self.gate_opened.cancel();
        // Ends by itself with the consumer (its health sender is dropped).
        tokio::spawn(crate::store_health::reflect(
            consumer.store_health(),
            self.readiness.clone(),
            self.metrics.clone(),
        ));
        let handler = Arc::new(MeteredHandler {
            inner: lifetime::Busy {
                inner: self.pod_cost.wrap_handler(handler),
                lifetime: Arc::clone(&self.lifetime),
            },
            metrics: self.metrics.clone(),
            queue: self.queue.name().to_owned(),
            activity: self.activity.clone(),
        });
        let keeper = self.lane_keeper(&handler);
        let mut resumed = 0;
        loop {
            self.lifetime.ready();
            self.readiness.send_modify(|r| r.shutting_down = None);
            // Not while the checkpoint store refuses (see `store_health`).
            self.metrics.set_ready(self.readiness.borrow().is_ready());
            let mut drained = self
                .consume(&consumer, Arc::clone(&handler), triggers, keeper.as_ref())
                .await;
            drained.report.drain.resumed = resumed;
            let next = wait_after_drain(
                &drained.report.drain.trigger,
                triggers,
                watcher,
                &mut drained.watchdog,
                &self.readiness,
                rendezvous,
                &self.config.drain,
            )
            .await;
            match next {
                Next::Resume => {
                    resumed += 1;
                    tracing::warn!(
                        resumed,
                        "the notice was withdrawn before the event started; taking work again"
                    );
                }
                Next::Exit { approve, parked } => {
                    let mut finished = Finished {
                        report: drained.report,
                        watchdog: drained.watchdog,
                        exit_by: drained.exit_by,
                        approve,
                    };
                    if parked {
                        // The drain's deadline is long past: give the last
                        // steps their own.
                        finished.rearm(self.config.drain.watchdog);
                    }
                    return Ok(finished);
                }
            }
        }
    }

    fn consumer(&self) -> Result<Consumer, WorkerError> {
        let config = ConsumerConfig {
            max_in_flight: self.config.concurrency,
            batch_size: u8::try_from(self.config.concurrency.min(32)).unwrap_or(32),
            visibility_timeout: self.config.visibility_timeout,
            max_failures: self.config.max_failures,
            max_deliveries: self.config.max_deliveries,
            idle_backoff_max: self.config.idle_poll_max,
            refusal_grace: self.config.storage_refusal_grace,
            encoding: self.config.encoding,
            ..ConsumerConfig::default()
        };
        let metrics = &self.metrics;
        let queue = MeteredQueue::work(Arc::clone(&self.queue), metrics.clone());
        let mut consumer = Consumer::new(Arc::new(queue), Arc::clone(&self.poison), config)
            .map_err(WorkerError::Storage)?
            // One span per delivery, with the messaging conventions' fields.
            .with_message_span(Arc::new(|queue: &str, message: &QueueMessage| {
                message_span(queue, message.id.as_str(), message.dequeue_count)
            }))
            .with_settlement_observer(settlement_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_goodput_observer(goodput_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_deadline_observer(deadline_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_cadence(Arc::clone(&self.cadence));
        if let Some(lanes) = self.consumer_lanes() {
            consumer = consumer.with_lanes(lanes);
        }
        if let Some(store) = &self.poison_bodies {
            consumer = consumer.with_poison_bodies(Arc::clone(store));
        }
        Ok(match &self.checkpoints {
            Some(store) => consumer.with_checkpoints(Arc::new(MeteredCheckpoints {
                inner: self.pod_cost.wrap_checkpoints(Arc::clone(store)),
                metrics: metrics.clone(),
            })),
            None => consumer,
        })
    }
}
