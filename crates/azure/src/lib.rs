//! # spot-worker-azure
//!
//! Azure Storage implementations of the `spot-worker-storage` traits, on the
//! official Azure SDK for Rust 1.x:
//!
//! - [`AzureQueue`] implements
//!   [`MessageQueue`](spot_worker_storage::MessageQueue) on Azure Storage
//!   Queues.
//! - [`BlobCheckpointStore`] implements
//!   [`CheckpointStore`](spot_worker_storage::CheckpointStore) on Blob
//!   Storage, fenced with ETags.
//! - [`BlobResultStore`] implements
//!   [`ResultStore`](spot_worker_storage::ResultStore) on Blob Storage,
//!   create-only (`If-None-Match: *`).
//! - [`BlobCheckpointStore`] also implements
//!   [`LeaseStore`](spot_worker_storage::LeaseStore) with Lease Blob, for
//!   the lane keeper's turns.
//! - [`ArmScaleInProtection`] keeps this VM out of a scale-in while it holds
//!   work (`protectFromScaleIn` through Azure Resource Manager).
//! - [`AzureStorage`] builds them from a [`StorageConfig`]: a connection
//!   string (an account key signs short-lived account SAS tokens, since the
//!   1.x crates have no shared-key auth), a managed identity, or the Azure CLI.
//!
//! Each store's `prepare` (from the storage traits) creates the queue or
//! container if it is missing and proves this worker can write to it, for a
//! warmup gate. Every storage call has a total deadline, retries included
//! ([`RetryConfig::call_deadline`]), so an unreachable account surfaces in
//! seconds as a transient error. Poison queues (`<queue>-poison`, or
//! [`AzureStorage::poison_queue`]) keep their messages forever
//! ([`MessageTtl::Never`]). Errors and logs never contain an account key or
//! a SAS signature ([`redact`]).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use spot_worker_azure::{AzureStorage, StorageConfig};
//! use spot_worker_consumer::{Consumer, ConsumerConfig};
//! use spot_worker_storage::{CheckpointStore, MessageQueue, ResultStore};
//!
//! let storage = AzureStorage::new(StorageConfig::from_connection_string("UseDevelopmentStorage=true")?)?;
//! let queue = storage.queue("jobs")?;
//! queue.prepare().await?; // created if missing, proven writable
//! let poison = storage.poison_queue("jobs")?; // "jobs-poison", never expires
//! poison.prepare().await?;
//! let checkpoints = storage.checkpoint_store("checkpoints")?;
//! checkpoints.prepare().await?;
//! let results = storage.result_store("results")?;
//! results.prepare().await?;
//! let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), ConsumerConfig::default())?
//!     .with_checkpoints(Arc::new(checkpoints));
//! # Ok(()) }
//! ```

mod checkpoint;
mod chunks;
mod client;
mod config;
mod config_error;
mod connection_string;
mod container;
mod credentials;
mod endpoints;
mod error;
mod identity;
mod lease;
mod listing;
mod queue;
mod redact;
mod result;
mod sas;
mod scale_in_protection;
mod service_url;
mod workload_identity;

pub use checkpoint::BlobCheckpointStore;
pub use chunks::{BlobChunkStore, CHUNK_PREFIX};
pub use container::PROBE_PREFIX;

/// The keys (prefixes) the blob backends write under `.spot-worker/` in
/// the checkpoint container besides the storage crate's
/// (`spot_worker_storage::WORKER_RECORDS`): the chunks of large
/// checkpoints, and the write probe of `prepare` (deleted at once, left
/// only by a worker that dies in between).
pub const WORKER_RECORDS: [&str; 2] = [CHUNK_PREFIX, PROBE_PREFIX];
/// The token credential type the credentials hand out (the Azure SDK's).
pub use azure_core::credentials::TokenCredential;
pub use client::{AzureStorage, MAX_POISONED_QUEUE_NAME_LEN, POISON_SUFFIX};
pub use config::{RetryConfig, StorageConfig};
pub use config_error::{CLIENT_ID_ENV, StorageConfigError};
pub use connection_string::{
    CONNECTION_STRING_ENV, ConnectionString, ConnectionStringError, DEVELOPMENT_ACCOUNT_KEY,
    DEVELOPMENT_ACCOUNT_NAME, SharedKeyOrSas,
};
pub use credentials::CredentialSettings;
pub use credentials::Credentials;
pub use endpoints::AccountEndpoints;
pub use listing::StoredBlob;
pub use queue::{AzureQueue, MessageTtl, PeekedMessage};
pub use redact::{REDACTED, redact};
pub use result::BlobResultStore;
pub use sas::{AccountSasScope, SasError, sign_account_sas};
pub use scale_in_protection::{
    API_VERSION as SCALE_IN_PROTECTION_API_VERSION, ARM_SCOPE, ArmScaleInProtection, ArmSetupError,
    arm_endpoint,
};
pub use workload_identity::WorkloadIdentity;
