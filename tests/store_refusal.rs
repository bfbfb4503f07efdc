//! A checkpoint store that refuses the worker, or whose container was
//! deleted, on a real Azurite: the worker turns not ready with the reason,
//! stops receiving (the backlog is not churned), counts and records
//! nothing, logs one error line, and resumes by itself when the store
//! answers again; a deleted container is created again where the role
//! allows it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::json;
use spot_worker::Worker;
use spot_worker::azure::{
    AccountSasScope, AzureQueue, AzureStorage, StorageConfig, sign_account_sas,
};
use spot_worker::runtime::{Gate, Readiness, WorkerConfig};
use spot_worker::runtime::{RunReport, WorkerError};
use spot_worker::storage::{
    Checkpoint, CheckpointStore, ETag, HandlerError, Job, StorageError, StoredCheckpoint,
    WritePrecondition, async_trait, handler_fn,
};
use spot_worker_testkit::faulty::FaultyQueue;
use spot_worker_testkit::worker::{Env, VM_A, get, within};
use spot_worker_testkit::{ACCOUNT_KEY, ACCOUNT_NAME};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;

/// Short, so a refusal persists within a test.
const GRACE: Duration = Duration::from_secs(2);

/// A checkpoint store that a test switches between the worker's real one
/// and another (one whose SAS may not write, or not create containers):
/// a role assignment changed while the worker runs.
struct Switched {
    usual: Arc<dyn CheckpointStore>,
    other: Arc<dyn CheckpointStore>,
    use_other: AtomicBool,
}

impl Switched {
    fn current(&self) -> &Arc<dyn CheckpointStore> {
        if self.use_other.load(Ordering::SeqCst) {
            &self.other
        } else {
            &self.usual
        }
    }
}

#[async_trait]
impl CheckpointStore for Switched {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.current().prepare().await
    }
    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.current().read(key).await
    }
    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.current()
            .write(key, checkpoint, precondition, stamp)
            .await
    }
    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.current().delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.current().list(prefix).await
    }
}

/// Error-level log lines, by the `queue` field they carry (tests in this
/// file run at once; each has its own queue).
#[derive(Clone, Default)]
struct ErrorLines(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

impl ErrorLines {
    fn of(&self, queue: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .get(queue)
            .cloned()
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Fields {
    queue: String,
    message: String,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "queue" => self.queue = value.to_owned(),
            "message" => self.message = value.to_owned(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "queue" => self.queue = format!("{value:?}").trim_matches('"').to_owned(),
            "message" => self.message = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .entry(fields.queue)
            .or_default()
            .push(fields.message);
    }
}

/// The error lines of this test binary (installed before `Env::start`,
/// whose own subscriber then stays out of the way).
fn error_lines() -> ErrorLines {
    static LINES: OnceLock<ErrorLines> = OnceLock::new();
    LINES
        .get_or_init(|| {
            let lines = ErrorLines::default();
            let subscriber = tracing_subscriber::registry()
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_test_writer()
                        .with_filter(tracing_subscriber::EnvFilter::new("warn")),
                )
                .with(lines.clone());
            tracing::subscriber::set_global_default(subscriber).unwrap();
            lines
        })
        .clone()
}

use tracing_subscriber::Layer as _;

/// The same Azurite account with a SAS of `permissions` on `resource_types`.
fn storage_with(
    env: &Env,
    resource_types: &'static str,
    permissions: &'static str,
) -> AzureStorage {
    let mut config = StorageConfig::from_connection_string(&env.azurite.connection_string())
        .expect("valid connection string");
    config.sas_scope = AccountSasScope {
        services: "bq",
        resource_types,
        permissions,
        https_only: false,
    };
    config.retry.max_retries = 1;
    AzureStorage::new(config).expect("storage client")
}

/// A handler that saves a checkpoint, then counts its message as handled.
fn saving_handler(
    handled: watch::Sender<HashSet<String>>,
) -> impl spot_worker::storage::MessageHandler {
    let handled = Arc::new(handled);
    handler_fn(move |job: Job| {
        let handled = Arc::clone(&handled);
        async move {
            let mut checkpoint = job.checkpoint().await?;
            checkpoint.save_progress(json!({"step": 1})).await?;
            let text = job.text()?.to_owned();
            handled.send_modify(|set| {
                set.insert(text);
            });
            Ok::<(), HandlerError>(())
        }
    })
}

async fn handled_count(handled: &mut watch::Receiver<HashSet<String>>, count: usize) {
    within(&format!("{count} messages handled"), async {
        handled.wait_for(|set| set.len() >= count).await.unwrap();
    })
    .await;
}

async fn enqueue(env: &Env, prefix: &str, count: usize) {
    for i in 0..count {
        env.queue
            .send(&format!("{prefix}-{i}"), Duration::ZERO)
            .await
            .unwrap();
    }
}

fn config(env: &Env) -> WorkerConfig {
    let mut config = env.config(VM_A);
    config.imds.enabled = false;
    config.storage_refusal_grace = GRACE;
    config
}

async fn storage_gate(
    readiness: &mut watch::Receiver<Readiness>,
    what: &str,
    test: impl Fn(&Gate) -> bool,
) -> Readiness {
    within(what, async {
        readiness
            .wait_for(|r| test(&r.storage))
            .await
            .unwrap()
            .clone()
    })
    .await
}

fn waiting_with(gate: &Gate, text: &str) -> bool {
    matches!(gate, Gate::Waiting(detail) if detail.contains(text))
}

/// The checkpoint container's blobs under `.spot-worker/attempts/`.
async fn attempt_records(env: &Env) -> Vec<String> {
    let operator = storage_with(env, "sco", "rwdlacup");
    let store = operator
        .checkpoint_store(&config(env).checkpoint_container)
        .unwrap();
    store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|blob| blob.name)
        .filter(|name| name.starts_with(".spot-worker/attempts/"))
        .collect()
}

/// Dequeue counts of the visible messages, by id.
async fn dequeue_counts(env: &Env) -> BTreeMap<String, u32> {
    let queue = storage_with(env, "sco", "rwdlacup")
        .queue(&env.queue_name)
        .unwrap();
    queue
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.id.to_string(), m.dequeue_count))
        .collect()
}

