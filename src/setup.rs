//! The documented environment contract, wired to Azure Storage: what every
//! worker built on spot-worker reads, so one deployment fits them all.
//!
//! | variable | meaning |
//! |---|---|
//! | `AZURE_STORAGE_CONNECTION_STRING` | storage by connection string (`UseDevelopmentStorage=true` for Azurite) |
//! | `SPOT_WORKER_STORAGE_ACCOUNT_URL` | otherwise: the account (`https://<account>.blob.core.windows.net`, or just its name), reached with a managed identity |
//! | `AZURE_CLIENT_ID` | the user-assigned managed identity's client id |
//! | `SPOT_WORKER_QUEUE`, `SPOT_WORKER_MESSAGE_ENCODING`, `SPOT_WORKER_CONCURRENCY`, `SPOT_WORKER_HEALTH_ADDR`, `SPOT_WORKER_IMDS_ENDPOINT`, ... | see [`WorkerConfig`](crate::runtime::WorkerConfig) |

use std::sync::Arc;

use spot_worker_azure::{AccountEndpoints, AzureStorage, Credentials, StorageConfig};
use spot_worker_runtime::{ConfigError, Worker, WorkerConfig};

/// Names the storage account when no connection string is given.
pub const STORAGE_ACCOUNT_URL_ENV: &str = "SPOT_WORKER_STORAGE_ACCOUNT_URL";

/// Why the environment does not describe a usable worker.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A worker setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The storage account or its credentials are unusable.
    #[error("storage: {0}")]
    Storage(#[from] spot_worker_azure::ConfigError),
}

/// A worker's configuration and its Azure Storage account, from the
/// environment.
pub struct AzureSetup {
    /// The worker's settings.
    pub config: WorkerConfig,
    /// The storage account (queues, checkpoints, and any containers the
    /// application needs, e.g. for results).
    pub storage: AzureStorage,
}

impl AzureSetup {
    /// Reads the environment contract.
    pub fn from_env() -> Result<Self, SetupError> {
        let config = WorkerConfig::from_env()?;
        let endpoints = std::env::var(STORAGE_ACCOUNT_URL_ENV)
            .ok()
            .filter(|url| !url.trim().is_empty())
            .map(|url| account_endpoints(&url))
            .transpose()?;
        let credentials = Credentials::from_env(endpoints)?;
        tracing::info!(
            credential = credentials.kind(),
            "storage credentials chosen"
        );
        let storage = AzureStorage::new(StorageConfig::new(credentials))?;
        Ok(AzureSetup { config, storage })
    }

    /// A worker on the configured queue, its `<queue>-poison` queue, the
    /// checkpoint container and the poison container (originals too big for
    /// their poison record). Missing queues and containers are created by
    /// the warmup gate.
    pub fn worker(&self) -> Result<Worker, SetupError> {
        let queue = self.storage.queue(&self.config.queue)?;
        let poison = self
            .storage
            .queue(&spot_worker_storage::poison_queue_name(&self.config.queue))?;
        let checkpoints = self
            .storage
            .checkpoint_store(&self.config.checkpoint_container)?;
        let poison_bodies = self.storage.result_store(&self.config.poison_container)?;
        Ok(
            Worker::new(self.config.clone(), Arc::new(queue), Arc::new(poison))
                .with_checkpoints(Arc::new(checkpoints))
                .with_poison_bodies(Arc::new(poison_bodies)),
        )
    }
}

/// The blob and queue endpoints of an account given by one service URL
/// (`https://acct.blob.core.windows.net`, any cloud's suffix) or by name.
pub fn account_endpoints(text: &str) -> Result<AccountEndpoints, spot_worker_azure::ConfigError> {
    let text = text.trim().trim_end_matches('/');
    let Some(rest) = text.strip_prefix("https://") else {
        return AccountEndpoints::for_account(text);
    };
    let mut labels: Vec<&str> = rest.split('.').collect();
    if labels.len() >= 3 && matches!(labels[1], "blob" | "queue" | "table" | "file" | "dfs") {
        labels[1] = "blob";
        let blob = format!("https://{}", labels.join("."));
        labels[1] = "queue";
        let queue = format!("https://{}", labels.join("."));
        return AccountEndpoints::new(&blob, &queue);
    }
    Err(spot_worker_azure::ConfigError::InvalidUrl {
        url: text.to_owned(),
        reason: "expected https://<account>.blob.<suffix> (or the account name)".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_from_any_service_url_or_a_name() {
        for given in [
            "https://acct.blob.core.windows.net",
            "https://acct.queue.core.windows.net/",
            "acct",
        ] {
            let e = account_endpoints(given).unwrap();
            assert_eq!(
                e.blob.as_str(),
                "https://acct.blob.core.windows.net/",
                "{given}"
            );
            assert_eq!(
                e.queue.as_str(),
                "https://acct.queue.core.windows.net/",
                "{given}"
            );
        }
        let china = account_endpoints("https://acct.blob.core.chinacloudapi.cn").unwrap();
        assert_eq!(
            china.queue.as_str(),
            "https://acct.queue.core.chinacloudapi.cn/"
        );
        assert!(account_endpoints("https://example.com").is_err());
    }
}
