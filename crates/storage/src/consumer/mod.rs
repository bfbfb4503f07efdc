//! The queue consumer: receives messages in batches, runs a handler for each
//! under a renewed lease, and settles the outcome (delete, retry later,
//! poison, or release on shutdown). It depends only on the
//! [`MessageQueue`] and [`CheckpointStore`] traits.

mod backoff;
mod lease;
mod poison;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::str::Utf8Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt as _;
use time::OffsetDateTime;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::checkpoint::{CheckpointStore, JobCheckpoint};
use crate::encoding::MessageEncoding;
use crate::error::StorageError;
use crate::queue::{MAX_RECEIVE_BATCH, MessageId, MessageQueue, QueueMessage};

use backoff::{IdleBackoff, retry_delay};
use lease::{Lease, Renewal};
pub use poison::{PoisonRecord, poison_queue_name};

/// How the consumer receives, leases and settles messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Messages asked for per receive call, 1 to 32.
    pub batch_size: u8,
    /// Most messages being handled at once.
    pub max_in_flight: usize,
    /// How long a received message stays hidden, 5 s to 7 days (Azure
    /// counts whole seconds). Renewed every half of it, at most 10 s apart,
    /// while its handler runs; if no renewal gets through before it runs out
    /// (a storage outage), the lease counts as lost and the handler is
    /// dropped, because another consumer may have the message by then.
    pub visibility_timeout: Duration,
    /// First delay after an empty receive.
    pub idle_backoff_floor: Duration,
    /// Longest delay between receives while the queue stays empty.
    pub idle_backoff_max: Duration,
    /// Delay before the first retry of a failed message; doubles per attempt.
    pub retry_backoff_base: Duration,
    /// Longest delay before a retry.
    pub retry_backoff_max: Duration,
    /// After this many failed receives a message goes to `<queue>-poison`.
    pub max_dequeue_count: u32,
    /// How message text encodes the body.
    pub encoding: MessageEncoding,
    /// Deadline of each settle call (delete, retry, poison, release). It is
    /// separate from the shutdown token on purpose: settling must still
    /// happen after shutdown was requested.
    pub settle_timeout: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            batch_size: 16,
            max_in_flight: 16,
            visibility_timeout: Duration::from_secs(30),
            idle_backoff_floor: Duration::from_millis(200),
            idle_backoff_max: Duration::from_secs(10),
            retry_backoff_base: Duration::from_secs(5),
            retry_backoff_max: Duration::from_secs(300),
            max_dequeue_count: 5,
            encoding: MessageEncoding::Text,
            settle_timeout: Duration::from_secs(10),
        }
    }
}

/// The shortest lease [`ConsumerConfig::validate`] accepts.
const MIN_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest visibility timeout the queue service accepts.
const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl ConsumerConfig {
    /// Checks the limits the queue service imposes.
    pub fn validate(&self) -> Result<(), StorageError> {
        let invalid = |reason: &str| Err(StorageError::InvalidArgument(reason.to_owned()));
        if self.batch_size == 0 || self.batch_size > MAX_RECEIVE_BATCH {
            return invalid("batch_size must be between 1 and 32");
        }
        if self.max_in_flight == 0 {
            return invalid("max_in_flight must be at least 1");
        }
        // Below 5 s a renewal has too little time to get through before the
        // lease runs out; 7 days is the queue service's own limit.
        if self.visibility_timeout < MIN_VISIBILITY_TIMEOUT
            || self.visibility_timeout > MAX_VISIBILITY_TIMEOUT
        {
            return invalid("visibility_timeout must be between 5 seconds and 7 days");
        }
        if self.max_dequeue_count == 0 {
            return invalid("max_dequeue_count must be at least 1");
        }
        if self.idle_backoff_floor.is_zero() || self.idle_backoff_max < self.idle_backoff_floor {
            return invalid("idle backoff needs 0 < floor <= max");
        }
        if self.settle_timeout.is_zero() {
            return invalid("settle_timeout must be positive");
        }
        Ok(())
    }
}

/// What a handler's failure carries; its text becomes the poison record's
/// `last_error`.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// User code that processes one message. Returning `Ok` deletes the message;
/// returning `Err` (or panicking, unless built with `panic = "abort"`)
/// retries it later and poisons it after `max_dequeue_count` attempts. The
/// future is dropped if the lease is lost or the worker shuts down, so keep
/// work between awaits restartable.
#[async_trait]
pub trait MessageHandler: Send + Sync + 'static {
    /// Processes one message.
    async fn handle(&self, job: Job) -> Result<(), HandlerError>;
}

