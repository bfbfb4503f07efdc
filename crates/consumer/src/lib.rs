//! The queue consumer: receives messages in batches, runs a handler for each
//! under a renewed lease, and settles the outcome (delete, retry later,
//! wait for another holder of the job, poison, or release on shutdown). It
//! depends only on the [`MessageQueue`], [`CheckpointStore`] and
//! [`ResultStore`] traits.
//!
//! - [`config`]: the settings and their limits.
//! - [`handler`]: what a user writes ([`MessageHandler`]), and [`job`]: the
//!   [`Job`] it receives.
//! - [`run`]: the receive loop.
//! - [`signals`]: the three stages of stopping.
//! - [`settlement`]: every decision, as pure functions with table tests.
//! - the durable record of failures that decides poisoning is the store's
//!   (`spot_worker_storage::attempts`), which the lane keeper reads too.
//! - [`release_note`]: evictions recorded there, so they are not crashes.
//! - [`intake`]: when to receive, and how many messages.
//! - [`delivery`], [`running`], [`finish`] and [`settling`]: one message
//!   from receive to settle.
//! - [`pre_read`], [`pre_check`], [`marker`] and [`leftover`]: what a
//!   delivery reads before the handler runs, and the checkpoint it removes
//!   after a success.
//! - [`poison`]: the lossless poison record.
//! - [`outcome`]: what became of each delivery, for statistics and telemetry.
//! - [`job_goodput`]: where a finished job's time went, across its
//!   deliveries.
//! - [`no_outcome`]: earlier deliveries that ended with none, counted once
//!   for the checkpoint interval.
//! - [`lane_plugin`]: the seam through which lanes plug in ([`LanePlugin`]),
//!   and [`lane_delivery`]: the consumer's side of a job with a deadline
//!   (its claim tried again, an old copy deleted, the check while it runs,
//!   the move where it is let go). The lanes themselves
//!   (`spot-worker-lanes`) implement the plugin; this crate knows nothing
//!   of them.

mod config;
mod delivery;
mod finish;
mod handler;
mod in_flight;
mod intake;
mod interruption_kind;
mod job;
mod job_goodput;
mod lane_delivery;
mod lane_plugin;
mod lane_state;
mod lease;
mod leftover;
mod marker;
mod no_outcome;
mod outcome;
mod panics;
mod poison;
mod poisoning;
mod pre_check;
mod pre_read;
mod probe;
mod record_read;
mod release_note;
mod run;
mod running;
mod settlement;
mod settling;
mod signals;
mod stats;
mod store_health;
mod watched;

use std::sync::Arc;

