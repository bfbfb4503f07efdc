//! What the command tests share: a consumer on a fresh Azurite with short
//! retries, a handler wrapper that reports each finished delivery, and
//! bounded waits on what the store shows.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_consumer::{
    CompletionRecord, Consumer, ConsumerConfig, ConsumerStats, HandlerError, Job, MessageHandler,
    PoisonRecord,
};
use spot_worker_storage::{CancellationToken, CheckpointStore};
use spot_worker_testkit::worker::{Env, PATIENCE, within};
use tokio::sync::Notify;

/// A handler that counts finished deliveries and wakes waiters after each.
#[derive(Clone)]
pub struct Observed<H> {
    inner: H,
    finished: Arc<AtomicUsize>,
    wake: Arc<Notify>,
}

impl<H: MessageHandler + Clone> Observed<H> {
    pub fn new(inner: H) -> Self {
        Observed {
            inner,
            finished: Arc::default(),
            wake: Arc::default(),
        }
    }

    /// Waits until `count` deliveries have finished (bounded).
    pub async fn finished(&self, count: usize) {
        let waiting = async {
            loop {
                let notified = self.wake.notified();
                if self.finished.load(Ordering::SeqCst) >= count {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(PATIENCE, waiting)
            .await
            .unwrap_or_else(|_| panic!("{count} deliveries did not finish"));
    }
}

impl<H: MessageHandler> MessageHandler for Observed<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let result = self.inner.handle(job).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_waiters();
        result
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        self.inner.job_key(body)
    }
}

/// A consumer on `env`'s queues with retries 100 ms apart.
pub fn consumer(env: &Env, max_failures: u32) -> Consumer {
    let config = ConsumerConfig {
        max_failures,
        retry_backoff_base: Duration::from_millis(100),
        retry_backoff_max: Duration::from_millis(200),
        idle_backoff_max: Duration::from_millis(200),
        visibility_timeout: Duration::from_secs(10),
        ..ConsumerConfig::default()
    };
    Consumer::new(env.queue.clone(), env.poison.clone(), config)
        .unwrap()
        .with_checkpoints(env.checkpoints.clone())
}

/// `sh -c script`, with results in `env`'s result store.
pub fn shell(env: &Env, script: &str) -> CommandHandler {
    CommandHandler::new(sh(script), env.results.clone())
}

/// The configuration that runs `sh -c script`.
pub fn sh(script: &str) -> CommandConfig {
    CommandConfig::new("sh", ["-c", script]).with_checkpoint_every(Duration::from_millis(50))
}

/// Waits for the first poison record (bounded).
pub async fn poisoned(env: &Env) -> PoisonRecord {
    for _ in 0..1200 {
        let records = env
            .poison
            .receive(1, Duration::from_secs(30))
            .await
            .unwrap();
        if let Some(record) = records.first() {
            return PoisonRecord::from_message_text(&record.body).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing was poisoned");
}

/// Runs `handler` on [`consumer`] (`max_failures`) until the first poison
/// record, which it returns once the consumer stopped: the shape of every
/// test about why a job was poisoned.
pub async fn poisoned_by(
    env: &Env,
    max_failures: u32,
    handler: impl MessageHandler,
) -> PoisonRecord {
    let running = Running::start(consumer(env, max_failures), handler);
    let record = within("the poison record", poisoned(env)).await;
    running.stop().await;
    record
}

/// `record`'s last error holds `text`.
#[track_caller]
pub fn assert_error_has(record: &PoisonRecord, text: &str) {
    assert!(
        record.last_error.contains(text),
        "no {text:?} in the last error: {}",
        record.last_error
    );
}

/// Runs `handler` on one job of `env`'s queue with checkpoints saved to
/// `store` (default consumer settings), until that job succeeded: the
/// set-up of a test about what the saves wrote.
pub async fn one_job_saving_to<H: MessageHandler + Clone>(
    env: &Env,
    handler: &Observed<H>,
    store: Arc<dyn CheckpointStore>,
) {
    let consumer = Consumer::new(
        env.queue.clone(),
        env.poison.clone(),
        ConsumerConfig::default(),
    )
    .unwrap()
    .with_checkpoints(store);
    let running = Running::start(consumer, handler.clone());
    handler.finished(1).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1);
}

/// Waits (30 s at the most) until `path` exists, which says `what` has
/// happened: a program's own sign, the only one a test has of it.
#[track_caller]
pub fn wait_for_file<'a>(path: &'a Path, what: &'a str) -> impl Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        for _ in 0..1200 {
            if path.exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no {} ({what}), waited at {caller}", path.display());
    }
}

