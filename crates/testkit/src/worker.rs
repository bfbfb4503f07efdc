//! In-process workers for the end-to-end worker tests (`tests/worker*`): a
//! fresh Azurite and IMDS emulator per test, workers configured for a test
//! process (no watchdog, no signal handlers, short polls), the primes job
//! with a progress log, and bounded waits.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Azurite;
use serde_json::Value;
use spot_worker::azure::{AzureStorage, RetryConfig, StorageConfig};
use spot_worker::runtime::{Worker, WorkerConfig};
use spot_worker::storage::{
    CheckpointStore, HandlerError, Job, MessageHandler, MessageQueue, ResultStore, handler_fn,
    poison_queue_name,
};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use spot_worker_primes::{PrimesConfig, PrimesJob, Progress};
use tokio::sync::Notify;

/// The VM the emulator serves.
pub const VM_A: &str = "spotvmss_0";
/// Another VM of the same scale set, with an emulator of its own.
pub const VM_B: &str = "spotvmss_1";
/// Bound on every wait: generous for a slow machine, finite for a bug.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Awaits `future`, panicking with `what` after [`PATIENCE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {PATIENCE:?} waiting for {what}"),
    }
}

/// One test's world: Azurite, the two VMs' emulators, and the worker's
/// queue, poison queue, checkpoint and result stores on a fresh queue name.
pub struct Env {
    /// The storage emulator.
    pub azurite: Azurite,
    /// The Azure backends on it, with short retries.
    pub storage: AzureStorage,
    /// IMDS as VM_A sees it.
    pub emulator: RunningEmulator,
    /// IMDS as VM_B sees it (each VM has its own instance metadata).
    pub peer_emulator: RunningEmulator,
    /// The work queue's name (unique per test).
    pub queue_name: String,
    /// The work queue.
    pub queue: Arc<dyn MessageQueue>,
    /// Its poison queue.
    pub poison: Arc<dyn MessageQueue>,
    /// The checkpoint store.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// The primes job's result store.
    pub results: Arc<dyn ResultStore>,
    checkpoint_container: String,
}

