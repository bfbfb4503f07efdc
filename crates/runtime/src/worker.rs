//! [`Worker`]: wires the Scheduled Events watcher, the warmup gate, the
//! queue consumer and the health endpoint into one lifecycle:
//!
//! 1. serve `/healthz` and `/readyz`; start watching Scheduled Events;
//! 2. open the warmup gate (IMDS, storage, the application's warmup);
//! 3. consume until the first trigger (eviction notice, SIGTERM, request);
//! 4. drain: stop receiving, wind handlers down so they checkpoint, release
//!    what is left before the deadline, approve the event, flush telemetry.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_imds::{
    ApprovalScope, ImdsClient, ImdsConfig, RunningWatcher, ScheduledEvents, ShutdownPolicy,
    ShutdownSignal, Watcher, WatcherConfig,
};
use spot_worker_storage::{
    CheckpointStore, Consumer, ConsumerConfig, ConsumerStats, MessageHandler, MessageQueue,
    ShutdownSignals,
};
use spot_worker_telemetry::{Metrics, Telemetry};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::gate::{self, Checks, WarmupError, WarmupFn};
use crate::health::{self, Readiness};
use crate::metered::{MeteredCheckpoints, MeteredHandler, MeteredQueue};
use crate::shutdown::{Plan, Trigger, Triggers, Watchdog};

/// A queue worker for a Spot VM, built in a few lines and run once.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use spot_worker_runtime::{Worker, WorkerConfig};
/// use spot_worker_storage::{handler_fn, HandlerError, InMemoryQueue, Job, MessageQueue};
///
/// let queue = InMemoryQueue::new("jobs");
/// queue.send("hello", Duration::ZERO).await.unwrap();
///
/// let mut config = WorkerConfig::default();
/// config.imds.enabled = false; // not on an Azure VM
/// config.health_addr = "127.0.0.1:0".parse().unwrap();
/// config.shutdown.handle_signals = false;
/// config.shutdown.watchdog = false;
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
    warmup: Option<WarmupFn>,
    telemetry: Option<Telemetry>,
    metrics: Metrics,
    requested: CancellationToken,
    readiness: watch::Sender<Readiness>,
    health_listener: Option<tokio::net::TcpListener>,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// What the consumer did.
    pub stats: ConsumerStats,
    /// How the worker stopped.
    pub shutdown: ShutdownReport,
}

/// How the worker stopped.
#[derive(Debug, Clone)]
pub struct ShutdownReport {
    /// What started it.
    pub trigger: Trigger,
    /// From the notice to every message settled or released.
    pub notice_to_drained: Duration,
    /// Whether handlers were still running at the release instant and had
    /// to be dropped.
    pub released_running_handlers: bool,
    /// Whether the drain finished before the hard deadline.
    pub met_deadline: bool,
    /// Whether the triggering event was approved afterwards.
    pub approved_event: bool,
}

impl Worker {
    /// A worker for `queue`, moving messages it gives up on to `poison`.
    pub fn new(
        config: WorkerConfig,
        queue: Arc<dyn MessageQueue>,
        poison: Arc<dyn MessageQueue>,
    ) -> Self {
        Worker {
            config,
            queue,
            poison,
            checkpoints: None,
            warmup: None,
            telemetry: None,
            metrics: Metrics::noop(),
            requested: CancellationToken::new(),
            readiness: watch::channel(Readiness::default()).0,
            health_listener: None,
        }
    }

    /// Serves the health endpoints on `listener` instead of binding
    /// `health_addr` (for callers that must know the port before running).
    pub fn with_health_listener(mut self, listener: tokio::net::TcpListener) -> Self {
        self.health_listener = Some(listener);
        self
    }

    /// Gives handlers checkpoints (`Job::checkpoint`) kept in `store`.
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    /// The application's warmup, run (and retried while it fails) before
    /// anything is taken from the queue.
    pub fn with_warmup<F, Fut>(mut self, warmup: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), WarmupError>> + Send + 'static,
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