/// A fresh environment with `body` queued, and the path `file` in a
/// temporary directory (which lives as long as the directory returned),
/// where a test's program leaves its log or the test its signal.
pub async fn job_queued(body: &str, file: &str) -> (Env, tempfile::TempDir, PathBuf) {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    env.queue.send(body, Duration::ZERO).await.unwrap();
    (env, dir, path)
}

/// The completion record of job `job_id`, once a worker has written it
/// (polled within [`within`]'s bound: the store has no notifications).
pub async fn completion_record(env: &Env, job_id: &str) -> CompletionRecord {
    let key = CompletionRecord::key(job_id);
    let stored = within("the completion record", async {
        loop {
            if let Some(stored) = env.checkpoints.read(&key).await.unwrap() {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    CompletionRecord::from_checkpoint(&stored.checkpoint, &key).unwrap()
}

/// Whether process `pid` exists (a zombie counts: it was not reaped).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The lines of a file the programs append to.
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A shell word for a path.
pub fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

/// A consumer running a handler until stopped.
pub struct Running {
    consumer: Consumer,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<ConsumerStats>,
}

impl Running {
    /// Runs `handler` on `consumer`.
    pub fn start(consumer: Consumer, handler: impl MessageHandler) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            let consumer = consumer.clone();
            async move { consumer.run(handler, stop).await }
        });
        Running {
            consumer,
            stop,
            task,
        }
    }

    /// Stops the consumer once its counts satisfy `settled` (bounded): a
    /// handler that returned has not settled its message yet, and stopping
    /// in between would hand the message back instead of deleting it.
    pub async fn stop_when(self, settled: impl Fn(&ConsumerStats) -> bool) -> ConsumerStats {
        let waiting = async {
            while !settled(&self.consumer.stats()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, waiting)
            .await
            .unwrap_or_else(|_| panic!("not settled: {:?}", self.consumer.stats()));
        self.stop().await
    }

    /// Stops the consumer and returns its counts (bounded).
    pub async fn stop(self) -> ConsumerStats {
        self.stop.cancel();
        within("the consumer", self.task).await.unwrap()
    }
}

/// A log written as text, for a subscriber's writer.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs the process's log subscriber (info and up, as text) into a
    /// new capture: once per test binary.
    pub fn install() -> Self {
        Self::install_from(tracing::Level::INFO)
    }

    /// [`Captured::install`], from `level` up.
    pub fn install_from(level: tracing::Level) -> Self {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .init();
        captured
    }

    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The lines of the command's runner and the checkpoint store (what a
    /// failed test about the runner's saves shows), one string.
    pub fn runners_log(&self) -> String {
        self.lines()
            .into_iter()
            .filter(|line| {
                line.contains("spot_worker_command") || line.contains("spot_worker_storage")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Fails clearly unless the file system of the runner's delivery
/// directories (the system's temporary directory) records birth times
/// (statx btime), which measuring a program's checkpoint writes needs.
pub fn assert_birth_times_recorded() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let meta = std::fs::metadata(file.path()).unwrap();
    assert!(
        meta.created().is_ok(),
        "the file system of {} records no birth times (statx btime): a program's \
         checkpoint writes cannot be measured there; run this test with TMPDIR on one that does",
        std::env::temp_dir().display()
    );
}

/// A Python program in two steps: progress `first` with the checkpoint
/// "first"; then, once the file `step` exists, progress `second` with the
/// checkpoint "second"; then the Python lines `then`. Every file written
/// beside and renamed into place, as the contract asks; each wait bounded
/// (120 s, then exit 3).
pub fn two_step_program(first: &str, step: &Path, second: &str, then: &str) -> String {
    format!(
        r#"
import os, sys, time
def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)
def wait(path):
    for _ in range(2400):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit(3)
progress, checkpoint = os.environ["SPOT_WORKER_PROGRESS"], os.environ["SPOT_WORKER_CHECKPOINT"]
put(progress, {first:?})
put(checkpoint, "first")
wait({step:?})
put(progress, {second:?})
put(checkpoint, "second")
{then}
"#,
        step = step.display().to_string(),
    )
}

/// A shell program whose checkpoint directory never holds still until the
/// file `still` exists: 8 MiB of ballast makes every read of the directory
/// (chunked and hashed) take far longer than the program takes to rewrite
/// `state` again (at most 200,000 rewrites).
pub fn restless_script(still: &Path) -> String {
    format!(
        r#"
cd "$SPOT_WORKER_CHECKPOINT_DIR"
head -c 8388608 /dev/zero > ballast
i=0
while [ ! -e {still} ] && [ $i -lt 200000 ]; do
  i=$((i + 1))
  echo $i > state
done
"#,
        still = quoted(still)
    )
}