/// A [`MessageHandler`] made from an async closure; see [`handler_fn`].
pub struct FnHandler<F>(F);

/// Wraps an async closure as a [`MessageHandler`].
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    FnHandler(f)
}

#[async_trait]
impl<F, Fut> MessageHandler for FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        (self.0)(job).await
    }
}

/// One delivery of a message, as the handler sees it.
#[derive(Debug)]
pub struct Job {
    id: MessageId,
    dequeue_count: u32,
    inserted_at: Option<OffsetDateTime>,
    body: Vec<u8>,
    cancelled: CancellationToken,
    fence: CancellationToken,
    deadline: watch::Receiver<Option<Instant>>,
    checkpoints: Option<Arc<dyn CheckpointStore>>,
}

impl Job {
    /// The message id (also the default checkpoint key).
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// How many times the message has been received, this time included.
    pub fn dequeue_count(&self) -> u32 {
        self.dequeue_count
    }

    /// When the message was first sent, if known.
    pub fn inserted_at(&self) -> Option<OffsetDateTime> {
        self.inserted_at
    }

    /// The decoded body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The decoded body as UTF-8 text.
    pub fn text(&self) -> Result<&str, Utf8Error> {
        std::str::from_utf8(&self.body)
    }

    /// Cancelled when the lease is lost or the worker winds down; long
    /// handlers watch it, save their progress and return an error (the
    /// message is then released at once for another worker).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancelled
    }

    /// The instant by which a winding-down handler must have returned (after
    /// it, the handler is dropped and its message released); `None` while
    /// the worker is not shutting down or has no deadline.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.borrow()
    }

    /// This job's checkpoint, keyed by the message id.
    pub async fn checkpoint(&self) -> Result<JobCheckpoint, StorageError> {
        self.checkpoint_for(self.id.as_str()).await
    }

    /// A checkpoint under a key the handler chooses (for example a job id
    /// inside the message). Its writes are refused once the lease is lost or
    /// the message released, but allowed while winding down.
    pub async fn checkpoint_for(&self, key: &str) -> Result<JobCheckpoint, StorageError> {
        let store = self.checkpoints.clone().ok_or_else(|| {
            StorageError::InvalidArgument("the consumer has no checkpoint store".to_owned())
        })?;
        Ok(JobCheckpoint::load(store, key)
            .await?
            .fenced_by(self.fence.clone()))
    }
}

/// Counts of what the consumer did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages received.
    pub received: u64,
    /// Handled successfully and deleted.
    pub succeeded: u64,
    /// Failed and made visible again after a backoff.
    pub retried: u64,
    /// Moved to the poison queue.
    pub poisoned: u64,
    /// Made visible again at once: because the worker shut down, or because
    /// the queue returned more messages than were asked for.
    pub released: u64,
    /// Given up because another consumer took the message.
    pub leases_lost: u64,
    /// Deleted without running the handler because a completed checkpoint
    /// existed.
    pub skipped_completed: u64,
    /// Settle calls that failed or timed out (the message reappears after its
    /// visibility timeout, so nothing is lost).
    pub settle_failures: u64,
    /// Receive calls that failed (storage unreachable, throttled); the
    /// consumer backs off and keeps trying.
    pub receive_errors: u64,
    /// Deliveries abandoned because the handler's checkpoint write was
    /// fenced off by another worker ([`StorageError::Conflict`]); the message
    /// is left alone.
    pub abandoned: u64,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    poisoned: AtomicU64,
    released: AtomicU64,
    leases_lost: AtomicU64,
    skipped_completed: AtomicU64,
    settle_failures: AtomicU64,
    receive_errors: AtomicU64,
    abandoned: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> ConsumerStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            received: get(&self.received),
            succeeded: get(&self.succeeded),
            retried: get(&self.retried),
            poisoned: get(&self.poisoned),
            released: get(&self.released),
            leases_lost: get(&self.leases_lost),
            skipped_completed: get(&self.skipped_completed),
            settle_failures: get(&self.settle_failures),
            receive_errors: get(&self.receive_errors),
            abandoned: get(&self.abandoned),
        }
    }
}

