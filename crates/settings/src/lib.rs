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
        let doc = plain(setting.doc());
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

/// A setting's documentation as a terminal shows it: code spans without
/// their backticks, and a Markdown link `[text](page.md#section)` as its
/// text and the page, `text (docs/page.md)`, the way the docs' own links
/// are relative to `docs/`.
///
/// ```
/// use spot_worker_settings::plain;
///
/// assert_eq!(
///     plain("see [Delivery semantics](lifecycle.md#delivery-semantics); `off`"),
///     "see Delivery semantics (docs/lifecycle.md); off"
/// );
/// ```
pub fn plain(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(open) = rest.find('[') {
        // The text ends at the first `]`; a link has `(target)` right after.
        let link = rest[open..].find(']').and_then(|close| {
            let close = open + close;
            rest[close..].starts_with("](").then_some(())?;
            let end = close + rest[close..].find(')')?;
            Some((close, end))
        });
        let Some((close, end)) = link else {
            out.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            continue;
        };
        let page = rest[close + 2..end].split('#').next().unwrap_or_default();
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        if !page.is_empty() {
            out.push_str(&format!(" (docs/{page})"));
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out.replace('`', "")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_read_as_their_text_and_page() {
        let rows = [
            ("no link, `code`", "no link, code"),
            (
                "see [the two lanes](deploying.md#the-two-lanes)",
                "see the two lanes (docs/deploying.md)",
            ),
            (
                "[a](a.md) and [b](b.md#x).",
                "a (docs/a.md) and b (docs/b.md).",
            ),
            ("[same page](#section)", "same page"),
            ("a [bracket] alone", "a [bracket] alone"),
            ("[x] then [y](y.md)", "[x] then y (docs/y.md)"),
            ("[unclosed](a.md", "[unclosed](a.md"),
        ];
        for (doc, shown) in rows {
            assert_eq!(plain(doc), shown, "{doc}");
        }
    }

    #[test]
    fn the_help_shows_no_markdown() {
        for flags in [SecretFlags::Accepted, SecretFlags::Refused] {
            let text = help(flags);
            assert!(!text.contains("]("), "a Markdown link in --help");
            assert!(!text.contains('`'), "a backtick in --help");
        }
        // The pages linked are named.
        assert!(help(SecretFlags::Refused).contains("(docs/lifecycle.md)"));
    }
}
