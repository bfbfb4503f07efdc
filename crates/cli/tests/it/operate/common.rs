//! What every operator test needs: an Azurite, the binary with the
//! worker's environment, a real flaky consumer, bounded waits.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spot_worker_azure::{AzureStorage, BlobCheckpointStore, StorageConfig};
use spot_worker_consumer::{
    Consumer, ConsumerConfig, ConsumerStats, HandlerError, Job, MessageHandler, PoisonRecord,
    handler_fn,
};
use spot_worker_storage::{
    CancellationToken, CheckpointStore as _, MessageEncoding, ResultStore as _,
};
use spot_worker_testkit::Azurite;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

pub const QUEUE: &str = "jobs";
/// Bound on any one command: generous for a slow machine, finite for a bug.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// Bound on any wait for a condition.
pub const WAIT_LIMIT: Duration = Duration::from_secs(90);

pub fn start_azurite() -> Azurite {
    Azurite::start().expect("azurite starts (run `npm ci --prefix tools/azurite`)")
}

/// The test's own client, for preparing and checking what the command did.
pub fn storage(azurite: &Azurite) -> AzureStorage {
    let config = StorageConfig::from_connection_string(&azurite.connection_string())
        .expect("valid connection string");
    AzureStorage::new(config).expect("storage client")
}

/// The test's client, after creating the work queue and its poison queue
/// as the deployment does (`enqueue` never creates a queue).
pub async fn deployed(azurite: &Azurite) -> AzureStorage {
    let storage = storage(azurite);
    for queue in [QUEUE.to_owned(), format!("{QUEUE}-poison")] {
        storage
            .queue(&queue)
            .unwrap()
            .create_if_missing()
            .await
            .unwrap();
    }
    storage
}

/// The binary with the worker's environment contract for `azurite`.
pub fn spot_worker(azurite: &Azurite, encoding: MessageEncoding) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
    command
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .env("SPOT_WORKER_QUEUE", QUEUE)
        .env(
            "SPOT_WORKER_MESSAGE_ENCODING",
            match encoding {
                MessageEncoding::Text => "text",
                MessageEncoding::Base64 => "base64",
            },
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("RUST_LOG")
        .env_remove("SPOT_WORKER_CONFIG")
        .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert_eq!(self.code, Some(0), "stderr: {}", self.stderr);
        self
    }

    /// The command failed with exit code 1 and said `text` on stderr: the
    /// one shape every refusal of the operator's commands has.
    #[track_caller]
    pub fn assert_refused(&self, text: &str) -> &Self {
        assert_eq!(
            self.code,
            Some(1),
            "exit code; stdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self.assert_stderr_has(text)
    }

    /// `text` is in what the command printed.
    #[track_caller]
    pub fn assert_stdout_has(&self, text: &str) -> &Self {
        assert_printed("stdout", &self.stdout, text);
        self
    }

    /// `text` is in what the command said on stderr.
    #[track_caller]
    pub fn assert_stderr_has(&self, text: &str) -> &Self {
        assert_printed("stderr", &self.stderr, text);
        self
    }

    /// The last word printed: what `enqueue` ends its report with, the
    /// id of the message it sent.
    pub fn message_id(&self) -> String {
        self.stdout
            .split_whitespace()
            .last()
            .expect("the message id")
            .to_owned()
    }
}

/// `text` is in `printed`, the command's `stream`.
#[track_caller]
fn assert_printed(stream: &str, printed: &str, text: &str) {
    assert!(
        printed.contains(text),
        "no {text:?} in {stream}:\n{printed}"
    );
}

pub async fn run(command: &mut Command) -> Output {
    run_with_stdin(command, None).await
}

