//! One setting: its variable, its default and what it does.

use crate::value::SettingValue;

/// One setting, read as a `T`.
///
/// The constants in [`table`](crate::table) are the only instances: code
/// names a setting by its constant, so searching for the variable finds
/// both its definition and every reader.
#[derive(Debug)]
pub struct Setting<T: 'static> {
    /// The environment variable.
    pub key: &'static str,
    /// The value when none is given. Settings without one are
    /// `Setting<Option<T>>` with the default `None`.
    pub default: T,
    /// How the docs show the default, when not as the value itself
    /// (e.g. "CPUs" for a default worked out at run time).
    pub default_doc: Option<&'static str>,
    /// One line of Markdown for `--help` and the docs.
    pub doc: &'static str,
    /// A credential (a key, a connection string): never logged, withheld
    /// from the programs `spot-worker run` starts, and refused as a
    /// command-line flag there, since any process on the machine can read
    /// a command line (`/proc/<pid>/cmdline`).
    pub secret: bool,
}

impl<T: SettingValue> Setting<T> {
    /// The key in the TOML file: the variable in lower case, without the
    /// `SPOT_WORKER_` prefix.
    ///
    /// ```
    /// use spot_worker_settings::table;
    ///
    /// assert_eq!(table::DRAIN_BUDGET.file_key(), "drain_budget");
    /// assert_eq!(table::LOG_FILTER.file_key(), "rust_log");
    /// ```
    pub fn file_key(&self) -> String {
        file_key(self.key)
    }

    /// The command-line flag, without its dashes: the file key with `-`
    /// for `_` (`drain-budget`).
    pub fn flag(&self) -> String {
        self.file_key().replace('_', "-")
    }
}

/// A setting of any type, as the table, the docs and `--help` see it.
pub trait Describe: Sync {
    /// The environment variable.
    fn key(&self) -> &'static str;
    /// The default, for people (Markdown).
    fn default_text(&self) -> String;
    /// What it does (Markdown).
    fn doc(&self) -> &'static str;
    /// Checks a value from the file or a flag before it is used.
    fn check(&self, text: &str) -> Result<(), String>;
    /// Whether the value is a credential ([`Setting::secret`]).
    fn secret(&self) -> bool;
}

impl<T: SettingValue> Describe for Setting<T> {
    fn key(&self) -> &'static str {
        self.key
    }

    fn default_text(&self) -> String {
        match (self.default_doc, self.default.show()) {
            (Some(doc), _) => doc.to_owned(),
            (None, shown) if shown.is_empty() => "—".to_owned(),
            (None, shown) => format!("`{shown}`"),
        }
    }

    fn doc(&self) -> &'static str {
        self.doc
    }

    fn check(&self, text: &str) -> Result<(), String> {
        T::parse(text).map(drop)
    }

    fn secret(&self) -> bool {
        self.secret
    }
}

pub(crate) fn file_key(key: &str) -> String {
    key.strip_prefix("SPOT_WORKER_")
        .unwrap_or(key)
        .to_ascii_lowercase()
}
