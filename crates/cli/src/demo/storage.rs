//! Where the demo keeps its jobs: in memory, or a real Azurite.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use spot_worker_azure::{AzureQueue, AzureStorage, StorageConfig};
use spot_worker_consumer::poison_queue_name;
use spot_worker_local::{Azurite, HarnessError};
use spot_worker_storage::{
    CheckpointStore, InMemoryCheckpointStore, InMemoryQueue, InMemoryResultStore, MessageQueue,
    ResultStore,
};

use super::{CHECKPOINTS, QUEUE, RESULTS};

/// Where the jobs, checkpoints and results live.
pub(super) struct Storage {
    pub(super) queue: Arc<dyn MessageQueue>,
    pub(super) poison: Arc<dyn MessageQueue>,
    pub(super) checkpoints: Arc<dyn CheckpointStore>,
    pub(super) results: Arc<dyn ResultStore>,
    /// The same queues, concretely, to count what is left in them.
    pub(super) queues: Queues,
    pub(super) description: String,
}

/// The queues once more, as their own types: the traits cannot count.
pub(super) enum Queues {
    Memory(InMemoryQueue, InMemoryQueue),
    Azure {
        queue: AzureQueue,
        poison: AzureQueue,
        azurite: Azurite,
    },
}

impl Storage {
    pub(super) fn in_memory() -> Storage {
        let queue = InMemoryQueue::new(QUEUE);
        let poison = InMemoryQueue::new(&poison_queue_name(QUEUE));
        Storage {
            queue: Arc::new(queue.clone()),
            poison: Arc::new(poison.clone()),
            checkpoints: Arc::new(InMemoryCheckpointStore::new()),
            results: Arc::new(InMemoryResultStore::new(RESULTS)),
            queues: Queues::Memory(queue, poison),
            description: "in memory (--azurite for a real Azurite through the Azure backends)"
                .to_owned(),
        }
    }

    /// Starts Azurite and creates the queues and containers in it.
    pub(super) async fn azurite() -> Result<Storage> {
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await
            .context("starting Azurite")?
            .map_err(|error| match error {
                // Its log is many lines; the reason is enough here.
                HarnessError::NotReady { reason, .. } => anyhow!("Azurite did not start: {reason}"),
                HarnessError::NotInstalled(how) => anyhow!("{how}; or leave out --azurite"),
                other => anyhow!(other),
            })?;
        let config = StorageConfig::from_connection_string(&azurite.connection_string())
            .context("Azurite's connection string")?;
        let account = AzureStorage::new(config).context("configuring Azure Storage")?;
        let queue = account.queue(QUEUE)?;
        let poison = account.queue(&poison_queue_name(QUEUE))?;
        let checkpoints = account.checkpoint_store(CHECKPOINTS)?;
        let results = account.result_store(RESULTS)?;
        queue.prepare().await.context("creating the queue")?;
        poison
            .prepare()
            .await
            .context("creating the poison queue")?;
        checkpoints
            .prepare()
            .await
            .context("creating the checkpoint container")?;
        results
            .prepare()
            .await
            .context("creating the results container")?;
        Ok(Storage {
            queue: Arc::new(queue.clone()),
            poison: Arc::new(poison.clone()),
            checkpoints: Arc::new(checkpoints),
            results: Arc::new(results),
            description: format!(
                "Azurite (queue {QUEUE}, containers {CHECKPOINTS} and {RESULTS}) at {}",
                azurite.queue_endpoint()
            ),
            queues: Queues::Azure {
                queue,
                poison,
                azurite,
            },
        })
    }

    /// Messages still in the queue and in the poison queue, visible or not.
    pub(super) async fn messages_left(&self) -> Result<(u64, u64)> {
        Ok(match &self.queues {
            Queues::Memory(queue, poison) => (queue.len() as u64, poison.len() as u64),
            Queues::Azure { queue, poison, .. } => (
                queue
                    .approximate_message_count()
                    .await
                    .context("counting the queue")?,
                poison
                    .approximate_message_count()
                    .await
                    .context("counting the poison queue")?,
            ),
        })
    }

    /// Stops Azurite, if started, off the runtime's threads (it waits for
    /// the process to exit).
    pub(super) async fn close(self) {
        if let Queues::Azure { azurite, .. } = self.queues {
            let _ = tokio::task::spawn_blocking(move || drop(azurite)).await;
        }
    }
}