pub async fn run_with_stdin(command: &mut Command, stdin: Option<&[u8]>) -> Output {
    let run = async {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("the binary runs");
        if let Some(bytes) = stdin {
            let mut pipe = child.stdin.take().expect("stdin is piped");
            pipe.write_all(bytes).await.expect("stdin written");
            drop(pipe);
        }
        child.wait_with_output().await.expect("the binary ran")
    };
    let output = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the command finishes in time");
    Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `spot-worker enqueue FLAGS PATH` with the text encoding: what the
/// command said, for the test to judge.
pub async fn enqueue_file(azurite: &Azurite, flags: &[&str], path: &Path) -> Output {
    run(spot_worker(azurite, MessageEncoding::Text)
        .arg("enqueue")
        .args(flags)
        .arg(path))
    .await
}

/// `lines` enqueued from stdin with the text encoding, which must succeed:
/// the set-up of a test about what happens to them next.
pub async fn enqueue_lines(azurite: &Azurite, lines: &[u8]) {
    run_with_stdin(
        spot_worker(azurite, MessageEncoding::Text).args(["enqueue", "-"]),
        Some(lines),
    )
    .await
    .assert_success();
}

/// Starts the worker `command` sets up (`spot-worker run …`) off Azure:
/// no instance metadata, any free health port, its output discarded.
pub fn start_worker(command: &mut Command) -> tokio::process::Child {
    command
        .env("SPOT_WORKER_IMDS", "off")
        .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spot-worker run starts")
}

/// What `status` prints (`cli()` being the `spot-worker` command), once it
/// shows `text` (polled within [`poll_until`]'s bound); `what` names the
/// wait in its failure.
pub async fn status_showing(cli: &impl Fn() -> Command, what: &str, text: &str) -> String {
    poll_until(what, || async {
        let screen = run(cli().arg("status")).await;
        screen.assert_success();
        screen.stdout.contains(text).then_some(screen.stdout)
    })
    .await
}

/// Sends SIGTERM to a worker the test started and waits (bounded) for its
/// exit status: a drained worker exits 0.
pub async fn stop_with_sigterm(worker: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = worker.id().expect("the worker is running") as i32;
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    tokio::time::timeout(PATIENCE, worker.wait())
        .await
        .expect("the worker exits after SIGTERM")
        .expect("waiting for the worker")
}

/// Every message text in `queue`, without receiving any (at most 32).
pub async fn peek_texts(storage: &AzureStorage, queue: &str) -> Vec<String> {
    let mut texts: Vec<String> = storage
        .queue(queue)
        .unwrap()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    texts.sort();
    texts
}

/// A file in a fresh temporary directory, removed with the returned guard.
pub fn input_file(lines: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.jsonl");
    std::fs::write(&path, lines).unwrap();
    (dir, path)
}

/// Polls `check` every 100 ms until it yields `Some`, for at most
/// [`WAIT_LIMIT`].
pub async fn poll_until<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The deployment's checkpoint store (`checkpoints`), its container made.
pub async fn prepared_checkpoints(storage: &AzureStorage) -> BlobCheckpointStore {
    let store = storage.checkpoint_store("checkpoints").unwrap();
    store.prepare().await.unwrap();
    store
}

/// A real consumer of the work queue (poison queue, checkpoints and
/// poison bodies as a worker has them) whose handler fails the first
/// delivery of every message text with `fail: <text>` and succeeds from
/// then on. Runs until `handled` messages succeeded and `poisoned` were
/// poisoned; returns the texts it handled.
pub struct FlakyWorker {
    storage: AzureStorage,
    encoding: MessageEncoding,
    failed_once: Arc<Mutex<HashSet<String>>>,
}

impl FlakyWorker {
    pub async fn new(storage: &AzureStorage, encoding: MessageEncoding) -> Self {
        prepared_checkpoints(storage).await;
        storage
            .result_store("poison")
            .unwrap()
            .prepare()
            .await
            .unwrap();
        FlakyWorker {
            storage: storage.clone(),
            encoding,
            failed_once: Arc::default(),
        }
    }

    pub async fn run_until(&self, succeeded: u64, poisoned: u64) -> Vec<String> {
        let queue = self.storage.queue(QUEUE).unwrap();
        let poison = self.storage.poison_queue(QUEUE).unwrap();
        let config = ConsumerConfig {
            encoding: self.encoding,
            max_failures: 1,
            visibility_timeout: Duration::from_secs(10),
            idle_backoff_floor: Duration::from_millis(50),
            idle_backoff_max: Duration::from_millis(300),
            ..ConsumerConfig::default()
        };
        let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config)
            .unwrap()
            .with_checkpoints(Arc::new(
                self.storage.checkpoint_store("checkpoints").unwrap(),
            ))
            .with_poison_bodies(Arc::new(self.storage.result_store("poison").unwrap()));
        let handled = Arc::new(Mutex::new(Vec::new()));
        let handler = handler_fn({
            let (handled, failed_once) = (handled.clone(), self.failed_once.clone());
            move |job: Job| {
                let (handled, failed_once) = (handled.clone(), failed_once.clone());
                async move {
                    let text = job.text()?.to_owned();
                    if failed_once.lock().unwrap().insert(text.clone()) {
                        let head: String = text.chars().take(40).collect();
                        return Err::<(), HandlerError>(format!("fail: {head}").into());
                    }
                    handled.lock().unwrap().push(text);
                    Ok(())
                }
            }
        });
        run_consumer_until(
            &consumer,
            handler,
            "the consumer to settle every message",
            |stats| stats.succeeded >= succeeded && stats.poisoned >= poisoned,
        )
        .await;
        let stats = consumer.stats();
        assert_eq!((stats.succeeded, stats.poisoned), (succeeded, poisoned));
        let mut handled = handled.lock().unwrap().clone();
        handled.sort();
        handled
    }
}

/// Runs `consumer` with `handler` until its statistics satisfy `done`
/// (polled within [`poll_until`]'s bound; `what` names the wait), then
/// stops it and waits for it to stop.
pub async fn run_consumer_until<H: MessageHandler + 'static>(
    consumer: &Consumer,
    handler: H,
    what: &str,
    done: impl Fn(&ConsumerStats) -> bool,
) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
        async move { consumer.run(handler, shutdown).await }
    });
    poll_until(what, || {
        let reached = done(&consumer.stats());
        async move { reached.then_some(()) }
    })
    .await;
    shutdown.cancel();
    task.await.unwrap();
}

/// The records in the poison queue, by peeking.
pub async fn poison_records(storage: &AzureStorage) -> Vec<(String, PoisonRecord)> {
    storage
        .poison_queue(QUEUE)
        .unwrap()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let record = PoisonRecord::from_message_text(&m.body).unwrap();
            (m.id.as_str().to_owned(), record)
        })
        .collect()
}

/// The binary with `args` and [`spot_worker`]'s environment, its stdout a
/// terminal (util-linux `script` gives it a pseudo-terminal and copies
/// what it writes, line ends as the terminal sends them: `\r\n`).
pub async fn run_on_a_terminal(
    azurite: &Azurite,
    encoding: MessageEncoding,
    args: &[&str],
) -> Output {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_spot-worker"))
        .chain(args.iter().copied())
        .map(|arg| format!("'{}'", arg.replace('\'', r"'\''")))
        .collect();
    let binary = spot_worker(azurite, encoding);
    let mut command = Command::new("script");
    command
        .args([
            "--quiet",
            "--return",
            "--command",
            &quoted.join(" "),
            "/dev/null",
        ])
        .env("SHELL", "/bin/sh");
    for (name, value) in binary.as_std().get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.stdin(Stdio::null()).kill_on_drop(true);
    run(&mut command).await
}
