//! Where settings' values come from: flags (or code), the environment, the
//! TOML file, then the defaults of [the table](crate::table).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::SettingError;
use crate::setting::{Describe, Setting, file_key};
use crate::table;
use crate::value::SettingValue;

/// The variable naming the optional TOML file.
pub const CONFIG_FILE: &str = "SPOT_WORKER_CONFIG";

/// Where a value came from, so an error names what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag, or code.
    Flag(String),
    /// An environment variable.
    Env(&'static str),
    /// A key of the TOML file.
    File {
        /// The key.
        key: String,
        /// The file.
        path: PathBuf,
    },
    /// The table's default.
    Default(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "--{flag}"),
            Origin::Env(key) => f.write_str(key),
            Origin::File { key, path } => write!(f, "{key} in {}", path.display()),
            Origin::Default(key) => write!(f, "the default of {key}"),
        }
    }
}

type Lookup = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The values of every setting, layered: flags, environment, file, defaults.
pub struct Source {
    flags: BTreeMap<&'static str, (String, String)>,
    env: Lookup,
    file: Option<(PathBuf, BTreeMap<String, String>)>,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets (connection strings): name the layers only.
        f.debug_struct("Source")
            .field("flags", &self.flags.keys().collect::<Vec<_>>())
            .field("file", &self.file.as_ref().map(|(path, _)| path))
            .finish_non_exhaustive()
    }
}

impl Source {
    /// The process environment, and the file it names in
    /// `SPOT_WORKER_CONFIG` if any.
    pub fn from_env() -> Result<Source, SettingError> {
        Source::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `lookup`
    /// (for tests, and for callers with their own source of variables).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Source, SettingError> {
        let mut source = Source {
            flags: BTreeMap::new(),
            env: Box::new(lookup),
            file: None,
        };
        if let Some(path) = (source.env)(CONFIG_FILE).filter(|p| !p.trim().is_empty()) {
            source.file = Some(read_file(Path::new(path.trim()))?);
        }
        Ok(source)
    }

    /// Defaults only: no environment, no file.
    pub fn defaults() -> Source {
        Source {
            flags: BTreeMap::new(),
            env: Box::new(|_| None),
            file: None,
        }
    }

    /// Sets `setting` from a command-line flag (or code), above every other
    /// layer. A blank value still counts as unset.
    pub fn with_flag<T: SettingValue>(mut self, setting: &Setting<T>, text: &str) -> Source {
        self.flags
            .insert(setting.key, (setting.flag(), text.to_owned()));
        self
    }

