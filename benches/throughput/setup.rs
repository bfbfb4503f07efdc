//! What every part of the throughput benchmark shares: one Azurite and a
//! storage client for it, fresh (and pre-filled) queues per run, CPU
//! readings around a run, the worker's configuration, and bounded waits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use spot_worker::azure::{AzureQueue, AzureStorage, StorageConfig};
use spot_worker::runtime::WorkerConfig;
use spot_worker::storage::{MessageQueue, StorageError, poison_queue_name};
use spot_worker_testkit::bench;
use spot_worker_testkit::faulty::QueueFaults;
use spot_worker_testkit::procfs::{self, Process};
use spot_worker_testkit::{Azurite, Topology};
use tokio::task::JoinSet;

use crate::{BATCH, PATIENCE, VISIBILITY};

/// Concurrent sends while filling a queue.
pub const FILL_CONCURRENCY: usize = 64;

/// The Azurite every part runs against, and the Python interpreter of the
/// baselines.
pub struct Bench {
    pub site: Site,
    pub python: Option<PathBuf>,
}

impl Bench {
    pub async fn start() -> Result<Bench> {
        Ok(Bench {
            site: Site::start(Topology::Shared).await?,
            python: bench::python()?,
        })
    }
}

/// An Azurite and a storage client for it.
pub struct Site {
    pub azurite: Azurite,
    pub storage: AzureStorage,
}

/// A run's queue and its poison queue, prepared.
pub struct Queues {
    pub name: String,
    pub queue: AzureQueue,
    pub poison: AzureQueue,
}

impl Site {
    /// Azurite with its services spread over processes as `topology` says.
    pub async fn start(topology: Topology) -> Result<Site> {
        let start = match topology {
            Topology::Shared => Azurite::start,
            Topology::Separate => Azurite::start_separate,
        };
        let azurite = tokio::task::spawn_blocking(start)
            .await?
            .context("starting azurite (run `npm ci --prefix tools/azurite`)")?;
        let storage = AzureStorage::new(StorageConfig::from_connection_string(
            &azurite.connection_string(),
        )?)?;
        Ok(Site { azurite, storage })
    }

    /// `name (pid N)` of each Azurite process, for a banner.
    pub fn describe(&self) -> String {
        let processes: Vec<String> = self
            .azurite
            .processes()
            .iter()
            .map(|p| format!("{} (pid {})", p.name, p.pid))
            .collect();
        processes.join(", ")
    }

    pub async fn queues(&self, prefix: &str) -> Result<Queues> {
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let queues = Queues {
            queue: self.storage.queue(&name)?,
            poison: self.storage.queue(&poison_queue_name(&name))?,
            name,
        };
        bounded("preparing the queues", async {
            queues.queue.prepare().await?;
            queues.poison.prepare().await?;
            Ok(())
        })
        .await?;
        Ok(queues)
    }

    /// A prepared queue holding `count` small messages.
    pub async fn filled(&self, prefix: &str, count: usize) -> Result<Queues> {
        let queues = self.queues(prefix).await?;
        fill(&queues.queue, count).await?;
        Ok(queues)
    }

    /// CPU time used so far by each Azurite process and by this process.
    pub fn cpu(&self) -> Result<Cpu> {
        let mut azurite = Vec::new();
        for process in self.azurite.processes() {
            azurite.push((process.name, procfs::cpu_time(Process::Id(process.pid))?));
        }
        Ok(Cpu {
            azurite: AzuriteCpu(azurite),
            this: procfs::cpu_time(Process::This)?,
        })
    }
}

/// Sends `count` messages, `FILL_CONCURRENCY` at a time.
pub async fn fill(queue: &AzureQueue, count: usize) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut senders = JoinSet::new();
    for _ in 0..FILL_CONCURRENCY.min(count) {
        let (queue, next) = (queue.clone(), Arc::clone(&next));
        senders.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count as u64 {
                    return Ok::<_, StorageError>(());
                }
                queue.send(&format!("message {i}"), Duration::ZERO).await?;
            }
        });
    }
    bounded("filling the queue", async {
        while let Some(sent) = senders.join_next().await {
            sent??;
        }
        Ok(())
    })
    .await
}

/// `future`, or an error if it takes longer than [`PATIENCE`].
pub async fn bounded<T>(what: &str, future: impl Future<Output = Result<T>>) -> Result<T> {
    bench::bounded(what, PATIENCE, future).await
}

/// Resolves once `count` deletes through `queue` have succeeded, at most
/// [`PATIENCE`].
pub async fn all_deleted(queue: &QueueFaults, count: usize) -> Result<()> {
    bounded("draining the queue", async {
        queue.deleted(count).await;
        Ok(())
    })
    .await
}

/// First receive sent → `count`-th delete answered.
pub fn drain_time(queue: &QueueFaults, count: usize) -> Result<Duration> {
    let first = *queue.receives_at().first().context("no receive")?;
    let last = *queue
        .deleted_at()
        .get(count.saturating_sub(1))
        .context("target not reached")?;
    Ok(last - first)
}

/// Polls `done` every 5 ms until it holds, at most `PATIENCE`.
pub async fn wait_until(what: &str, done: impl Fn() -> bool) -> Result<()> {
    bounded(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    })
    .await
}

/// CPU time used so far (or over a run): by each Azurite process, and by
/// this one.
pub struct Cpu {
    pub azurite: AzuriteCpu,
    pub this: Duration,
}

/// CPU time of each Azurite process, by its name.
#[derive(Clone, Debug, Default)]
pub struct AzuriteCpu(pub Vec<(&'static str, Duration)>);

impl AzuriteCpu {
    /// All processes together.
    pub fn total(&self) -> Duration {
        self.0.iter().map(|(_, cpu)| *cpu).sum()
    }

    /// What each process used from `before` to `self`.
    pub fn since(&self, before: &AzuriteCpu) -> AzuriteCpu {
        let used = self.0.iter().zip(&before.0);
        AzuriteCpu(
            used.map(|((name, after), (_, before))| (*name, *after - *before))
                .collect(),
        )
    }
}

/// The value in `cell` (a poisoned lock still holds a valid value).
pub fn lock<T: Copy>(cell: &Mutex<T>) -> T {
    *cell.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts `value` in `cell`.
pub fn set<T>(cell: &Mutex<T>, value: T) {
    *cell.lock().unwrap_or_else(|p| p.into_inner()) = value;
}

/// A worker of concurrency [`BATCH`] on `queue`, without IMDS or signal
/// handling: the figures are the queue path's.
pub fn worker_config(queue: &str) -> WorkerConfig {
    let mut config = WorkerConfig {
        queue: queue.to_owned(),
        concurrency: usize::from(BATCH),
        visibility_timeout: VISIBILITY,
        health_addr: "127.0.0.1:0".parse().expect("a socket address"),
        ..WorkerConfig::default()
    };
    // No IMDS here: the figures are the queue path's.
    config.imds.enabled = false;
    config.drain.watchdog = false;
    config.drain.handle_signals = false;
    config
}

/// The median of `values` (NaN if there are none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