    /// Runs the whole lifecycle and returns after a graceful drain. Errors
    /// only when the worker cannot start (bad configuration, busy health
    /// port) or the gate timed out; storage and IMDS failures while running
    /// are retried, not returned.
    pub async fn run<H: MessageHandler>(mut self, handler: H) -> Result<RunReport, WorkerError> {
        self.config.validate()?;
        let stop_health = CancellationToken::new();
        let listener = self.health_listener.take();
        let health_task = self.serve_health(listener, &stop_health).await?;
        self.metrics.set_ready(false);

        let (watcher, event_signal) = self.watch_events()?;
        let triggers = Triggers::new(event_signal, self.requested.clone());
        if self.config.shutdown.handle_signals {
            triggers.listen_for_signals();
        }

        let mut result = self
            .gate_then_consume(handler, &triggers, watcher.as_ref())
            .await;
        // Stop polling before approving: IMDS allows 5 requests a second,
        // and the approval must not queue behind (or be throttled by) polls.
        let approval = watcher.as_ref().map(Approval::capture);
        if let Some(watcher) = watcher {
            watcher.stop().await;
        }
        if let (Ok(report), Some(approval)) = (&mut result, approval) {
            report.shutdown.approved_event = self.approve(&report.shutdown.trigger, approval).await;
        }
        self.metrics.set_ready(false);
        // Shut the exporters down within a bound: merely dropping them would
        // make the SDK block on a final export for as long as it likes.
        if let Some(telemetry) = self.telemetry.take()
            && let Err(error) = telemetry.shutdown(Duration::from_secs(2)).await
        {
            tracing::warn!(%error, "flushing telemetry failed");
        }
        stop_health.cancel();
        let _ = health_task.await;
        result
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

    fn watch_events(
        &self,
    ) -> Result<(Option<RunningWatcher>, Option<ShutdownSignal>), WorkerError> {
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
        let signal = watcher.shutdown_on(ShutdownPolicy::default());
        Ok((Some(watcher.spawn()), Some(signal)))
    }

    fn imds_config(&self) -> ImdsConfig {
        ImdsConfig::default().with_endpoint(self.config.imds.endpoint.clone())
    }

    async fn gate_then_consume<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
        watcher: Option<&RunningWatcher>,
    ) -> Result<RunReport, WorkerError> {
        let checks = Checks {
            imds: watcher.map(RunningWatcher::health),
            queue: Arc::clone(&self.queue),
            poison: Arc::clone(&self.poison),
            checkpoints: self.checkpoints.clone(),
            warmup: self.warmup.clone(),
        };
        let gate = gate::open(checks, &self.readiness);
        let gate_timeout = async {
            match self.config.gate_timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = gate => {}
            trigger = triggers.first() => {
                // Nothing was taken yet: there is nothing to drain.
                tracing::info!(%trigger, "stopping before the warmup gate opened");
                return Ok(self.stopped_before_start(trigger));
            }
            () = gate_timeout => {
                let waiting_for = self.readiness.borrow().waiting_for().join(", ");
                return Err(WorkerError::GateTimeout {
                    waited: self.config.gate_timeout.unwrap_or_default(),
                    waiting_for,
                });
            }
        }
        tracing::info!(queue = self.queue.name(), "warmup gate open; taking work");
        self.metrics.set_ready(true);
        self.consume(handler, triggers).await
    }

    fn stopped_before_start(&self, trigger: Trigger) -> RunReport {
        self.readiness
            .send_modify(|r| r.shutting_down = Some(trigger.to_string()));
        RunReport {
            stats: ConsumerStats::default(),
            shutdown: ShutdownReport {
                trigger,
                notice_to_drained: Duration::ZERO,
                released_running_handlers: false,
                met_deadline: true,
                approved_event: false,
            },
        }
    }

