//! The operator's commands on a fleet's storage (`enqueue`, `poison`,
//! `checkpoints`, `status`): they read the same environment contract as
//! the worker ([`AzureSetup`]), so they reach the same queue, poison queue
//! and containers with the same credentials.

pub mod enqueue;

use anyhow::{Context as _, Result};
use spot_worker::setup::AzureSetup;
use spot_worker_azure::{AzureQueue, BlobCheckpointStore, BlobResultStore};
use spot_worker_runtime::WorkerConfig;
use spot_worker_storage::MessageEncoding;

/// The worker's settings and storage, as an operator reaches them.
pub struct Fleet {
    pub config: WorkerConfig,
    setup: AzureSetup,
}

impl Fleet {
    /// Reads the worker's environment (connection string, or account URL
    /// with a managed identity or the Azure CLI; `SPOT_WORKER_QUEUE`, ...).
    pub fn from_env() -> Result<Self> {
        let setup = AzureSetup::operator_from_env().context(
            "reading the worker's environment (AZURE_STORAGE_CONNECTION_STRING or \
             SPOT_WORKER_STORAGE_ACCOUNT_URL, SPOT_WORKER_QUEUE, ...)",
        )?;
        Ok(Fleet {
            config: setup.config.clone(),
            setup,
        })
    }

    /// The work queue (`SPOT_WORKER_QUEUE`).
    pub fn queue(&self) -> Result<AzureQueue> {
        self.queue_named(&self.config.queue)
    }

    /// Any queue of the account, by name.
    pub fn queue_named(&self, name: &str) -> Result<AzureQueue> {
        self.setup
            .storage
            .queue(name)
            .with_context(|| format!("queue {name:?}"))
    }

    /// The checkpoint container (`SPOT_WORKER_CHECKPOINT_CONTAINER`).
    pub fn checkpoints(&self) -> Result<BlobCheckpointStore> {
        let name = &self.config.checkpoint_container;
        self.setup
            .storage
            .checkpoint_store(name)
            .with_context(|| format!("checkpoint container {name:?}"))
    }

    /// A blob container read as a result store (results, claim checks).
    pub fn blobs(&self, container: &str) -> Result<BlobResultStore> {
        self.setup
            .storage
            .result_store(container)
            .with_context(|| format!("blob container {container:?}"))
    }
}

/// The encoding's name as `SPOT_WORKER_MESSAGE_ENCODING` spells it.
pub fn encoding_name(encoding: MessageEncoding) -> &'static str {
    match encoding {
        MessageEncoding::Text => "text",
        MessageEncoding::Base64 => "base64",
    }
}
