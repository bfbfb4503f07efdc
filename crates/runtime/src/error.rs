//! What can stop a worker from starting or running.

use std::time::Duration;

/// A setting that could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting could not be read (the file, or a value that does not
    /// parse).
    #[error(transparent)]
    Setting(#[from] spot_worker_settings::SettingError),
    /// A value that does not parse or cannot work.
    #[error("invalid {setting} = {value:?}: {reason}")]
    Invalid {
        /// The setting (variable name, or key and file).
        setting: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Why [`Worker::run`](crate::Worker::run) returned an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The health endpoint could not listen.
    #[error("health endpoint: cannot listen on {addr}")]
    HealthServer {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The IMDS client could not be built.
    #[error("Scheduled Events watcher")]
    Imds(#[source] spot_worker_imds::ImdsError),
    /// The queue consumer could not be built.
    #[error("queue consumer")]
    Storage(#[source] spot_worker_storage::StorageError),
    /// The warmup gate stayed closed too long.
    #[error("the warmup gate did not open within {waited:?}; still waiting for: {waiting_for}")]
    GateTimeout {
        /// How long it waited.
        waited: Duration,
        /// The gates not passed.
        waiting_for: String,
    },
}
