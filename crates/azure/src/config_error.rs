//! Why a storage configuration could not be built ([`StorageConfigError`]),
//! and the setting that names a managed identity, which several
//! credentials read.

use crate::connection_string::ConnectionStringError;

/// The environment variable naming a user-assigned managed identity's client id.
pub const CLIENT_ID_ENV: &str = spot_worker_settings::table::CLIENT_ID.key;

/// Storage configuration could not be built. Never contains secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageConfigError {
    /// The connection string is unusable.
    #[error(transparent)]
    ConnectionString(#[from] ConnectionStringError),
    /// An account URL is invalid.
    #[error("invalid storage account URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// Why.
        reason: String,
    },
    /// Neither a connection string nor an account is configured.
    #[error(
        "no storage configured: set {connection_string} (`UseDevelopmentStorage=true` for a local \
         Azurite, which `spot-worker dev` starts) or {account_url} (the account, reached with the \
         user-assigned managed identity {client_id} names, else with the Azure CLI's login)",
        connection_string = spot_worker_settings::table::CONNECTION_STRING.key,
        account_url = spot_worker_settings::table::STORAGE_ACCOUNT_URL.key,
        client_id = spot_worker_settings::table::CLIENT_ID.key
    )]
    NotConfigured,
    /// A credential could not be created.
    #[error("cannot create the {kind} credential: {reason}")]
    Credential {
        /// Which credential.
        kind: &'static str,
        /// Why, redacted.
        reason: String,
    },
    /// A name (queue, container) is invalid.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
}