/// The three stages of stopping a consumer ([`Consumer::run_until`]), so a
/// worker with some notice (a Spot eviction gives 30 s) stops taking work at
/// once, lets handlers save their progress, and hands back what is left.
///
/// Each stage implies the ones before it. Clones share the same stages.
///
/// ```
/// use spot_worker_storage::ShutdownSignals;
///
/// let signals = ShutdownSignals::new();
/// signals.wind_down(None);
/// assert!(signals.is_receiving_stopped());
/// assert!(!signals.is_released());
/// ```
#[derive(Clone, Debug)]
pub struct ShutdownSignals {
    release: CancellationToken,
    wind_down: CancellationToken,
    stop_receiving: CancellationToken,
    deadline: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for ShutdownSignals {
    fn default() -> Self {
        ShutdownSignals::new()
    }
}

impl ShutdownSignals {
    /// Signals with no stage begun.
    pub fn new() -> Self {
        let release = CancellationToken::new();
        let wind_down = release.child_token();
        let stop_receiving = wind_down.child_token();
        ShutdownSignals {
            release,
            wind_down,
            stop_receiving,
            deadline: Arc::new(watch::channel(None).0),
        }
    }

    /// Stage 1: receive no more messages; in-flight handlers keep running
    /// (their leases renewed) until they finish.
    pub fn stop_receiving(&self) {
        self.stop_receiving.cancel();
    }

    /// Stage 2: also cancel every handler's token ([`Job::cancellation`]) so
    /// it can save its progress and return; `deadline` is what
    /// [`Job::deadline`] reports. A handler that returns `Ok` is settled as
    /// usual; one that returns an error has its message made visible again at
    /// once, without counting towards the poison queue.
    pub fn wind_down(&self, deadline: Option<Instant>) {
        self.deadline.send_replace(deadline);
        self.wind_down.cancel();
    }

    /// Stage 3: drop every handler still running and make its message
    /// visible again at once, so another worker can take it now.
    pub fn release(&self) {
        self.release.cancel();
    }

    /// Whether stage 1 (or a later one) has begun.
    pub fn is_receiving_stopped(&self) -> bool {
        self.stop_receiving.is_cancelled()
    }

    /// Whether stage 3 has begun.
    pub fn is_released(&self) -> bool {
        self.release.is_cancelled()
    }

    /// Resolves once stage 1 (or a later one) has begun.
    async fn stopping(&self) {
        self.stop_receiving.cancelled().await
    }
}

/// Receives messages from a queue and runs a [`MessageHandler`] on each.
/// Clones share configuration and statistics.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use spot_worker_storage::{
///     Consumer, ConsumerConfig, HandlerError, InMemoryQueue, Job, MessageQueue, handler_fn,
/// };
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
    config: Arc<ConsumerConfig>,
    counters: Arc<Counters>,
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

/// Why a handler stopped, as far as settling is concerned.
enum Outcome {
    Finished(Result<(), HandlerError>),
    Cancelled,
}

/// What the completed-checkpoint check found.
enum PreCheck {
    /// No completed checkpoint (or no store): run the handler.
    Run,
    /// Done on an earlier delivery: delete without running the handler.
    Completed,
    /// The lease was lost or the worker is shutting down.
    Interrupted,
    /// The store failed in a way that waiting will not fix.
    Failed(StorageError),
}

/// What to do with a message once its handler has stopped.
enum Settlement {
    Delete,
    Release,
    Abandon(HandlerError),
    Poison(HandlerError),
    Retry(HandlerError),
    Unexplained,
}

impl Consumer {
    /// A consumer of `queue` that moves given-up messages to `poison_queue`
    /// (by convention named [`poison_queue_name`]).
    pub fn new(
        queue: Arc<dyn MessageQueue>,
        poison_queue: Arc<dyn MessageQueue>,
        config: ConsumerConfig,
    ) -> Result<Self, StorageError> {
        config.validate()?;
        Ok(Consumer {
            queue,
            poison: poison_queue,
            checkpoints: None,
            config: Arc::new(config),
            counters: Arc::default(),
        })
    }

