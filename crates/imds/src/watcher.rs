//! The Scheduled Events watcher: its configuration, its health, and the
//! handle of a running one. Its polling loop (`poller.rs`): fetch, diff,
//! tell, repeat, forever.
//!
//! The watcher must never stop: Scheduled Events is switched off for a VM that
//! has not asked for 24 hours, and a watcher that died on one bad response
//! would miss the eviction it exists for. Errors are logged, reported through
//! [`WatcherHealth`], and retried after a jittered delay never longer than the
//! poll interval: IMDS is local and allows 5 requests a second, so backing off
//! further would only delay the next notice (a Preempt gives 30 seconds).
//! Instance metadata, which only names the VM, is different: a lookup that
//! fails is said once and asked again after an exponential backoff counted
//! in polls ([`metadata_retry_polls`](crate::retry::metadata_retry_polls)).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::client::{ImdsClient, MIN_REQUEST_SPACING};
use crate::model::ScheduledEvents;
use crate::policy::{NoticePolicy, NoticeSignal, NoticeTrigger};
use crate::transition::Transition;

mod poller;

use poller::Poller;

/// How the watcher polls.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// Time between polls; IMDS recommends once a second. Never below
    /// [`MIN_REQUEST_SPACING`] (IMDS allows 5 requests per second). Also the
    /// longest retry delay after an error (see [`retry_delay`](crate::retry::retry_delay)).
    pub poll_interval: Duration,
    /// This VM's name as it appears in `Resources`. `None` asks instance
    /// metadata (`compute.name`) alongside the polls; until it answers,
    /// every event is taken to concern this VM (the safe reading). A name
    /// given here is still checked against instance metadata once, when it
    /// answers (see [`WatcherHealth::vm_name_mismatch`]). Either way a
    /// lookup that fails is logged once and asked again after backing off
    /// ([`metadata_retry_polls`](crate::retry::metadata_retry_polls)), never at every poll.
    pub vm_name: Option<String>,
    /// Transitions buffered per subscriber before a slow one starts missing
    /// them.
    pub channel_capacity: usize,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        WatcherConfig {
            poll_interval: Duration::from_secs(1),
            vm_name: None,
            channel_capacity: 256,
        }
    }
}

/// The watcher's own health, for readiness gates and operators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatcherHealth {
    /// This VM's name, once known: as configured, or from instance metadata.
    pub vm_name: Option<String>,
    /// The name instance metadata gives (`compute.name`), once it answered.
    pub metadata_vm_name: Option<String>,
    /// When the last poll succeeded.
    pub last_success: Option<Instant>,
    /// Incarnation of the last document received.
    pub incarnation: Option<u64>,
    /// Successful polls so far.
    pub polls: u64,
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// Failed attempts since the watcher started.
    pub failures: u64,
    /// The most recent error, rendered (kept after recovery, for operators).
    pub last_error: Option<String>,
}

impl WatcherHealth {
    /// Healthy when this VM's name is known and a poll succeeded within
    /// `max_age`.
    pub fn is_healthy(&self, max_age: Duration) -> bool {
        self.vm_name.is_some() && self.last_success.is_some_and(|at| at.elapsed() <= max_age)
    }

    /// The configured name and the one instance metadata gives, when they
    /// differ (ignoring case, as Azure does): a configuration error, since
    /// events would be matched against the wrong name.
    pub fn vm_name_mismatch(&self) -> Option<(&str, &str)> {
        let configured = self.vm_name.as_deref()?;
        let metadata = self.metadata_vm_name.as_deref()?;
        (!configured.eq_ignore_ascii_case(metadata)).then_some((configured, metadata))
    }
}

/// A Scheduled Events watcher, configured but not yet running.
///
/// Attach shutdown signals and subscribers first, then [`spawn`](Self::spawn)
/// it, so that not even the first document's transitions are missed.
///
/// ```no_run
/// # async fn run() -> Result<(), spot_worker_imds::ImdsError> {
/// use spot_worker_imds::{ImdsClient, ImdsConfig, NoticePolicy, Watcher, WatcherConfig};
///
/// let client = ImdsClient::new(ImdsConfig::default())?;
/// let mut watcher = Watcher::new(client, WatcherConfig::default());
/// let shutdown = watcher.notice_signal(NoticePolicy::default());
/// let _running = watcher.spawn();
///
/// shutdown.cancelled().await;
/// let notice = shutdown.notice().expect("cancelled by a notice");
/// println!("{} {}: drain before {:?}", notice.event_type, notice.event_id, notice.deadline);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Watcher {
    client: Arc<ImdsClient>,
    config: WatcherConfig,
    triggers: Vec<NoticeTrigger>,
    transitions: broadcast::Sender<Transition>,
}