use spot_worker_decisions::cadence::{
    CheckpointCadence, DEFAULT_SEED_EVICTIONS_PER_HOUR, IntervalSource,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use spot_worker_storage::CheckpointStore;
use spot_worker_storage::ResultStore;
use spot_worker_storage::memory::InMemoryCheckpointStore;
use spot_worker_storage::{Clock, SystemClock};
use spot_worker_storage::{MessageQueue, QueueMessage};

pub use config::{ConsumerConfig, DEFAULT_REFUSAL_GRACE};
pub use handler::{FnHandler, HandlerError, MessageHandler, Permanent, handler_fn, permanent};
use intake::{LastReceive, SlotWait, slot_wait};
pub use job::Job;
pub use job_goodput::{
    COMPLETION_RECORD_MIN, COMPLETION_RECORD_PREFIX, CompletionRecord, DeadlineObserver,
    DeadlineOutcome, GoodputObserver,
};
pub use lane_plugin::{
    Claim, LaneFinish, LaneJob, LaneMemo, LaneMove, LanePlugin, MoveSettings, SwitchPart,
};
pub use marker::ResultMarker;
pub use outcome::{DeliveryOutcome, SettlementObserver};
pub use poison::{
    BodyBlob, MAX_POISON_MESSAGE_LEN, PoisonRecord, poison_body_blob_name, poison_queue_name,
};
pub use signals::DrainSignals;
use spot_worker_storage::attempts::AttemptLog;
pub use spot_worker_storage::attempts::FailingJob;
use spot_worker_storage::backoff::IdleBackoff;
pub use stats::ConsumerStats;
use stats::{Counters, bump};
pub use store_health::StoreHealth;
use watched::{StoreMonitor, WatchedStore};

/// Receives messages from a queue and runs a [`MessageHandler`] on each.
/// Clones share configuration and statistics.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use spot_worker_consumer::{Consumer, ConsumerConfig, HandlerError, Job, handler_fn};
/// use spot_worker_storage::{InMemoryQueue, MessageQueue};
/// use tokio_util::sync::CancellationToken;
///
/// let queue = InMemoryQueue::new("jobs");
/// let poison = InMemoryQueue::new("jobs-poison");
/// queue.send("hello", Duration::ZERO).await.unwrap();
///
/// let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(poison), ConsumerConfig::default()).unwrap();
/// let shutdown = CancellationToken::new();
/// let stop = shutdown.clone();
/// let handler = handler_fn(move |job: Job| {
///     let stop = stop.clone();
///     async move {
///         assert_eq!(job.text()?, "hello");
///         stop.cancel(); // one message is enough for this example
///         Ok::<(), HandlerError>(())
///     }
/// });
/// let stats = consumer.run(handler, shutdown).await;
/// assert_eq!(stats.succeeded, 1);
/// assert!(queue.is_empty());
/// # });
/// ```
#[derive(Clone)]
pub struct Consumer {
    queue: Arc<dyn MessageQueue>,
    poison: Arc<dyn MessageQueue>,
    checkpoints: Option<Arc<dyn CheckpointStore>>,
    attempts: AttemptLog,
    poison_bodies: Option<Arc<dyn ResultStore>>,
    message_span: MessageSpan,
    config: Arc<ConsumerConfig>,
    counters: Arc<Counters>,
    observer: Option<SettlementObserver>,
    goodput_observer: Option<GoodputObserver>,
    deadline_observer: Option<DeadlineObserver>,
    monitor: Arc<StoreMonitor>,
    cadence: Arc<CheckpointCadence>,
    lanes: Option<Arc<dyn LanePlugin>>,
    lane_finish: Option<Arc<dyn LaneFinish>>,
    clock: Arc<dyn Clock>,
}

/// Makes the one span a delivery runs in, from its queue and message: the
/// handler, the lease renewals and the settlement all log inside it.
pub type MessageSpan = Arc<dyn Fn(&str, &QueueMessage) -> tracing::Span + Send + Sync>;

/// The default span of a delivery: `message`, with the queue, the message id
/// and its dequeue count.
fn plain_message_span(queue: &str, message: &QueueMessage) -> tracing::Span {
    tracing::info_span!(
        "message",
        queue,
        message_id = %message.id,
        dequeue_count = message.dequeue_count
    )
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.queue.name())
            .field("poison", &self.poison.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer of `queue` that moves given-up messages to `poison_queue`
    /// (by convention named [`poison_queue_name`]).
    ///
    /// Until [`Consumer::with_checkpoints`] gives it a durable store, it
    /// keeps attempt records in memory: failures then count per process.
    pub fn new(
        queue: Arc<dyn MessageQueue>,
        poison_queue: Arc<dyn MessageQueue>,
        config: ConsumerConfig,
    ) -> Result<Self, spot_worker_storage::StorageError> {
        config.validate()?;
        let monitor = Arc::new(StoreMonitor::new(config.refusal_grace));
        Ok(Consumer {
            queue,
            poison: poison_queue,
            checkpoints: None,
            attempts: AttemptLog::new(Arc::new(InMemoryCheckpointStore::new())),
            poison_bodies: None,
            message_span: Arc::new(plain_message_span),
            config: Arc::new(config),
            counters: Arc::default(),
            observer: None,
            goodput_observer: None,
            deadline_observer: None,
            cadence: Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
                seed_evictions_per_hour: DEFAULT_SEED_EVICTIONS_PER_HOUR,
            })),
            monitor,
            lanes: None,
            lane_finish: None,
            clock: Arc::new(SystemClock),
        })
    }

    /// Draws the jitter of its waits (idle polling, retries, probes of
    /// the store) from `clock` instead of the thread's random numbers
    /// ([`SystemClock`], the default): a seeded fault search replays a
    /// run exactly this way. The lanes' time of day is their own (in
    /// `spot-worker-lanes`, their `SpotCapacity`'s clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Gives handlers checkpoints ([`Job::checkpoint`]), deletes redelivered
    /// messages whose job's checkpoint is completed without running the
    /// handler again, and keeps the attempt records (failures that count
    /// towards the poison queue) in `store`, so every VM counts the same.
    /// While the store is unavailable, received messages wait under their
    /// renewed leases instead of counting as failures; while it refuses
    /// this worker or misses its container for longer than
    /// [`ConsumerConfig::refusal_grace`], intake pauses
    /// ([`Consumer::store_health`]).
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        let store: Arc<dyn CheckpointStore> = Arc::new(WatchedStore {
            inner: store,
            monitor: Arc::clone(&self.monitor),
        });
        self.attempts = AttemptLog::new(Arc::clone(&store));
        self.checkpoints = Some(store);
        self
    }

    /// Has every delivery's checkpoint handles follow `cadence` (the
    /// worker's checkpoint interval, docs/checkpoint-interval.md): they ask
    /// it whether a save is due and record what each save cost in it.
    /// Without it, the consumer keeps a cadence of its own from the default
    /// seed rate.
    pub fn with_cadence(mut self, cadence: Arc<CheckpointCadence>) -> Self {
        self.cadence = cadence;
        self
    }

    /// The cadence the deliveries' checkpoint handles follow.
    pub fn cadence(&self) -> &Arc<CheckpointCadence> {
        &self.cadence
    }

    /// Serves `lanes.lane()` of two lanes (`spot-worker-lanes`' `Lanes`
    /// is the plugin): this consumer's queue is that lane's, and jobs with
    /// a deadline move to the other lane's where the lane rule says so
    /// (when a worker lets them go, and, on regular capacity, once they are
    /// ahead of their line by two switches). Moves need a checkpoint store
    /// ([`Consumer::with_checkpoints`]) for the jobs' lane records. Without
    /// lanes a job with a deadline runs where it was sent.
    pub fn with_lanes(mut self, lanes: impl LanePlugin) -> Self {
        let lanes: Arc<dyn LanePlugin> = Arc::new(lanes);
        self.lane_finish = Some(Arc::clone(&lanes) as Arc<dyn LaneFinish>);
        self.lanes = Some(lanes);
        self
    }

    /// Marks the lane record of every job with a deadline that finishes
    /// here finished by `finish`, on a worker that serves no lane (a worker
    /// with lanes does by its [`LanePlugin`]): a copy of the job that a
    /// worker with lanes left behind is then discarded unrun. Needs a
    /// checkpoint store ([`Consumer::with_checkpoints`]); ignored on a
    /// consumer that serves a lane.
    pub fn with_lane_finish(mut self, finish: impl LaneFinish) -> Self {
        if self.lanes.is_none() {
            self.lane_finish = Some(Arc::new(finish));
        }
        self
    }

    /// The lanes this consumer serves one of, if any.
    pub fn lanes(&self) -> Option<&dyn LanePlugin> {
        self.lanes.as_deref()
    }

    /// Makes each delivery's span with `span` instead of the plain default
    /// (the runtime passes the OpenTelemetry messaging span), so a message
    /// has exactly one span.
    pub fn with_message_span(mut self, span: MessageSpan) -> Self {
        self.message_span = span;
        self
    }

    /// Tells `observer` of every [`DeliveryOutcome`] as the statistics count it (the
    /// runtime records its metrics this way), inside the delivery's span.
    pub fn with_settlement_observer(mut self, observer: SettlementObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Tells `observer` of the goodput ledger of every job this consumer
    /// finishes (see [`spot_worker_decisions::goodput`]), inside the delivery's span.
    pub fn with_goodput_observer(mut self, observer: GoodputObserver) -> Self {
        self.goodput_observer = Some(observer);
        self
    }

    /// Tells `observer` how every job with a deadline this consumer
    /// finishes met it, with its ledger (hours by lane), inside the
    /// delivery's span.
    pub fn with_deadline_observer(mut self, observer: DeadlineObserver) -> Self {
        self.deadline_observer = Some(observer);
        self
    }

    /// Where the original of a poisoned message goes when it does not fit
    /// into the poison record (a claim check, usually the blob container
    /// `poison`). Without it such a message is kept, not cut short.
    pub fn with_poison_bodies(mut self, store: Arc<dyn ResultStore>) -> Self {
        self.poison_bodies = Some(store);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Whether the checkpoint store serves this worker, and every change:
    /// not healthy while it has refused this worker's requests (401/403) or
    /// missed its container for longer than
    /// [`ConsumerConfig::refusal_grace`]. Meanwhile the consumer receives
    /// nothing, logs why at error level once a minute, and probes the store
    /// until it answers again. A runtime turns it into readiness.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use spot_worker_consumer::{Consumer, ConsumerConfig, StoreHealth};
    /// use spot_worker_storage::InMemoryQueue;
    ///
    /// let consumer = Consumer::new(
    ///     Arc::new(InMemoryQueue::new("jobs")),
    ///     Arc::new(InMemoryQueue::new("jobs-poison")),
    ///     ConsumerConfig::default(),
    /// )
    /// .unwrap();
    /// assert_eq!(*consumer.store_health().borrow(), StoreHealth::Healthy);
    /// ```
    pub fn store_health(&self) -> tokio::sync::watch::Receiver<StoreHealth> {
        self.monitor.subscribe()
    }

    /// What the consumer has done so far.
    pub fn stats(&self) -> ConsumerStats {
        self.counters.snapshot()
    }
}
