//! [`AzureStorage`]: turns a [`StorageConfig`] into queue, checkpoint and
//! result clients that share one authentication setup and retry policy.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_core::http::policies::Policy;
use azure_core::http::{ClientOptions, Url};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use azure_storage_queue::{QueueClient, QueueClientOptions};

use crate::checkpoint::BlobCheckpointStore;
use crate::config::{AccountEndpoints, Credentials, StorageConfig, StorageConfigError};
use crate::connection_string::{ConnectionString, ConnectionStringError, SharedKeyOrSas};
use crate::queue::{AzureQueue, MessageTtl};
use crate::redact::redact;
use crate::result::BlobResultStore;
use crate::sas::{AccountSasScope, SasPolicy, SasSource};
use crate::service_url::{check_service_url, without_secrets};

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
    pub fn new(config: StorageConfig) -> Result<Self, StorageConfigError> {
        let (endpoints, auth) = match &config.credentials {
            Credentials::ConnectionString(cs) => {
                let source = match &cs.credentials {
                    SharedKeyOrSas::AccountKey(key) => SasSource::AccountKey {
                        // Parsing refuses an AccountKey without AccountName;
                        // a hand-built ConnectionString is checked here.
                        account_name: cs
                            .account_name
                            .clone()
                            .ok_or(ConnectionStringError::MissingAccountName)?,
                        key: key.clone(),
                        scope: sas_scope(config.sas_scope, cs),
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
    ///
    /// A name ending in [`POISON_SUFFIX`] is a poison queue (the
    /// `poison_queue_name` convention of `spot-worker-storage`): messages sent
    /// to it never expire ([`MessageTtl::Never`]), since the service's 7-day
    /// default would silently delete poison records nobody has looked at
    /// yet. Every other queue keeps the service default. Override either
    /// with [`AzureQueue::with_message_ttl`].
    pub fn queue(&self, name: &str) -> Result<AzureQueue, StorageConfigError> {
        if let Some(base) = name.strip_suffix(POISON_SUFFIX) {
            validate_poison_base(base, name)?;
        }
        validate_name(name)?;
        let url = child_url(&self.endpoints.queue, name)?;
        let options = QueueClientOptions {
            client_options: self.client_options(),
            ..Default::default()
        };
        let client = QueueClient::new(url, self.credential(), Some(options)).map_err(|e| {
            StorageConfigError::InvalidUrl {
                url: redact(self.endpoints.queue.as_str()),
                reason: redact(&e.to_string()),
            }
        })?;
        let ttl = if name.ends_with(POISON_SUFFIX) {
            MessageTtl::Never
        } else {
            MessageTtl::ServiceDefault
        };
        Ok(
            AzureQueue::new(name.to_owned(), client, self.config.retry.call_deadline())
                .with_message_ttl(ttl),
        )
    }

    /// The poison queue of queue `queue`: `<queue>-poison`, whose messages
    /// never expire. Fails with a clear error if `queue` is not a valid queue
    /// name or is too long to leave room for the suffix (at most
    /// [`MAX_POISONED_QUEUE_NAME_LEN`] characters).
    pub fn poison_queue(&self, queue: &str) -> Result<AzureQueue, StorageConfigError> {
        validate_name(queue)?;
        self.queue(&format!("{queue}{POISON_SUFFIX}"))
    }

    /// A checkpoint store keeping one blob per job in `container` (created by
    /// [`CheckpointStore::prepare`](spot_worker_storage::CheckpointStore::prepare)
    /// or [`BlobCheckpointStore::create_container_if_missing`]).
    pub fn checkpoint_store(
        &self,
        container: &str,
    ) -> Result<BlobCheckpointStore, StorageConfigError> {
        let client = self.container_client(container)?;
        Ok(BlobCheckpointStore::new(
            container.to_owned(),
            client,
            self.config.retry.call_deadline(),
        ))
    }

    /// A create-only result store keeping one blob per result in
    /// `container` (created by
    /// [`ResultStore::prepare`](spot_worker_storage::ResultStore::prepare)).
    pub fn result_store(&self, container: &str) -> Result<BlobResultStore, StorageConfigError> {
        let client = self.container_client(container)?;
        Ok(BlobResultStore::new(
            container.to_owned(),
            client,
            self.config.retry.call_deadline(),
        ))
    }

    fn container_client(&self, container: &str) -> Result<BlobContainerClient, StorageConfigError> {
        validate_name(container)?;
        let url = child_url(&self.endpoints.blob, container)?;
        let options = BlobContainerClientOptions {
            client_options: self.client_options(),
            ..Default::default()
        };
        BlobContainerClient::new(url, self.credential(), Some(options)).map_err(|e| {
            StorageConfigError::InvalidUrl {
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

/// The configured SAS scope for `cs`'s endpoints: https only, unless an
/// endpoint is a local emulator on plain http (only loopback hosts pass
/// [`check_service_url`]).
fn sas_scope(scope: AccountSasScope, cs: &ConnectionString) -> AccountSasScope {
    if cs.blob_endpoint.scheme() == "http" || cs.queue_endpoint.scheme() == "http" {
        scope.allowing_http()
    } else {
        scope
    }
}

/// `base` with `name` appended as one more path segment. A base that is not
/// a valid service URL is refused ([`check_service_url`]: connection strings
/// and [`AccountEndpoints::new`] refuse it already; this guards hand-built
/// [`AccountEndpoints`]): a query or fragment, after which the name would
/// not name the queue or container and which usually means a SAS that
/// belongs in `SharedAccessSignature`, or plain http to a host that is not
/// loopback, where the SAS or token would travel in clear.
fn child_url(base: &Url, name: &str) -> Result<Url, StorageConfigError> {
    let invalid = |reason: &str| StorageConfigError::InvalidUrl {
        url: without_secrets(base),
        reason: reason.to_owned(),
    };
    check_service_url(base).map_err(invalid)?;
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| invalid("not a base URL"))?
        .pop_if_empty()
        .push(name);
    Ok(url)
}

/// The suffix of poison queue names (`spot_worker_consumer::poison_queue_name`).
pub const POISON_SUFFIX: &str = "-poison";

/// The longest queue name that still has a poison queue: queue names may
/// have 63 characters, and [`POISON_SUFFIX`] takes 7.
pub const MAX_POISONED_QUEUE_NAME_LEN: usize = MAX_NAME_LEN - POISON_SUFFIX.len();

const MIN_NAME_LEN: usize = 3;
const MAX_NAME_LEN: usize = 63;

/// A poison queue name is checked for its base queue's sake first, so that
/// a too-long name says which queue name to shorten rather than just
/// "must be 3 to 63 characters".
fn validate_poison_base(base: &str, name: &str) -> Result<(), StorageConfigError> {
    if base.len() > MAX_POISONED_QUEUE_NAME_LEN {
        return Err(StorageConfigError::InvalidName {
            name: name.to_owned(),
            reason: "is the poison queue of a queue name longer than 56 characters; queue names \
                     may have at most 56 characters so that `<queue>-poison` fits the 63 allowed",
        });
    }
    Ok(())
}

/// Queue and container names: 3 to 63 lowercase letters, digits and
/// single hyphens, starting and ending with a letter or digit.
fn validate_name(name: &str) -> Result<(), StorageConfigError> {
    let invalid = |reason| {
        Err(StorageConfigError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if !(MIN_NAME_LEN..=MAX_NAME_LEN).contains(&name.len()) {
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

    fn storage() -> AzureStorage {
        AzureStorage::new(
            StorageConfig::from_connection_string("UseDevelopmentStorage=true").unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn poison_queues_never_expire_and_others_keep_the_service_default() {
        let storage = storage();
        assert_eq!(
            storage.queue("jobs").unwrap().message_ttl(),
            MessageTtl::ServiceDefault
        );
        assert_eq!(
            storage.queue("jobs-poison").unwrap().message_ttl(),
            MessageTtl::Never
        );
        let poison = storage.poison_queue("jobs").unwrap();
        assert_eq!(poison.message_ttl(), MessageTtl::Never);
        assert_eq!(
            spot_worker_storage::MessageQueue::name(&poison),
            "jobs-poison"
        );
    }

    #[test]
    fn a_queue_too_long_for_its_poison_queue_gets_a_clear_error() {
        let storage = storage();
        let longest = "q".repeat(MAX_POISONED_QUEUE_NAME_LEN);
        assert!(storage.poison_queue(&longest).is_ok());
        assert_eq!(
            storage
                .queue(&format!("{longest}-poison"))
                .unwrap()
                .message_ttl(),
            MessageTtl::Never
        );
        let too_long = "q".repeat(MAX_POISONED_QUEUE_NAME_LEN + 1);
        assert!(
            storage.queue(&too_long).is_ok(),
            "fine as a queue on its own"
        );
        for err in [
            storage.poison_queue(&too_long).unwrap_err(),
            storage
                .queue(&spot_worker_consumer::poison_queue_name(&too_long))
                .unwrap_err(),
        ] {
            let text = err.to_string();
            assert!(
                matches!(err, StorageConfigError::InvalidName { .. }),
                "{err:?}"
            );
            assert!(text.contains("at most 56 characters"), "{text}");
        }
        assert!(storage.poison_queue("Jobs").is_err());
    }

    #[test]
    fn child_urls_append_a_path_segment_and_refuse_queries() {
        let base = Url::parse("http://127.0.0.1:10001/devstoreaccount1").unwrap();
        assert_eq!(
            child_url(&base, "jobs").unwrap().as_str(),
            "http://127.0.0.1:10001/devstoreaccount1/jobs"
        );
        let root = Url::parse("https://acct.queue.core.windows.net/").unwrap();
        assert_eq!(
            child_url(&root, "jobs").unwrap().as_str(),
            "https://acct.queue.core.windows.net/jobs"
        );
        let with_sas =
            Url::parse("https://acct.queue.core.windows.net/?sv=1&sig=c2VjcmV0").unwrap();
        let err = child_url(&with_sas, "jobs").unwrap_err().to_string();
        assert!(err.contains("query") && !err.contains("c2VjcmV0"), "{err}");
    }

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