    /// Reads command-line flags for any setting of the table:
    /// `--drain-budget 20s` or `--drain-budget=20s` (see
    /// [`Setting::flag`]), above every other layer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use spot_worker_settings::{Source, table};
    ///
    /// let args = ["--drain-budget=20s", "--queue", "orders"].map(String::from);
    /// let source = Source::defaults().with_args(args)?;
    /// assert_eq!(source.get(&table::DRAIN_BUDGET)?, Duration::from_secs(20));
    /// assert_eq!(source.get(&table::QUEUE)?, "orders");
    /// assert!(Source::defaults().with_args(["--drain".to_owned()]).is_err());
    /// # Ok::<(), spot_worker_settings::SettingError>(())
    /// ```
    pub fn with_args(
        mut self,
        args: impl IntoIterator<Item = String>,
    ) -> Result<Source, SettingError> {
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let unknown = |reason: &str| SettingError::Flag {
                flag: arg.clone(),
                reason: reason.to_owned(),
            };
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(unknown("expected --setting value"));
            };
            let (flag, inline) = match flag.split_once('=') {
                Some((flag, value)) => (flag, Some(value.to_owned())),
                None => (flag, None),
            };
            let setting = table::ALL
                .iter()
                .find(|setting| file_key(setting.key()).replace('_', "-") == flag)
                .ok_or_else(|| unknown("not a setting (see --help)"))?;
            let value = match inline {
                Some(value) => value,
                None => args.next().ok_or_else(|| unknown("needs a value"))?,
            };
            setting
                .check(value.trim())
                .map_err(|reason| SettingError::Invalid {
                    setting: format!("--{flag}"),
                    value: value.clone(),
                    reason,
                })?;
            self.flags.insert(setting.key(), (flag.to_owned(), value));
        }
        Ok(self)
    }

    /// Refuses a credential ([`Setting::secret`]) given as a flag: a
    /// command line is readable by every process on the machine, whatever
    /// the process does to hide its memory, so a program started by the
    /// worker would see it in `/proc/<ppid>/cmdline`. The error says to use
    /// the environment or a managed identity.
    ///
    /// ```
    /// use spot_worker_settings::{Source, SettingError};
    ///
    /// let args = ["--azure-storage-connection-string", "AccountKey=k"].map(String::from);
    /// let refused = Source::defaults().with_args(args)?.without_secret_flags();
    /// assert!(matches!(refused, Err(SettingError::SecretFlag { .. })));
    /// let args = ["--queue", "orders"].map(String::from);
    /// assert!(Source::defaults().with_args(args)?.without_secret_flags().is_ok());
    /// # Ok::<(), SettingError>(())
    /// ```
    pub fn without_secret_flags(self) -> Result<Source, SettingError> {
        let given = table::ALL
            .iter()
            .filter(|setting| setting.secret())
            .find_map(|setting| Some((setting.key(), self.flags.get(setting.key())?)));
        match given {
            Some((key, (flag, _))) => Err(SettingError::SecretFlag {
                flag: format!("--{flag}"),
                key,
            }),
            None => Ok(self),
        }
    }

    /// The text given for `key`, trimmed, and where it came from; `None`
    /// when no layer gives a value that is not blank.
    pub fn text(&self, key: &'static str) -> Option<(String, Origin)> {
        let given = |text: &str| Some(text.trim().to_owned()).filter(|t| !t.is_empty());
        if let Some((flag, text)) = self.flags.get(key)
            && let Some(text) = given(text)
        {
            return Some((text, Origin::Flag(flag.clone())));
        }
        if let Some(text) = (self.env)(key).as_deref().and_then(given) {
            return Some((text, Origin::Env(key)));
        }
        let (path, values) = self.file.as_ref()?;
        let file_key = file_key(key);
        let text = values.get(&file_key).and_then(|t| given(t))?;
        Some((
            text,
            Origin::File {
                key: file_key,
                path: path.clone(),
            },
        ))
    }

    /// The value of `setting`: given, or its default.
    pub fn get<T: SettingValue>(&self, setting: &Setting<T>) -> Result<T, SettingError> {
        match self.text(setting.key) {
            Some((text, origin)) => T::parse(&text).map_err(|reason| SettingError::Invalid {
                setting: origin.to_string(),
                value: text,
                reason,
            }),
            None => Ok(setting.default.clone()),
        }
    }

    /// An error for a value of `setting` that parses but cannot work,
    /// naming where it came from.
    pub fn invalid<T: SettingValue>(
        &self,
        setting: &Setting<T>,
        reason: impl Into<String>,
    ) -> SettingError {
        let (value, origin) = self
            .text(setting.key)
            .unwrap_or_else(|| (setting.default_text(), Origin::Default(setting.key)));
        SettingError::Invalid {
            setting: origin.to_string(),
            value,
            reason: reason.into(),
        }
    }
}

