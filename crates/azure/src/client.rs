//! [`AzureStorage`]: turns a [`StorageConfig`] into queue, checkpoint and
//! result clients that share one authentication setup and retry policy.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_core::http::policies::Policy;
use azure_core::http::{ClientOptions, Url};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use azure_storage_queue::{QueueClient, QueueClientOptions};

use crate::checkpoint::BlobCheckpointStore;
use crate::config::{AccountEndpoints, ConfigError, Credentials, StorageConfig};
use crate::connection_string::SharedKeyOrSas;
use crate::queue::AzureQueue;
use crate::redact::redact;
use crate::result::BlobResultStore;
use crate::sas::{SasPolicy, SasSource};

/// A storage account, ready to hand out queues, checkpoint stores and
/// result stores.
#[derive(Clone, Debug)]
pub struct AzureStorage {
    config: StorageConfig,
    endpoints: AccountEndpoints,
    auth: Auth,
}

#[derive(Clone, Debug)]
enum Auth {
    Sas(Arc<SasPolicy>),
    Token(Arc<dyn TokenCredential>),
}

impl AzureStorage {
    /// Prepares clients for the account `config` describes. No request is
    /// made yet.
    pub fn new(config: StorageConfig) -> Result<Self, ConfigError> {
        let (endpoints, auth) = match &config.credentials {
            Credentials::ConnectionString(cs) => {
                let source = match &cs.credentials {
                    SharedKeyOrSas::AccountKey(key) => SasSource::AccountKey {
                        account_name: cs.account_name.clone(),
                        key: key.clone(),
                        lifetime: config.sas_lifetime,
                    },
                    SharedKeyOrSas::Sas(sas) => SasSource::Fixed(sas.clone()),
                };
                let endpoints = AccountEndpoints {
                    blob: cs.blob_endpoint.clone(),
                    queue: cs.queue_endpoint.clone(),
                };
                (endpoints, Auth::Sas(SasPolicy::new(source)))
            }
            Credentials::Token {
                endpoints,
                credential,
                ..
            } => (endpoints.clone(), Auth::Token(Arc::clone(credential))),
        };
        tracing::info!(
            credentials = config.credentials.kind(),
            queue_endpoint = %redact(endpoints.queue.as_str()),
            blob_endpoint = %redact(endpoints.blob.as_str()),
            "storage account configured"
        );
        Ok(AzureStorage {
            config,
            endpoints,
            auth,
        })
    }

    /// The account's service URLs.
    pub fn endpoints(&self) -> &AccountEndpoints {
        &self.endpoints
    }

    /// A client for queue `name` (which need not exist yet; see
    /// [`AzureQueue::create_if_missing`]).
    pub fn queue(&self, name: &str) -> Result<AzureQueue, ConfigError> {
        validate_name(name)?;
        let url = child_url(&self.endpoints.queue, name)?;
        let options = QueueClientOptions {
            client_options: self.client_options(),
            ..Default::default()
        };
        let client = QueueClient::new(url, self.credential(), Some(options)).map_err(|e| {
            ConfigError::InvalidUrl {
                url: redact(self.endpoints.queue.as_str()),
                reason: redact(&e.to_string()),
            }
        })?;
        Ok(AzureQueue::new(name.to_owned(), client))
    }

    /// A checkpoint store keeping one blob per job in `container` (created by
    /// [`CheckpointStore::prepare`](spot_worker_storage::CheckpointStore::prepare)
    /// or [`BlobCheckpointStore::create_container_if_missing`]).
    pub fn checkpoint_store(&self, container: &str) -> Result<BlobCheckpointStore, ConfigError> {
        let client = self.container_client(container)?;
        Ok(BlobCheckpointStore::new(container.to_owned(), client))
    }

    /// A create-only result store keeping one blob per result in
    /// `container` (created by
    /// [`ResultStore::prepare`](spot_worker_storage::ResultStore::prepare)).
    pub fn result_store(&self, container: &str) -> Result<BlobResultStore, ConfigError> {
        let client = self.container_client(container)?;
        Ok(BlobResultStore::new(container.to_owned(), client))
    }

    fn container_client(&self, container: &str) -> Result<BlobContainerClient, ConfigError> {
        validate_name(container)?;
        let url = child_url(&self.endpoints.blob, container)?;
        let options = BlobContainerClientOptions {
            client_options: self.client_options(),
            ..Default::default()
        };
        BlobContainerClient::new(url, self.credential(), Some(options)).map_err(|e| {
            ConfigError::InvalidUrl {
                url: redact(self.endpoints.blob.as_str()),
                reason: redact(&e.to_string()),
            }
        })
    }

    fn credential(&self) -> Option<Arc<dyn TokenCredential>> {
        match &self.auth {
            Auth::Token(credential) => Some(Arc::clone(credential)),
            Auth::Sas(_) => None,
        }
    }

    fn client_options(&self) -> ClientOptions {
        let mut options = ClientOptions {
            retry: self.config.retry.to_options(),
            ..Default::default()
        };
        if let Auth::Sas(policy) = &self.auth {
            options
                .per_try_policies
                .push(Arc::clone(policy) as Arc<dyn Policy>);
        }
        options
    }
}

fn child_url(base: &Url, name: &str) -> Result<Url, ConfigError> {
    let text = format!("{}/{name}", base.as_str().trim_end_matches('/'));
    Url::parse(&text).map_err(|e| ConfigError::InvalidUrl {
        url: redact(&text),
        reason: e.to_string(),
    })
}

/// Queue and container names: 3 to 63 lowercase letters, digits and
/// single hyphens, starting and ending with a letter or digit.
fn validate_name(name: &str) -> Result<(), ConfigError> {
    let invalid = |reason| {
        Err(ConfigError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if !(3..=63).contains(&name.len()) {
        return invalid("must be 3 to 63 characters long");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return invalid("may contain only lowercase letters, digits and hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return invalid("hyphens must be single and inside the name");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_storage_rules() {
        for ok in ["jobs", "jobs-poison", "a1b", &"x".repeat(63)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ab",
            "Jobs",
            "-jobs",
            "jobs-",
            "jo--bs",
            "jobs_1",
            &"x".repeat(64),
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }
}