    /// Gives handlers checkpoints ([`Job::checkpoint`]) and deletes
    /// redelivered messages whose checkpoint (keyed by message id) is
    /// completed, without running the handler again. While the store is
    /// unavailable, received messages wait under their renewed leases
    /// instead of counting as failed attempts.
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// What the consumer has done so far.
    pub fn stats(&self) -> ConsumerStats {
        self.counters.snapshot()
    }

    /// Consumes until `shutdown` is cancelled, then drops every handler,
    /// makes its message visible again at once, and returns the statistics.
    /// Storage errors are logged and retried with backoff, never returned:
    /// a worker keeps trying until it is told to stop.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> ConsumerStats {
        let signals = ShutdownSignals::new();
        let release = signals.clone();
        let forward = tokio::spawn(async move {
            shutdown.cancelled().await;
            release.release();
        });
        let stats = self.run_until(handler, signals).await;
        forward.abort();
        stats
    }

    /// Consumes until told to stop, in the stages of [`ShutdownSignals`]:
    /// stop receiving, wind handlers down, release what is left. Returns when
    /// no message is in flight any more.
    pub async fn run_until<H: MessageHandler>(
        &self,
        handler: H,
        signals: ShutdownSignals,
    ) -> ConsumerStats {
        let shutdown = &signals;
        let handler = Arc::new(handler);
        let config = &self.config;
        let slots = Arc::new(Semaphore::new(config.max_in_flight));
        let mut idle = IdleBackoff::new(config.idle_backoff_floor, config.idle_backoff_max);
        let mut jobs = JoinSet::new();
        tracing::info!(queue = self.queue.name(), "consumer started");
        loop {
            while let Some(result) = jobs.try_join_next() {
                log_join_error(result);
            }
            let Some(permits) = self.acquire_slots(&slots, shutdown).await else {
                break;
            };
            let visibility = config.visibility_timeout;
            let wanted = u8::try_from(permits.len()).unwrap_or(config.batch_size);
            // Leases are timed from before the request: the service starts
            // the visibility timeout somewhere between sending and answering.
            let received_at = Instant::now();
            let receive = self.queue.receive(wanted, visibility);
            tokio::pin!(receive);
            let received = tokio::select! {
                biased;
                result = &mut receive => result,
                _ = shutdown.stopping() => {
                    // A receive the service already answered hid its messages;
                    // let it finish (briefly) so they can be released at once.
                    if let Ok(Ok(messages)) = tokio::time::timeout(config.settle_timeout, receive).await {
                        self.release_unstarted(messages).await;
                    }
                    break;
                }
            };
            let delay = match received {
                Ok(messages) if !messages.is_empty() => {
                    idle.reset();
                    let mut permits = permits.into_iter();
                    let mut extras = Vec::new();
                    for message in messages {
                        let Some(permit) = permits.next() else {
                            extras.push(message);
                            continue;
                        };
                        bump(&self.counters.received);
                        let worker = self.clone();
                        let handler = Arc::clone(&handler);
                        let job_token = shutdown.wind_down.child_token();
                        let span = tracing::info_span!(
                            "message",
                            queue = self.queue.name(),
                            message_id = %message.id,
                            dequeue_count = message.dequeue_count
                        );
                        let signals = shutdown.clone();
                        jobs.spawn(
                            async move {
                                worker
                                    .process(
                                        message,
                                        received_at,
                                        handler,
                                        job_token,
                                        signals,
                                        permit,
                                    )
                                    .await
                            }
                            .instrument(span),
                        );
                    }
                    if !extras.is_empty() {
                        // Nothing would renew or settle them: they would stay
                        // hidden for a whole visibility timeout for nothing.
                        tracing::warn!(
                            queue = self.queue.name(),
                            asked_for = wanted,
                            extra = extras.len(),
                            "the queue returned more messages than asked for; releasing the extra ones"
                        );
                        let worker = self.clone();
                        jobs.spawn(async move { worker.release_unstarted(extras).await });
                    }
                    continue;
                }
                Ok(_) => idle.next_delay(),
                Err(error) => {
                    bump(&self.counters.receive_errors);
                    tracing::warn!(queue = self.queue.name(), %error, "receive failed; backing off");
                    idle.next_delay()
                }
            };
            tokio::select! {
                _ = shutdown.stopping() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        tracing::info!(
            queue = self.queue.name(),
            in_flight = jobs.len(),
            "consumer stopping"
        );
        while let Some(result) = jobs.join_next().await {
            log_join_error(result);
        }
        self.stats()
    }

    /// Waits for at least one free slot, then takes as many more as one
    /// batch can use. `None` means shutdown.
    async fn acquire_slots(
        &self,
        slots: &Arc<Semaphore>,
        shutdown: &ShutdownSignals,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            biased;
            _ = shutdown.stopping() => return None,
            permit = Arc::clone(slots).acquire_owned() => permit.ok()?,
        };
        let mut permits = vec![first];
        while permits.len() < usize::from(self.config.batch_size) {
            match Arc::clone(slots).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        Some(permits)
    }

    async fn process<H: MessageHandler>(
        self,
        message: QueueMessage,
        received_at: Instant,
        handler: Arc<H>,
        job_token: CancellationToken,
        signals: ShutdownSignals,
        _slot: OwnedSemaphorePermit,
    ) {
        let config = Arc::clone(&self.config);
        let lease = Lease::new(message.id.clone(), message.pop_receipt.clone());
        // Checkpoint writes stop when the delivery is no longer ours (lease
        // lost) or handed back (released), but not while winding down: that
        // is when a handler saves its progress.
        let fence = signals.release.child_token();
        // Renewed from the start, so that even moving a message to the poison
        // queue (two calls, each up to settle_timeout) happens under a lease.
        let renewal = Renewal::start(
            Arc::clone(&self.queue),
            Arc::clone(&lease),
            received_at,
            config.visibility_timeout,
            fence.clone(),
        );
        if message.dequeue_count > config.max_dequeue_count {
            // A previous worker died (or was evicted) mid-job too often.
            let reason = format!(
                "received {} times, more than max_dequeue_count {}, without a recorded outcome",
                message.dequeue_count, config.max_dequeue_count
            );
            self.poison_message(&message, &lease, renewal, &job_token, reason)
                .await;
            return;
        }
        let body = match config.encoding.decode(&message.body) {
            Ok(body) => body,
            Err(error) => {
                self.poison_message(&message, &lease, renewal, &job_token, error.to_string())
                    .await;
                return;
            }
        };
        let outcome = match self.check_completed(&message.id, &lease, &job_token).await {
            PreCheck::Completed => {
                renewal.stop(&job_token).await;
                if lease.is_lost() {
                    bump(&self.counters.leases_lost);
                } else if self.delete(&lease).await {
                    bump(&self.counters.skipped_completed);
                    tracing::info!("already completed on an earlier delivery; deleted");
                }
                return;
            }
            PreCheck::Interrupted => Outcome::Cancelled,
            PreCheck::Failed(error) => {
                Outcome::Finished(Err(format!("reading the checkpoint failed: {error}").into()))
            }
            PreCheck::Run => {
                let job = Job {
                    id: message.id.clone(),
                    dequeue_count: message.dequeue_count,
                    inserted_at: message.inserted_at,
                    body,
                    cancelled: job_token.clone(),
                    fence,
                    deadline: signals.deadline.subscribe(),
                    checkpoints: self.checkpoints.clone(),
                };
                // A panic is one more failed attempt: left to unwind, it would
                // end this task without settling, and a crash-looping message
                // would never reach the poison queue. Nothing the handler
                // shares with the consumer is left half-updated by it.
                let handle = AssertUnwindSafe(async { handler.handle(job).await }).catch_unwind();
                tokio::pin!(handle);
                // The handler comes first so a result that is ready is kept
                // even if a release arrived at the same moment. Winding down
                // only cancels its token: it still gets to save progress.
                tokio::select! {
                    biased;
                    result = &mut handle => {
                        Outcome::Finished(result.unwrap_or_else(|panic| Err(panic_error(panic.as_ref()))))
                    }
                    () = signals.release.cancelled() => Outcome::Cancelled,
                    () = lease.lost() => {
                        job_token.cancel();
                        Outcome::Cancelled
                    }
                }
            }
        };
        let settlement = match outcome {
            Outcome::Finished(Ok(())) => Settlement::Delete,
            // A handler that gave up because of shutdown did not fail on its
            // own: hand the message to another worker now, and don't let this
            // attempt push it towards the poison queue.
            Outcome::Cancelled | Outcome::Finished(Err(_)) if job_token.is_cancelled() => {
                Settlement::Release
            }
            Outcome::Finished(Err(error)) if is_fenced_out(error.as_ref()) => {
                Settlement::Abandon(error)
            }
            Outcome::Finished(Err(error)) if message.dequeue_count >= config.max_dequeue_count => {
                Settlement::Poison(error)
            }
            Outcome::Finished(Err(error)) => Settlement::Retry(error),
            Outcome::Cancelled => Settlement::Unexplained,
        };
        if let Settlement::Poison(error) = settlement {
            self.poison_message(&message, &lease, renewal, &job_token, error.to_string())
                .await;
            return;
        }
        renewal.stop(&job_token).await;
        if lease.is_lost() {
            bump(&self.counters.leases_lost);
            tracing::warn!(
                "lease lost; the message belongs to another consumer now, nothing written"
            );
            return;
        }
        match settlement {
            Settlement::Delete => {
                if self.delete(&lease).await {
                    bump(&self.counters.succeeded);
                    tracing::debug!("handled and deleted");
                }
            }
            Settlement::Release => {
                if self.make_visible_after(&lease, Duration::ZERO).await {
                    bump(&self.counters.released);
                    tracing::info!("released on shutdown");
                }
            }
            // Another worker wrote newer progress for this job: it owns the job
            // now. Stop without touching the message; if it is still ours it
            // reappears after its lease and resumes from the newer checkpoint.
            Settlement::Abandon(error) => {
                bump(&self.counters.abandoned);
                tracing::warn!(%error, "checkpoint fenced out by another worker; abandoning this delivery");
            }
            Settlement::Retry(error) => {
                let delay = retry_delay(
                    config.retry_backoff_base,
                    config.retry_backoff_max,
                    message.dequeue_count,
                );
                tracing::warn!(%error, retry_in = ?delay, "handler failed; will retry");
                if self.make_visible_after(&lease, delay).await {
                    bump(&self.counters.retried);
                }
            }
            // Taken care of before the renewal was stopped.
            Settlement::Poison(_) => {}
            Settlement::Unexplained => {
                // Only shutdown or a lost lease cancel a job; both were handled above.
                tracing::error!(
                    "job cancelled for no known reason; leaving it to its visibility timeout"
                );
            }
        }
    }

    /// Whether a completed checkpoint makes the handler unnecessary.
    ///
    /// A checkpoint store that is unavailable (a transient error, or
    /// `NotFound` while its container is missing) never pushes a message
    /// towards the poison queue: the read is retried with the retry backoff
    /// while the message stays leased. Making the message visible again
    /// instead would not help, because every redelivery raises its dequeue
    /// count and a long outage would then poison it on a later delivery
    /// anyway. The slot stays taken meanwhile, so the consumer stops
    /// receiving work it could not start. Other errors (the store refuses
    /// the request, or the checkpoint does not parse) will not go away by
    /// waiting and count as a failed attempt.
    async fn check_completed(
        &self,
        id: &MessageId,
        lease: &Lease,
        job_token: &CancellationToken,
    ) -> PreCheck {
        let Some(store) = &self.checkpoints else {
            return PreCheck::Run;
        };
        let mut attempt = 0u32;
        loop {
            let read = tokio::select! {
                biased;
                () = lease.lost() => return PreCheck::Interrupted,
                () = job_token.cancelled() => return PreCheck::Interrupted,
                read = store.read(id.as_str()) => read,
            };
            let error = match read {
                Ok(Some((checkpoint, _))) if checkpoint.is_completed() => {
                    return PreCheck::Completed;
                }
                Ok(_) => return PreCheck::Run,
                Err(error)
                    if error.is_transient() || matches!(error, StorageError::NotFound { .. }) =>
                {
                    error
                }
                Err(error) => return PreCheck::Failed(error),
            };
            attempt = attempt.saturating_add(1);
            let delay = retry_delay(
                self.config.retry_backoff_base,
                self.config.retry_backoff_max,
                attempt,
            );
            tracing::warn!(%error, retry_in = ?delay, "reading the checkpoint failed; keeping the message leased and retrying (this does not count towards the poison queue)");
            tokio::select! {
                biased;
                () = lease.lost() => return PreCheck::Interrupted,
                () = job_token.cancelled() => return PreCheck::Interrupted,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Runs one settle call under its own deadline; false if it failed.
    async fn settle<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Option<T> {
        match tokio::time::timeout(self.config.settle_timeout, call).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(StorageError::LeaseLost { .. })) => {
                bump(&self.counters.leases_lost);
                tracing::warn!(
                    what,
                    "lease lost before settling; another consumer has the message"
                );
                None
            }
            Ok(Err(error)) => {
                bump(&self.counters.settle_failures);
                tracing::warn!(what, %error, "settling failed; the message reappears after its visibility timeout");
                None
            }
            Err(_) => {
                bump(&self.counters.settle_failures);
                tracing::warn!(
                    what,
                    "settling timed out; the message reappears after its visibility timeout"
                );
                None
            }
        }
    }

    async fn delete(&self, lease: &Lease) -> bool {
        let receipt = lease.receipt().await;
        self.settle("delete", self.queue.delete(&lease.id, &receipt))
            .await
            .is_some()
    }

    async fn make_visible_after(&self, lease: &Lease, delay: Duration) -> bool {
        let receipt = lease.receipt().await;
        self.settle(
            "update visibility",
            self.queue.update_visibility(&lease.id, &receipt, delay),
        )
        .await
        .is_some()
    }

    /// Copies the message and its history to the poison queue, then deletes
    /// the original, renewing the lease until the copy is made. If the copy
    /// fails the original stays (it reappears and is poisoned again later),
    /// so nothing is lost; if the delete fails the poison queue may hold a
    /// duplicate.
    async fn poison_message(
        &self,
        message: &QueueMessage,
        lease: &Lease,
        renewal: Renewal,
        hurry: &CancellationToken,
        last_error: String,
    ) {
        let sent = if lease.is_lost() {
            None
        } else {
            self.send_to_poison(message, last_error).await
        };
        renewal.stop(hurry).await;
        if lease.is_lost() {
            bump(&self.counters.leases_lost);
            tracing::warn!(
                copied = sent.is_some(),
                "lease lost while moving the message to the poison queue; another consumer has it"
            );
            return;
        }
        let Some(last_error) = sent else { return };
        if self.delete(lease).await {
            bump(&self.counters.poisoned);
            tracing::warn!(poison_queue = self.poison.name(), %last_error, "moved to the poison queue");
        }
    }

    /// Sends the poison record for `message`; the `last_error` it kept, or
    /// `None` if it was not sent.
    async fn send_to_poison(&self, message: &QueueMessage, last_error: String) -> Option<String> {
        let record = PoisonRecord {
            queue: self.queue.name().to_owned(),
            original_id: message.id.to_string(),
            dequeue_count: message.dequeue_count,
            inserted_at: message.inserted_at,
            poisoned_at: OffsetDateTime::now_utc(),
            last_error,
            last_error_truncated: false,
            body: message.body.clone(),
            body_truncated: false,
        };
        let (record, text) =
            match record.encode_within(self.config.encoding, MAX_POISON_MESSAGE_LEN) {
                Ok(encoded) => encoded,
                Err(error) => {
                    bump(&self.counters.settle_failures);
                    tracing::error!(%error, "could not build the poison record");
                    return None;
                }
            };
        self.settle(
            "send to poison queue",
            self.poison.send(&text, Duration::ZERO),
        )
        .await
        .map(|_| record.last_error)
    }

    /// Makes messages visible again that were received but never started.
    async fn release_unstarted(&self, messages: Vec<QueueMessage>) {
        for message in messages {
            let lease = Lease::new(message.id, message.pop_receipt);
            if self.make_visible_after(&lease, Duration::ZERO).await {
                bump(&self.counters.released);
            }
        }
    }
}

/// Largest poison message text: the service takes 64 KiB per message,
/// including XML escaping, so leave room for it.
const MAX_POISON_MESSAGE_LEN: usize = 48 * 1024;

/// True if the handler failed because its checkpoint writes were fenced off
/// (a [`StorageError::Conflict`] or [`StorageError::JobCancelled`]), found
/// anywhere in the error's source chain.
fn is_fenced_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(StorageError::Conflict { .. } | StorageError::JobCancelled { .. }) =
            e.downcast_ref::<StorageError>()
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// The failure a panicking handler counts as.
fn panic_error(payload: &(dyn Any + Send)) -> HandlerError {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not text");
    format!("handler panicked: {message}").into()
}

fn log_join_error(result: Result<(), tokio::task::JoinError>) {
    if let Err(error) = result {
        tracing::error!(%error, "message task panicked or was aborted");
    }
}