/// Reads the TOML file: flat, every key a setting of the table.
fn read_file(path: &Path) -> Result<(PathBuf, BTreeMap<String, String>), SettingError> {
    let text = std::fs::read_to_string(path).map_err(|source| SettingError::File {
        path: path.to_owned(),
        source,
    })?;
    let bad = |message: String| SettingError::Toml {
        path: path.to_owned(),
        message,
    };
    let document: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let known: BTreeMap<String, &dyn Describe> = table::ALL
        .iter()
        .map(|setting| (file_key(setting.key()), *setting))
        .collect();
    let mut values = BTreeMap::new();
    for (key, value) in document {
        if !known.contains_key(&key) {
            return Err(bad(format!(
                "unknown key `{key}` (keys are the variables of the settings table in lower \
                 case without SPOT_WORKER_, e.g. `drain_budget`, `rust_log`)"
            )));
        }
        let text = match value {
            toml::Value::String(text) => text,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(bad(format!(
                    "`{key}` is a {}; settings are strings, numbers or booleans",
                    other.type_str()
                )));
            }
        };
        values.insert(key, text);
    }
    Ok((path.to_owned(), values))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_credential_as_a_flag_is_refused_without_echoing_it() {
        let rows: [(&[&str], Option<&str>); 4] = [
            (&["--queue", "q"], None),
            (
                &["--azure-storage-connection-string", "AccountKey=sekrit"],
                Some("AZURE_STORAGE_CONNECTION_STRING"),
            ),
            (
                &["--applicationinsights-connection-string=InstrumentationKey=sekrit"],
                Some("APPLICATIONINSIGHTS_CONNECTION_STRING"),
            ),
            (
                &["--storage-account-url", "https://a.blob.core.windows.net"],
                None,
            ),
        ];
        for (args, refused) in rows {
            let given = args.iter().map(|&a| a.to_owned());
            let checked = Source::defaults()
                .with_args(given)
                .unwrap()
                .without_secret_flags();
            match (checked, refused) {
                (Ok(_), None) => {}
                (Err(e @ SettingError::SecretFlag { .. }), Some(key)) => {
                    let shown = e.to_string();
                    assert!(
                        shown.contains(&format!("set {key} in the worker's environment")),
                        "{shown}"
                    );
                    assert!(shown.contains("managed identity"), "{shown}");
                    assert!(!shown.contains("sekrit"), "{shown}");
                }
                (other, _) => panic!("{args:?}: {:?}", other.map(drop)),
            }
        }
    }

    fn source_with_file(toml: &str, env: &'static [(&'static str, &'static str)]) -> Source {
        let dir = std::env::temp_dir().join(format!("settings-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.toml", toml.len()));
        std::fs::write(&path, toml).unwrap();
        let path = path.to_string_lossy().into_owned();
        Source::from_lookup(move |name| {
            if name == CONFIG_FILE {
                return Some(path.clone());
            }
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    }

    #[test]
    fn flags_beat_the_environment_which_beats_the_file_which_beats_the_default() {
        let source = source_with_file(
            "drain_budget = \"10s\"\nrelease_margin = \"4s\"\nrelease_floor = 1\n",
            &[
                ("SPOT_WORKER_DRAIN_BUDGET", "20s"),
                ("SPOT_WORKER_RELEASE_MARGIN", "5s"),
            ],
        )
        .with_flag(&table::DRAIN_BUDGET, "15s");
        assert_eq!(
            source.get(&table::DRAIN_BUDGET).unwrap(),
            Duration::from_secs(15)
        );
        assert_eq!(
            source.get(&table::RELEASE_MARGIN).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            source.get(&table::RELEASE_FLOOR).unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            source.get(&table::IDLE_POLL_MAX).unwrap(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn blank_counts_as_unset_in_every_layer() {
        let source = source_with_file("queue = \" \"\n", &[("SPOT_WORKER_QUEUE", "")])
            .with_flag(&table::QUEUE, "  ");
        assert_eq!(source.get(&table::QUEUE).unwrap(), "jobs");
        assert_eq!(source.get(&table::VM_NAME).unwrap(), None);
    }

    #[test]
    fn errors_name_where_the_value_came_from() {
        let env = Source::from_lookup(|name| {
            (name == "SPOT_WORKER_WATCHDOG").then(|| "sometimes".to_owned())
        })
        .unwrap();
        let err = env.get(&table::WATCHDOG).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid SPOT_WORKER_WATCHDOG = \"sometimes\""),
            "{err}"
        );

        let file = source_with_file("max_failures = \"many\"\n", &[]);
        let err = file.get(&table::MAX_FAILURES).unwrap_err().to_string();
        assert!(err.contains("max_failures in "), "{err}");

        let flag = Source::defaults().with_flag(&table::CONCURRENCY, "lots");
        let err = flag.get(&table::CONCURRENCY).unwrap_err().to_string();
        assert!(err.contains("--concurrency"), "{err}");
    }

    #[test]
    fn the_file_takes_only_the_tables_keys() {
        let dir = std::env::temp_dir().join(format!("settings-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (toml, expected) in [
            ("typo = 1\n", "unknown key `typo`"),
            ("[imds]\npoll = 1\n", "`imds` is a table"),
            ("queue = \n", "invalid"),
        ] {
            let path = dir.join("bad.toml");
            std::fs::write(&path, toml).unwrap();
            let path = path.to_string_lossy().into_owned();
            let err = Source::from_lookup(move |name| (name == CONFIG_FILE).then(|| path.clone()))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{toml:?}: {err}");
        }
        let err = Source::from_lookup(|name| {
            (name == CONFIG_FILE).then(|| "/nonexistent/worker.toml".to_owned())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/worker.toml"), "{err}");
        let ok = source_with_file(
            "rust_log = \"debug\"\notel_service_name = \"x\"\nazure_storage_connection_string = \"y\"\n",
            &[],
        );
        assert_eq!(ok.get(&table::LOG_FILTER).unwrap(), "debug");
    }
}
