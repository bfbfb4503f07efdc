//! The re-executed worker mode of part 4: this binary run again with
//! `--serve-worker QUEUE [SYNTHETIC]` is a worker process whose memory the
//! parent samples, on an Azurite queue or on a synthetic queue of made-up
//! messages; [`WorkerProcess`] is the parent's handle on it.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::runtime::Worker;
use spot_worker::storage::{
    HandlerError, Job, MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError,
    async_trait, handler_fn, poison_queue_name,
};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::PATIENCE;
use crate::setup::{Bench, worker_config};

/// The flag that selects this mode.
pub const FLAG: &str = "--serve-worker";
/// The time each call to the synthetic queue takes.
const SYNTHETIC_LATENCY: Duration = Duration::from_millis(5);
/// How the connection string reaches a child worker (not its command line).
const CONNECTION_ENV: &str = "SPOT_WORKER_BENCH_CONNECTION_STRING";

/// The child mode's entry: `args` are what follows [`FLAG`].
pub async fn serve(args: &[String]) -> Result<()> {
    let queue = args.first().context("a queue after --serve-worker")?;
    let synthetic = match args.get(1) {
        Some(count) => Some(count.parse()?),
        None => None,
    };
    serve_worker(queue, synthetic).await
}

/// Child mode: a worker (concurrency 32, trivial handler) on Azurite queue
/// `queue`, or on a synthetic queue of `synthetic` messages; prints `ready`
/// once its gate is open (then, for a synthetic queue, `left N` every 100 ms
/// until none are), stops when stdin closes.
async fn serve_worker(queue: &str, synthetic: Option<u64>) -> Result<()> {
    let connection = std::env::var(CONNECTION_ENV).context(CONNECTION_ENV)?;
    let storage = AzureStorage::new(StorageConfig::from_connection_string(&connection)?)?;
    let poison = Arc::new(storage.queue(&poison_queue_name(queue))?);
    let worker = match synthetic {
        Some(count) => {
            let synthetic = Arc::new(Synthetic::new(queue, count));
            let progress = Arc::clone(&synthetic);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let left = progress.left();
                    println!("left {left}");
                    if left == 0 {
                        return;
                    }
                }
            });
            Worker::new(worker_config(queue), synthetic, poison)
        }
        None => Worker::new(
            worker_config(queue),
            Arc::new(storage.queue(queue)?),
            poison,
        ),
    };
    let stop = worker.shutdown_token();
    let mut readiness = worker.readiness();
    tokio::spawn(async move {
        if readiness.wait_for(|r| r.is_ready()).await.is_ok() {
            println!("ready");
        }
    });
    tokio::task::spawn_blocking(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        stop.cancel();
    });
    worker
        .run(handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) }))
        .await?;
    Ok(())
}

/// A queue of `total` messages that exist only as a counter: each receive
/// makes up the next ones, each delete counts one as done. Every call takes
/// `SYNTHETIC_LATENCY`, a storage round trip within an Azure region, so the
/// drain runs at a real account's pace rather than Azurite's.
struct Synthetic {
    name: String,
    total: u64,
    next: AtomicU64,
    deleted: AtomicU64,
}

impl Synthetic {
    fn new(name: &str, total: u64) -> Self {
        Synthetic {
            name: name.to_owned(),
            total,
            next: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
        }
    }

    fn left(&self) -> u64 {
        self.total
            .saturating_sub(self.deleted.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl MessageQueue for Synthetic {
    fn name(&self) -> &str {
        &self.name
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        Ok(())
    }

    async fn receive(
        &self,
        max_messages: u8,
        _visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        let first = self
            .next
            .fetch_add(u64::from(max_messages), Ordering::Relaxed);
        let end = (first + u64::from(max_messages)).min(self.total);
        Ok((first.min(end)..end)
            .map(|i| QueueMessage {
                id: MessageId::new(format!("{i:016x}")),
                pop_receipt: PopReceipt::new(format!("receipt-{i}")),
                body: format!("message {i}"),
                dequeue_count: 1,
                inserted_at: None,
            })
            .collect())
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        _pop_receipt: &PopReceipt,
        _visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        Ok(PopReceipt::new(format!("renewed-{id}")))
    }

    async fn delete(&self, _id: &MessageId, _pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        tokio::time::sleep(SYNTHETIC_LATENCY).await;
        self.deleted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn send(&self, _body: &str, _delay: Duration) -> Result<MessageId, StorageError> {
        Err(StorageError::InvalidArgument(
            "the synthetic queue takes no messages".to_owned(),
        ))
    }
}

/// A worker child, killed on drop.
pub struct WorkerProcess {
    child: Child,
    pub pid: u32,
    /// What it prints after `ready`: the latest `left N` of a synthetic
    /// queue.
    pub left: watch::Receiver<Option<u64>>,
}

impl WorkerProcess {
    pub async fn spawn(
        bench: &Bench,
        queue: &str,
        synthetic: Option<usize>,
    ) -> Result<WorkerProcess> {
        let mut command = Command::new(std::env::current_exe()?);
        command.arg(FLAG).arg(queue);
        if let Some(count) = synthetic {
            command.arg(count.to_string());
        }
        let mut child = command
            .env(CONNECTION_ENV, bench.site.azurite.connection_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the worker process")?;
        let pid = child.id().context("the worker's pid")?;
        let stdout = child.stdout.take().context("the worker's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .context("the worker did not become ready")??;
        ensure!(
            line.as_deref() == Some("ready"),
            "the worker said {line:?} instead of ready"
        );
        let (tell, left) = watch::channel(None);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(n) = line.strip_prefix("left ").and_then(|n| n.parse().ok()) {
                    tell.send_replace(Some(n));
                }
            }
        });
        Ok(WorkerProcess { child, pid, left })
    }

    pub async fn stop(mut self) -> Result<()> {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .context("the worker did not exit")??;
        ensure!(status.success(), "the worker exited with {status}");
        Ok(())
    }
}