impl Watcher {
    /// A watcher polling through `client`.
    pub fn new(client: ImdsClient, mut config: WatcherConfig) -> Self {
        config.poll_interval = config.poll_interval.max(MIN_REQUEST_SPACING);
        let (transitions, _) = broadcast::channel(config.channel_capacity.max(1));
        Watcher {
            client: Arc::new(client),
            config,
            triggers: Vec::new(),
            transitions,
        }
    }

    /// A shutdown signal driven by `policy`, with a fresh token.
    pub fn notice_signal(&mut self, policy: NoticePolicy) -> NoticeSignal {
        self.shutdown_with_token(policy, CancellationToken::new())
    }

    /// A shutdown signal driven by `policy` that cancels `token` (for example
    /// a child of the application's own shutdown token).
    pub fn shutdown_with_token(
        &mut self,
        policy: NoticePolicy,
        token: CancellationToken,
    ) -> NoticeSignal {
        let (trigger, signal) = NoticeTrigger::new(policy, token);
        self.triggers.push(trigger);
        signal
    }

    /// Every transition, for every VM. A subscriber that falls more than
    /// `channel_capacity` behind gets `RecvError::Lagged` and can resync from
    /// [`RunningWatcher::document`].
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.transitions.subscribe()
    }

    /// Starts polling on the current Tokio runtime. Polling stops when the
    /// returned handle is dropped or [`RunningWatcher::stop`] is called.
    pub fn spawn(self) -> RunningWatcher {
        let stop = CancellationToken::new();
        let refresh = Arc::new(Notify::new());
        let (health_tx, health) = watch::channel(WatcherHealth {
            vm_name: self.config.vm_name.clone(),
            ..WatcherHealth::default()
        });
        let (document_tx, document) = watch::channel(None);
        // Only the poller holds a strong sender, so subscribers see `Closed`
        // if it ever ends.
        let transitions = self.transitions.downgrade();
        let poller = Poller {
            client: self.client,
            config: self.config,
            triggers: self.triggers,
            transitions: self.transitions,
            health: health_tx,
            document: document_tx,
            refresh: refresh.clone(),
            stop: stop.clone(),
            unaddressed_reported: HashSet::new(),
        };
        let task = tokio::spawn(poller.run());
        RunningWatcher {
            task,
            refresh,
            health,
            document,
            transitions,
            _stop: stop.drop_guard(),
        }
    }
}

/// A running watcher. Dropping it stops the polling.
#[derive(Debug)]
pub struct RunningWatcher {
    task: JoinHandle<()>,
    refresh: Arc<Notify>,
    health: watch::Receiver<WatcherHealth>,
    document: watch::Receiver<Option<Arc<ScheduledEvents>>>,
    transitions: broadcast::WeakSender<Transition>,
    _stop: DropGuard,
}

impl RunningWatcher {
    /// The watcher's health, updated after every attempt.
    pub fn health(&self) -> watch::Receiver<WatcherHealth> {
        self.health.clone()
    }

    /// The last document received.
    pub fn document(&self) -> watch::Receiver<Option<Arc<ScheduledEvents>>> {
        self.document.clone()
    }

    /// Transitions from now on. The receiver reports `Closed` once the
    /// watcher has stopped.
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        match self.transitions.upgrade() {
            Some(sender) => sender.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Polls now instead of at the next tick (still within the rate limit).
    pub fn refresh(&self) {
        self.refresh.notify_one();
    }

    /// Stops polling and waits for the loop to end.
    pub async fn stop(self) {
        let RunningWatcher { task, _stop, .. } = self;
        drop(_stop);
        // The task only ends by cancellation; a JoinError carries nothing.
        let _ = task.await;
    }
}