    async fn consume<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
    ) -> Result<RunReport, WorkerError> {
        let consumer = self.consumer()?;
        let handler = MeteredHandler {
            inner: handler,
            metrics: self.metrics.clone(),
            queue: self.queue.name().to_owned(),
        };
        let signals = ShutdownSignals::new();
        let consuming = consumer.run_until(handler, signals.clone());
        tokio::pin!(consuming);

        let trigger = tokio::select! {
            // The consumer only returns once told to stop.
            stats = &mut consuming => {
                tracing::error!("the consumer stopped by itself");
                return Ok(RunReport { stats, shutdown: self.stopped_before_start(Trigger::Requested).shutdown });
            }
            trigger = triggers.first() => trigger,
        };
        let noticed_at = Instant::now();
        let plan = Plan::new(&trigger, noticed_at, &self.config.shutdown);
        self.readiness
            .send_modify(|r| r.shutting_down = Some(trigger.to_string()));
        self.metrics.set_ready(false);
        if let Trigger::Event(notice) = &trigger {
            self.metrics.eviction_notice(notice.event_type.as_str());
        }
        tracing::warn!(
            %trigger,
            release_in_ms = plan.release_at.saturating_duration_since(noticed_at).as_millis() as u64,
            hard_deadline_in_ms = plan.hard_deadline.saturating_duration_since(noticed_at).as_millis() as u64,
            "draining: intake stopped, handlers asked to checkpoint"
        );
        let _watchdog = self
            .config
            .shutdown
            .watchdog
            .then(|| Watchdog::arm(plan.hard_deadline));

        signals.wind_down(Some(plan.release_at));
        let mut released_running_handlers = false;
        let stats = tokio::select! {
            stats = &mut consuming => stats,
            () = tokio::time::sleep_until(plan.release_at) => {
                tracing::warn!("release time reached; dropping handlers still running and releasing their messages");
                released_running_handlers = true;
                signals.release();
                consuming.await
            }
        };
        let drained_at = Instant::now();
        let notice_to_drained = drained_at - noticed_at;
        self.metrics.drained(notice_to_drained);
        let met_deadline = drained_at <= plan.hard_deadline;
        tracing::warn!(
            notice_to_drained_ms = notice_to_drained.as_millis() as u64,
            met_deadline,
            released = stats.released,
            "drained"
        );
        Ok(RunReport {
            stats,
            shutdown: ShutdownReport {
                trigger,
                notice_to_drained,
                released_running_handlers,
                met_deadline,
                // Set by `run` once the watcher is stopped.
                approved_event: false,
            },
        })
    }

    fn consumer(&self) -> Result<Consumer, WorkerError> {
        let config = ConsumerConfig {
            max_in_flight: self.config.concurrency,
            batch_size: u8::try_from(self.config.concurrency.min(32)).unwrap_or(32),
            visibility_timeout: self.config.visibility_timeout,
            max_failures: self.config.max_dequeue_count,
            idle_backoff_max: self.config.idle_poll_max,
            encoding: self.config.encoding,
            ..ConsumerConfig::default()
        };
        let metrics = &self.metrics;
        let queue = MeteredQueue::work(Arc::clone(&self.queue), metrics.clone());
        let poison =
            MeteredQueue::poison(Arc::clone(&self.poison), self.queue.name(), metrics.clone());
        let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config)
            .map_err(WorkerError::Storage)?;
        Ok(match &self.checkpoints {
            Some(store) => consumer.with_checkpoints(Arc::new(MeteredCheckpoints {
                inner: Arc::clone(store),
                metrics: metrics.clone(),
            })),
            None => consumer,
        })
    }

    /// Approves the event that caused the drain, so Azure need not wait for
    /// `NotBefore`. Only this VM's events ever trigger a drain; the scope
    /// check in the client makes sure of it again. One request: the event is
    /// taken from the watcher's last document.
    async fn approve(&self, trigger: &Trigger, approval: Approval) -> bool {
        let Trigger::Event(notice) = trigger else {
            return false;
        };
        if !self.config.shutdown.approve_events {
            return false;
        }
        let Some(vm_name) = approval.vm_name else {
            tracing::warn!("not approving: this VM's name is not known");
            return false;
        };
        let Some(event) = approval
            .document
            .as_deref()
            .and_then(|d| d.event(&notice.event_id))
            .cloned()
        else {
            tracing::info!(event_id = %notice.event_id, "not approving: the event is gone already");
            return false;
        };
        let client = match ImdsClient::new(self.imds_config()) {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, "not approving: no IMDS client");
                return false;
            }
        };
        let scope = ApprovalScope::ThisVm(vm_name);
        let approval = client.approve_event(&event, &scope);
        match tokio::time::timeout(Duration::from_secs(2), approval).await {
            Ok(Ok(outcome)) => {
                tracing::info!(event_id = %notice.event_id, ?outcome, "approved the event after draining");
                true
            }
            Ok(Err(error)) => {
                tracing::warn!(error = %error.chain(), "approving the event failed");
                false
            }
            Err(_) => {
                tracing::warn!("approving the event timed out");
                false
            }
        }
    }
}

/// What approving needs from the watcher, taken before it is stopped.
struct Approval {
    vm_name: Option<String>,
    document: Option<Arc<ScheduledEvents>>,
}

impl Approval {
    fn capture(watcher: &RunningWatcher) -> Self {
        Approval {
            vm_name: watcher.health().borrow().vm_name.clone(),
            document: watcher.document().borrow().clone(),
        }
    }
}