impl Env {
    /// Starts Azurite and both emulators and creates the queues and
    /// containers; logs go to the test's output (`RUST_LOG`, default warn).
    pub async fn start() -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await
            .unwrap()
            .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
        let mut config = StorageConfig::from_connection_string(&azurite.connection_string())
            .expect("valid connection string");
        config.retry = RetryConfig {
            max_retries: 2,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            max_elapsed: Duration::from_secs(3),
        };
        let storage = AzureStorage::new(config).expect("storage client");
        let emulator = Emulator::start(EmulatorConfig::for_vm(VM_A))
            .await
            .expect("the emulator starts");
        let peer_emulator = Emulator::start(EmulatorConfig::for_vm(VM_B))
            .await
            .expect("the emulator starts");
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let queue_name = format!("jobs-{suffix}");
        let checkpoint_container = format!("checkpoints-{suffix}");
        let queue: Arc<dyn MessageQueue> = Arc::new(storage.queue(&queue_name).unwrap());
        let poison: Arc<dyn MessageQueue> =
            Arc::new(storage.queue(&poison_queue_name(&queue_name)).unwrap());
        let checkpoints: Arc<dyn CheckpointStore> =
            Arc::new(storage.checkpoint_store(&checkpoint_container).unwrap());
        let results: Arc<dyn ResultStore> =
            Arc::new(storage.result_store(&format!("results-{suffix}")).unwrap());
        for prepared in [
            queue.prepare().await,
            poison.prepare().await,
            checkpoints.prepare().await,
            results.prepare().await,
        ] {
            prepared.expect("storage prepared");
        }
        Env {
            azurite,
            storage,
            emulator,
            peer_emulator,
            queue_name,
            queue,
            poison,
            checkpoints,
            results,
            checkpoint_container,
        }
    }

    /// A worker configuration for a test process, as VM `vm`.
    pub fn config(&self, vm: &str) -> WorkerConfig {
        let mut config = WorkerConfig {
            queue: self.queue_name.clone(),
            checkpoint_container: self.checkpoint_container.clone(),
            concurrency: 2,
            visibility_timeout: Duration::from_secs(10),
            health_addr: "127.0.0.1:0".parse().unwrap(),
            ..WorkerConfig::default()
        };
        config.imds.endpoint = self.emulator_of(vm).url();
        config.imds.vm_name = Some(vm.to_owned());
        config.imds.poll_interval = Duration::from_millis(250);
        config.drain.watchdog = false;
        config.drain.handle_signals = false;
        config
    }

    /// The environment a worker process (the binary on the host, or in the
    /// image) of VM `vm` reads its settings from: this environment's
    /// storage, queue, checkpoint container and emulator, results in
    /// `results`, health on any free loopback port, and `RUST_LOG=info`.
    pub fn process_env(&self, vm: &str, results: &str) -> Vec<(&'static str, String)> {
        vec![
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                self.azurite.connection_string(),
            ),
            ("SPOT_WORKER_QUEUE", self.queue_name.clone()),
            (
                "SPOT_WORKER_CHECKPOINT_CONTAINER",
                self.checkpoint_container.clone(),
            ),
            ("SPOT_WORKER_RESULTS_CONTAINER", results.to_owned()),
            ("SPOT_WORKER_IMDS_ENDPOINT", self.emulator_of(vm).url()),
            ("SPOT_WORKER_VM_NAME", vm.to_owned()),
            // Not the image's 0.0.0.0:8080: host networking, and parallel
            // workers.
            ("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
    }

    /// The IMDS that VM `vm` sees.
    pub fn emulator_of(&self, vm: &str) -> &RunningEmulator {
        if vm == VM_B {
            &self.peer_emulator
        } else {
            &self.emulator
        }
    }

    /// A worker on this world's queues and stores.
    pub fn worker(&self, config: WorkerConfig) -> Worker {
        Worker::new(config, self.queue.clone(), self.poison.clone())
            .with_checkpoints(self.checkpoints.clone())
    }

    /// A worker whose health endpoint's URL is known before it runs.
    pub async fn worker_with_health(&self, config: WorkerConfig) -> (Worker, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        (self.worker(config).with_health_listener(listener), url)
    }

    /// A worker running the primes job as VM `vm`, with a progress log.
    pub fn primes_worker(&self, vm: &str) -> PrimesWorker<impl MessageHandler + use<>> {
        let progress = ProgressLog::default();
        let config = PrimesConfig {
            chunk_size: std::num::NonZeroU64::new(2_000_000).unwrap(),
            // Resuming is checked chunk by chunk.
            checkpoint_every: Some(Duration::ZERO),
            on_progress: Some(progress.hook()),
        };
        PrimesWorker {
            worker: self.worker(self.config(vm)),
            handler: spot_worker_primes::handler(self.results.clone(), config),
            progress,
        }
    }

    /// Sends `job` to the work queue.
    pub async fn enqueue(&self, job: &PrimesJob) {
        self.queue
            .send(&job.to_message(), Duration::ZERO)
            .await
            .unwrap();
    }

    /// The cursor of a job's checkpoint, if it has one.
    pub async fn checkpoint_cursor(&self, job_id: &str) -> Option<u64> {
        let checkpoint = self.checkpoints.read(job_id).await.unwrap()?.checkpoint;
        let value = serde_json::to_value(&checkpoint).unwrap();
        find_u64(&value, "cursor")
    }

    /// Waits for a job's result blob and returns it as JSON.
    pub async fn result(&self, job_id: &str) -> Value {
        let name = format!("{job_id}.json");
        loop {
            if let Some(bytes) = self.results.get(&name).await.unwrap() {
                return serde_json::from_slice(&bytes).expect("the result is JSON");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Neither the work queue nor the poison queue holds anything.
    pub async fn assert_queues_empty(&self) {
        for queue in [&self.queue, &self.poison] {
            let left = queue.receive(32, Duration::from_secs(1)).await.unwrap();
            assert!(left.is_empty(), "{} still holds {left:?}", queue.name());
        }
    }
}

fn find_u64(value: &Value, key: &str) -> Option<u64> {
    match value {
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| map.values().find_map(|v| find_u64(v, key))),
        _ => None,
    }
}

/// A worker with the primes job and the log of its progress.
pub struct PrimesWorker<H> {
    /// The worker.
    pub worker: Worker,
    /// The primes handler to run it with.
    pub handler: H,
    /// Every progress report of the handler.
    pub progress: ProgressLog,
}

/// Every progress report of the primes job, with a wake-up per report.
#[derive(Clone, Default)]
pub struct ProgressLog {
    seen: Arc<Mutex<Vec<(String, u64)>>>,
    changed: Arc<Notify>,
}

impl ProgressLog {
    fn hook(&self) -> spot_worker_primes::ProgressHook {
        let log = self.clone();
        Arc::new(move |p: &Progress| {
            log.seen.lock().unwrap().push((p.job_id.clone(), p.cursor));
            log.changed.notify_waiters();
        })
    }

    async fn until(&self, done: impl Fn(&[(String, u64)]) -> bool) {
        loop {
            let changed = self.changed.notified();
            if done(&self.seen.lock().unwrap()) {
                return;
            }
            changed.await;
        }
    }

    /// Resolves once `job_id`'s cursor reached `cursor`.
    pub async fn reached(&self, job_id: &str, cursor: u64) {
        self.until(|seen| seen.iter().any(|(j, c)| j == job_id && *c >= cursor))
            .await
    }

    /// Resolves at the first progress report of any job.
    pub async fn any_progress(&self) {
        self.until(|seen| !seen.is_empty()).await
    }

    /// The first cursor reported for `job_id`.
    pub fn first_cursor(&self, job_id: &str) -> Option<u64> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .find(|(j, _)| j == job_id)
            .map(|(_, c)| *c)
    }
}

/// A handler that records that it ran.
#[derive(Clone, Default)]
pub struct Handled {
    happened: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Handled {
    /// A handler that notes it ran and succeeds.
    pub fn handler(&self) -> impl MessageHandler {
        let this = self.clone();
        handler_fn(move |_job: Job| {
            let this = this.clone();
            async move {
                this.happened.store(true, Ordering::SeqCst);
                this.notify.notify_one();
                Ok::<(), HandlerError>(())
            }
        })
    }

    /// Whether the handler ran.
    pub fn happened(&self) -> bool {
        self.happened.load(Ordering::SeqCst)
    }

    /// Resolves when the handler runs (next time).
    pub async fn wait(&self) {
        self.notify.notified().await
    }
}

/// GET `url`, returning the status and the JSON body.
pub async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .expect("the health endpoint answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}
