//! Why a setting could not be used.

use std::path::PathBuf;

/// A setting that could not be used, naming where it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingError {
    /// The configuration file could not be read.
    #[error("reading the configuration file {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML, or holds a key or value
    /// that is not a setting.
    #[error("invalid configuration file {path}: {message}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A command-line argument that is not a setting's flag.
    #[error("{flag}: {reason}")]
    Flag {
        /// The argument.
        flag: String,
        /// What is wrong.
        reason: String,
    },
    /// A credential given as a command-line flag where the command line
    /// is visible to programs ([`Source::without_secret_flags`](crate::Source::without_secret_flags)).
    #[error(
        "{flag}: {key} is a credential, and a command line is readable by every process on \
         the machine (/proc/<pid>/cmdline); set {key} in the worker's environment instead \
         (programs never see it there), or use a managed identity where there is one \
         (storage: SPOT_WORKER_STORAGE_ACCOUNT_URL)"
    )]
    SecretFlag {
        /// The flag as it was given, e.g. `--azure-storage-connection-string`.
        flag: String,
        /// The setting's variable.
        key: &'static str,
    },
    /// A value that does not parse or cannot work.
    #[error("invalid {setting} = {value:?}: {reason}")]
    Invalid {
        /// The setting as it was given: the variable, the flag, or the key
        /// and its file.
        setting: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
}
