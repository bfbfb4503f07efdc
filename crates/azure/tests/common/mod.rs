//! Shared setup for the Azurite integration tests: a fresh Azurite per test,
//! clients with short retries (so outages surface in seconds), unique queue
//! and container names, and bounded polling helpers.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::time::{Duration, Instant};

use spot_worker_azure::{
    AzureQueue, AzureStorage, BlobCheckpointStore, RetryConfig, StorageConfig,
};
use spot_worker_consumer::{Consumer, ConsumerStats, MessageHandler, poison_queue_name};
use spot_worker_testkit::Azurite;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound of every wait in these tests: generous, so a slow machine
/// does not fail them, yet bounded.
pub const WAIT_LIMIT: Duration = Duration::from_secs(90);

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub fn start_azurite() -> Azurite {
    init_logs();
    // Tests only talk to loopback; a proxy must never intercept them.
    Azurite::start().expect("azurite starts (run `npm ci --prefix tools/azurite`)")
}

pub fn short_retries() -> RetryConfig {
    RetryConfig {
        max_retries: 2,
        initial_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(500),
        max_elapsed: Duration::from_secs(3),
    }
}

pub fn storage(azurite: &Azurite) -> AzureStorage {
    let mut config = StorageConfig::from_connection_string(&azurite.connection_string())
        .expect("valid connection string");
    config.retry = short_retries();
    AzureStorage::new(config).expect("storage client")
}

/// A fresh Azurite and a worker's client for it, as most tests start.
pub fn azurite_and_storage() -> (Azurite, AzureStorage) {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    (azurite, storage)
}

/// A client with the operator's rights (it may list every blob), short
/// retries as [`storage`].
pub fn operator_storage(azurite: &Azurite) -> AzureStorage {
    let mut config = StorageConfig::from_connection_string(&azurite.connection_string())
        .expect("valid connection string")
        .for_operator();
    config.retry = short_retries();
    AzureStorage::new(config).expect("operator storage client")
}

/// A blob checkpoint store in a new container named after `prefix`.
pub async fn checkpoint_store(storage: &AzureStorage, prefix: &str) -> BlobCheckpointStore {
    let store = storage
        .checkpoint_store(&unique(prefix))
        .expect("a valid container name");
    store
        .create_container_if_missing()
        .await
        .expect("the container is created");
    store
}

/// Runs `consumer` with `handler` in a task until the returned token is
/// cancelled; [`stopped`] collects its statistics.
pub fn run_in_background(
    consumer: &Consumer,
    handler: impl MessageHandler,
) -> (CancellationToken, JoinHandle<ConsumerStats>) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
        async move { consumer.run(handler, shutdown).await }
    });
    (shutdown, task)
}

/// A name unique to this test run: `<prefix>-<12 hex digits>`.
pub fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..12])
}

/// A fresh work queue (created) and its poison queue (created by the
/// consumer on first use), as every consumer test starts.
pub async fn queues(storage: &AzureStorage) -> (AzureQueue, AzureQueue) {
    let name = unique("jobs");
    let queue = storage.queue(&name).unwrap();
    queue.create_if_missing().await.unwrap();
    (queue, storage.queue(&poison_queue_name(&name)).unwrap())
}

/// The statistics of a consumer's task once it has stopped (within
/// [`WAIT_LIMIT`]).
pub async fn stopped(task: JoinHandle<ConsumerStats>) -> ConsumerStats {
    tokio::time::timeout(WAIT_LIMIT, task)
        .await
        .expect("the consumer stops")
        .expect("consumer task")
}

/// Polls `check` every 100 ms until it yields `Some`, for at most `limit`.
pub async fn poll_until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
