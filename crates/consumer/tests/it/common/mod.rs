//! Helpers the consumer tests share: a consumer running in the background,
//! waits on tokio's paused clock, and the queues every test starts from.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use spot_worker_consumer::{
    Consumer, ConsumerConfig, ConsumerStats, HandlerError, Job, MessageHandler, handler_fn,
};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, InMemoryQueue, MessageQueue, WritePrecondition,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Just above the 5 s minimum: renewed every 3 s.
pub const VISIBILITY: Duration = Duration::from_secs(6);

pub fn config() -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 4,
        max_in_flight: 4,
        visibility_timeout: VISIBILITY,
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        retry_backoff_base: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(4),
        max_failures: 3,
        max_deliveries: 10,
        ..ConsumerConfig::default()
    }
}

pub struct Running {
    pub consumer: Consumer,
    shutdown: CancellationToken,
    task: JoinHandle<ConsumerStats>,
}

impl Running {
    pub fn start(consumer: Consumer, handler: impl spot_worker_consumer::MessageHandler) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let consumer = consumer.clone();
            let shutdown = shutdown.clone();
            async move { consumer.run(handler, shutdown).await }
        });
        Running {
            consumer,
            shutdown,
            task,
        }
    }

    pub async fn wait_for(&self, what: &str, done: impl Fn(ConsumerStats) -> bool) {
        wait_until(what, || done(self.consumer.stats())).await;
    }

    /// Ends the consumer as a killed process would: its task and every
    /// delivery in it dropped, nothing settled.
    pub fn abort(self) {
        self.task.abort();
    }

    /// A consumer of `queue` as [`config`] has it, with `store` for its
    /// checkpoints, started with `handler`.
    pub fn with_store(
        queue: &InMemoryQueue,
        poison: &InMemoryQueue,
        store: &(impl CheckpointStore + Clone + 'static),
        handler: impl MessageHandler,
    ) -> Self {
        let consumer = consumer(queue, poison, config()).with_checkpoints(Arc::new(store.clone()));
        Self::start(consumer, handler)
    }

    pub async fn stop(self) -> ConsumerStats {
        self.shutdown.cancel();
        stopped(self.task).await
    }
}

/// The statistics of a consumer's task once it has stopped, within a
/// minute of the (paused) clock.
pub async fn stopped(task: JoinHandle<ConsumerStats>) -> ConsumerStats {
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the consumer stops in time")
        .expect("consumer task")
}

/// Writes `key`'s checkpoint as completed with `result`, as an earlier
/// delivery (or a peer) that finished the job left it.
pub async fn write_completed(store: &impl CheckpointStore, key: &str, result: serde_json::Value) {
    store
        .write(
            key,
            &Checkpoint::Completed { result },
            WritePrecondition::Create,
            None,
        )
        .await
        .expect("the completed checkpoint is written");
}

/// Cases per property in CI.
const CI_CASES: u32 = 10_000;

/// Proptest's configuration with at least [`CI_CASES`] cases a property
/// (`PROPTEST_CASES` raises it for a long run) and no failure files.
pub fn proptest_config() -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::default();
    config.cases = config.cases.max(CI_CASES);
    config.failure_persistence = None;
    config
}

/// Polls `done` on the (paused) tokio clock for at most two simulated minutes.
pub async fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Polls `done` every 10 ms of the paused clock; fails after `limit`.
pub async fn wait_within(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handler closure handed its own copy of `state` (counters, flags, a
/// store the test also holds) for every job: the clone per call that a
/// `handler_fn` sharing state with its test needs, written once.
pub fn handler_with<S, F, Fut>(state: S, handle: F) -> impl MessageHandler
where
    S: Clone + Send + Sync + 'static,
    F: Fn(S, Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    handler_fn(move |job: Job| handle(state.clone(), job))
}

/// Sets its flag when dropped: shows that a handler future was dropped.
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub fn queues() -> (InMemoryQueue, InMemoryQueue) {
    (
        InMemoryQueue::new("jobs"),
        InMemoryQueue::new("jobs-poison"),
    )
}

pub fn consumer(queue: &InMemoryQueue, poison: &InMemoryQueue, config: ConsumerConfig) -> Consumer {
    Consumer::new(Arc::new(queue.clone()), Arc::new(poison.clone()), config).expect("valid config")
}

/// A handler whose messages name their job, `{"job": "<key>"}` (a key a
/// duplicate message may share, so even a first delivery is checked for
/// completion); it counts its runs and succeeds.
pub struct KeyedJobs {
    pub runs: Arc<AtomicU32>,
}

impl MessageHandler for KeyedJobs {
    async fn handle(&self, _job: Job) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(value["job"].as_str()?.to_owned())
    }
}

/// A consumer of any queue and poison queue (a faulty or logging wrapper of
/// the in-memory ones), with `config`.
pub fn consumer_of(
    queue: impl MessageQueue + 'static,
    poison: impl MessageQueue + 'static,
    config: ConsumerConfig,
) -> Consumer {
    Consumer::new(Arc::new(queue), Arc::new(poison), config).expect("valid config")
}

/// [`queues`], the work queue holding one message, `body`.
pub async fn queues_holding(body: &str) -> (InMemoryQueue, InMemoryQueue) {
    let (queue, poison) = queues();
    queue
        .send(body, Duration::ZERO)
        .await
        .expect("the message is sent");
    (queue, poison)
}

/// A handler that works for `how_long` and succeeds, whatever the job.
pub fn sleeps_then_succeeds(how_long: Duration) -> impl MessageHandler {
    handler_fn(move |_job: Job| async move {
        tokio::time::sleep(how_long).await;
        Ok::<(), HandlerError>(())
    })
}

/// Fails naming the text unless it starts with `prefix`.
#[track_caller]
pub fn assert_starts_with(text: &str, prefix: &str) {
    assert!(
        text.starts_with(prefix),
        "{text:?} does not start with {prefix:?}"
    );
}

/// Fails naming the text unless it ends with `suffix`.
#[track_caller]
pub fn assert_ends_with(text: &str, suffix: &str) {
    assert!(
        text.ends_with(suffix),
        "{text:?} does not end with {suffix:?}"
    );
}