/// A worker running [`saving_handler`] on the test's queue (counted
/// through a [`FaultyQueue`]) with a checkpoint store the test switches to
/// `other`'s at will.
struct Running {
    switched: Arc<Switched>,
    queue: Arc<FaultyQueue<AzureQueue>>,
    readyz: String,
    readiness: watch::Receiver<Readiness>,
    handled: watch::Receiver<HashSet<String>>,
    token: CancellationToken,
    task: JoinHandle<Result<RunReport, WorkerError>>,
}

impl Running {
    async fn start(env: &Env, other: &AzureStorage) -> Running {
        let container = config(env).checkpoint_container;
        let switched = Arc::new(Switched {
            usual: env.checkpoints.clone(),
            other: Arc::new(other.checkpoint_store(&container).unwrap()),
            use_other: AtomicBool::new(false),
        });
        let queue = Arc::new(FaultyQueue::new(
            env.storage.queue(&env.queue_name).unwrap(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let readyz = format!("http://{}/readyz", listener.local_addr().unwrap());
        let worker = Worker::new(config(env), queue.clone(), env.poison.clone())
            .with_checkpoints(switched.clone())
            .with_health_listener(listener);
        let readiness = worker.readiness();
        let token = worker.shutdown_token();
        let (handled_tx, handled) = watch::channel(HashSet::new());
        let task = tokio::spawn(worker.run(saving_handler(handled_tx)));
        Running {
            switched,
            queue,
            readyz,
            readiness,
            handled,
            token,
            task,
        }
    }

    fn use_other_store(&self, other: bool) {
        self.switched.use_other.store(other, Ordering::SeqCst);
    }

    async fn handled(&mut self, count: usize) {
        handled_count(&mut self.handled, count).await
    }

    async fn storage_gate(&mut self, what: &str, test: impl Fn(&Gate) -> bool) -> Readiness {
        storage_gate(&mut self.readiness, what, test).await
    }

    /// `/readyz` answers 503 and names `reasons` in the storage gate.
    async fn assert_not_ready_saying(&self, reasons: &[&str]) {
        let (status, body) = get(&self.readyz).await;
        assert_eq!(status, 503, "{body}");
        let detail = body["storage"]["detail"].as_str().unwrap_or_default();
        for reason in reasons {
            assert!(detail.contains(reason), "{reason} not in {body}");
        }
    }

    /// Stops the worker; it handled `succeeded` messages and counted,
    /// retried and poisoned nothing.
    async fn stop_having_handled(self, succeeded: u64) {
        self.token.cancel();
        let report = within("the worker to stop", self.task)
            .await
            .unwrap()
            .unwrap();
        let stats = report.stats;
        assert_eq!(stats.succeeded, succeeded, "{stats:?}");
        assert_eq!(stats.retried, 0, "refusals are not failures: {stats:?}");
        assert_eq!(stats.poisoned, 0, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_writes_pauses_intake_until_it_answers_again() {
    let errors = error_lines();
    let env = Env::start().await;
    // A role that may read blobs and work the queue, but not write blobs.
    let mut worker = Running::start(&env, &storage_with(&env, "co", "rapu")).await;

    // Working at first.
    enqueue(&env, "before", 2).await;
    worker.handled(2).await;
    assert_eq!(get(&worker.readyz).await.0, 200);

    // The role loses its write permission; a backlog arrives.
    worker.use_other_store(true);
    enqueue(&env, "backlog", 8).await;
    let paused = worker
        .storage_gate("not ready for the refusal", |gate| {
            waiting_with(gate, "refuses")
        })
        .await;
    assert!(!paused.is_ready());
    worker.assert_not_ready_saying(&["403"]).await;

    // Paused: over a window in which an idle worker would receive several
    // times (it polls at least every second), it receives at most the one
    // receive already under way when it paused, and the backlog's dequeue
    // counts stay where they are.
    let receives_at_pause = worker.queue.faults().receives().len();
    let counts_at_pause = dequeue_counts(&env).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let receives_while_paused = worker.queue.faults().receives().len() - receives_at_pause;
    assert!(
        receives_while_paused <= 1,
        "{receives_while_paused} receives while paused"
    );
    for (id, count) in &dequeue_counts(&env).await {
        if let Some(before) = counts_at_pause.get(id) {
            assert_eq!(
                count, before,
                "message {id} was received again while paused"
            );
        }
    }
    assert!(!worker.readiness.borrow().is_ready());
    // One error line for the pause (the next is due after a minute).
    let lines = errors.of(&env.queue_name);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("not taking work"), "{lines:#?}");

    // Nothing counted, recorded or poisoned for the refusal.
    assert!(attempt_records(&env).await.is_empty());
    assert!(
        env.poison
            .receive(32, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );

    // The permission comes back: the worker resumes by itself and finishes
    // the backlog.
    worker.use_other_store(false);
    worker
        .storage_gate("ready again", |gate| *gate == Gate::Passed)
        .await;
    worker.handled(10).await;
    assert_eq!(get(&worker.readyz).await.0, 200);
    worker.stop_having_handled(10).await;
    assert!(attempt_records(&env).await.is_empty());
    env.assert_queues_empty().await;
}

/// Deletes a blob container as an operator would (the SDK wrapper of this
/// project never deletes containers).
async fn delete_container(env: &Env, container: &str) {
    let sas = sign_account_sas(
        ACCOUNT_NAME,
        &ACCOUNT_KEY.to_owned().into(),
        &AccountSasScope::OPERATOR.allowing_http(),
        time::OffsetDateTime::now_utc() + time::Duration::hours(1),
    )
    .unwrap();
    let url = format!(
        "{}/{container}?restype=container&{}",
        env.azurite.blob_endpoint(),
        sas.secret()
    );
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .delete(url)
        .header("x-ms-version", "2021-08-06")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        202,
        "{:?}",
        response.text().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_checkpoint_container_is_created_again_and_work_goes_on() {
    let _ = error_lines();
    let env = Env::start().await;
    let container = config(&env).checkpoint_container;
    // The worker's own role throughout: it may create containers.
    let mut worker = Running::start(&env, &env.storage).await;
    enqueue(&env, "before", 2).await;
    worker.handled(2).await;

    delete_container(&env, &container).await;
    enqueue(&env, "after", 4).await;
    // Not ready while it is missing, with the reason, until re-created.
    worker
        .storage_gate("not ready for the missing container", |gate| {
            waiting_with(gate, "ContainerNotFound")
        })
        .await;
    worker
        .storage_gate("ready again", |gate| *gate == Gate::Passed)
        .await;
    worker.handled(6).await;
    worker.stop_having_handled(6).await;
    // Created again (it lists), and left tidy: the jobs' checkpoints, keyed
    // by their message ids, were written there and removed as each job
    // finished (nothing in it but what the worker keeps for itself).
    let operator = storage_with(&env, "sco", "rwdlacup");
    let listed = operator
        .checkpoint_store(&container)
        .unwrap()
        .list()
        .await
        .expect("the checkpoint container exists again");
    assert!(
        listed
            .iter()
            .all(|blob| blob.name.starts_with(".spot-worker/")),
        "{listed:?}"
    );
    env.assert_queues_empty().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_may_not_create_the_container_goes_not_ready_with_the_reason() {
    let _ = error_lines();
    let env = Env::start().await;
    let container = config(&env).checkpoint_container;
    // A role that may work with blobs but not create containers.
    let mut worker = Running::start(&env, &storage_with(&env, "o", "rwdapu")).await;
    enqueue(&env, "before", 1).await;
    worker.handled(1).await;

    worker.use_other_store(true);
    delete_container(&env, &container).await;
    enqueue(&env, "after", 3).await;
    worker
        .storage_gate("not ready for the missing container", |gate| {
            waiting_with(gate, "may not create it")
        })
        .await;
    worker
        .assert_not_ready_saying(&["ContainerNotFound", "403"])
        .await;

    // An operator creates it: the worker resumes by itself.
    storage_with(&env, "sco", "rwdlacup")
        .checkpoint_store(&container)
        .unwrap()
        .create_container_if_missing()
        .await
        .unwrap();
    worker
        .storage_gate("ready again", |gate| *gate == Gate::Passed)
        .await;
    worker.handled(4).await;
    worker.stop_having_handled(4).await;
    env.assert_queues_empty().await;
}
