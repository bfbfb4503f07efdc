//! The one table of spot-worker's settings, and where their values come from.
//!
//! Every setting a worker reads - storage, queue, Scheduled Events, shutdown,
//! telemetry - is one [`Setting`] constant in [`table`], with its environment
//! variable, its default and one line of documentation. From that table come:
//!
//! - the environment reader and the TOML file ([`Source`]): a file key is
//!   the variable in lower case without `SPOT_WORKER_`
//!   (`SPOT_WORKER_DRAIN_BUDGET` is `drain_budget`, `RUST_LOG` is
//!   `rust_log`); a key not in the table is an error;
//! - command-line flags (`--drain-budget`; see [`Setting::flag`]);
//! - the configuration table of `docs/configuration.md` ([`markdown_table`]), checked by a
//!   test to be exactly the table.
//!
//! Precedence, highest first: flags (or code), environment, file, default.
//! A blank value counts as unset, wherever it comes from.
//!
//! ```
//! use std::time::Duration;
//! use spot_worker_settings::{Source, table};
//!
//! let source = Source::from_lookup(|name| match name {
//!     "SPOT_WORKER_DRAIN_BUDGET" => Some("20s".to_owned()),
//!     _ => None,
//! })?;
//! assert_eq!(source.get(&table::DRAIN_BUDGET)?, Duration::from_secs(20));
//! assert_eq!(source.get(&table::RELEASE_MARGIN)?, Duration::from_secs(3));
//! assert_eq!(source.get(&table::VM_NAME)?, None);
//! # Ok::<(), spot_worker_settings::SettingError>(())
//! ```

mod error;
mod setting;
mod source;
pub mod table;
mod value;

pub use error::SettingError;
pub use setting::{Describe, Setting};
pub use source::{CONFIG_FILE, Origin, Source};
pub use value::{SettingValue, parse_duration, parse_switch, show_duration};

/// Whether a program takes credentials ([`Setting::secret`]) as flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretFlags {
    /// As any setting (a worker binary such as `examples/primes.rs`).
    Accepted,
    /// Refused, as `spot-worker run` refuses them
    /// ([`Source::without_secret_flags`]): shown as variables only.
    Refused,
}

/// `--help` for a worker binary: every setting as a flag, its variable,
/// its default and what it does.
///
/// ```
/// use spot_worker_settings::{SecretFlags, help};
///
/// let text = help(SecretFlags::Refused);
/// assert!(text.contains("--drain-budget <value>   [SPOT_WORKER_DRAIN_BUDGET; default: 25s]"));
/// assert!(!text.contains("--azure-storage-connection-string"));
/// assert!(help(SecretFlags::Accepted).contains("--azure-storage-connection-string"));
/// ```
pub fn help(secret_flags: SecretFlags) -> String {
    let mut out = String::from(
        "Settings (highest first: flags, environment, the TOML file named by \
         SPOT_WORKER_CONFIG, defaults):\n\n",
    );
    for setting in table::ALL {
        let default = setting.default_text().replace('`', "");
        let doc = setting.doc().replace('`', "");
        if setting.secret() && secret_flags == SecretFlags::Refused {
            out.push_str(&format!(
                "  {} (environment or file only: a credential)   [default: {default}]\n      {doc}\n",
                setting.key()
            ));
            continue;
        }
        let flag = setting::file_key(setting.key()).replace('_', "-");
        out.push_str(&format!(
            "  --{flag} <value>   [{}; default: {default}]\n      {doc}\n",
            setting.key(),
        ));
    }
    out
}

/// The configuration table of `docs/configuration.md`: one row per setting of
/// [`table::ALL`], in its order.
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for setting in table::ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            setting.key(),
            setting.default_text(),
            setting.doc()
        ));
    }
    out
}
