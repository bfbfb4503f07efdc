//! What the code says, for checking the prose: the settings table, every
//! flag of every `spot-worker` command, the variable names the repository
//! reads, the flags of its benches, and the few flags of other tools the
//! docs quote.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use spot_worker::settings::{Describe, parse_duration, table};

use super::help::{Checker, setting_flag};

/// Flags of other tools that the docs' prose quotes, with the tool: a flag
/// quoted in prose must be one of `spot-worker`'s, a setting's, a bench's,
/// or listed here.
pub const OTHER_TOOLS_FLAGS: &[(&str, &str)] = &[
    ("add-host", "podman run"),
    ("network", "podman run"),
    ("runtime", "podman"),
    ("cpuset-cpus", "podman run"),
    ("cgroup-manager", "podman"),
    ("storage-driver", "podman"),
    ("auth-mode", "az storage"),
    ("query", "az"),
    ("scope", "az role assignment create"),
    ("enable-imds-restriction", "az aks create"),
    ("attach-acr", "az aks update"),
    ("exact", "cargo test (libtest)"),
    ("gate", "scripts/run-tests.py"),
    ("nocapture", "cargo test (libtest)"),
    ("release", "cargo"),
    ("profile", "cargo build"),
    ("locked", "cargo install"),
    ("pid", "unshare"),
    ("fork", "unshare"),
    ("mount-proc", "unshare"),
];

/// Where variable names the code reads are looked for.
const SOURCE_DIRS: [&str; 10] = [
    "crates",
    "src",
    "tests",
    "scripts",
    "tools",
    "bicep",
    "deploy",
    "examples",
    "benches",
    "container",
];

/// Where the flags of benches and of the chaos run are parsed.
const BENCH_DIRS: [&str; 3] = ["benches", "crates/testkit/src", "crates/primes/benches"];

pub struct Facts {
    /// Every flag of every `spot-worker` command, without dashes.
    pub command_flags: BTreeSet<String>,
    /// `"--flag"` literals of the benches and the chaos run.
    bench_flags: HashSet<String>,
    /// Upper-case words (`SPOT_WORKER_CHECKPOINT`) in the repository's
    /// sources.
    names: HashSet<String>,
}

impl Facts {
    pub fn gather(root: &Path, checker: &mut Checker) -> Facts {
        let mut names = HashSet::new();
        let mut bench_flags = HashSet::new();
        for dir in SOURCE_DIRS {
            visit(&root.join(dir), &mut |path, text| {
                // The doc runner's own tests name made-up variables.
                if !path.starts_with(root.join("crates/cli/tests/it/docs"))
                    && path != root.join("crates/cli/tests/it/docs.rs")
                {
                    names.extend(upper_words(text).map(str::to_owned));
                }
            });
        }
        for dir in BENCH_DIRS {
            visit(&root.join(dir), &mut |_, text| {
                for (at, _) in text.match_indices("\"--") {
                    let rest = &text[at + 3..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                        .unwrap_or(rest.len());
                    if rest[end..].starts_with('"') && end > 0 {
                        bench_flags.insert(rest[..end].to_owned());
                    }
                }
            });
        }
        Facts {
            command_flags: checker.all_flags(),
            bench_flags,
            names,
        }
    }

    /// Whether a variable named in the docs is a setting or a name the
    /// repository's code uses (the program's environment, test switches).
    pub fn knows_variable(&self, name: &str) -> bool {
        setting_by_key(name).is_some() || self.names.contains(name)
    }

    /// Whether `flag` (without dashes) is one a reader can use somewhere.
    pub fn knows_flag(&self, flag: &str) -> bool {
        self.command_flags.contains(flag)
            || setting_flag(flag)
            || self.bench_flags.contains(flag)
            || OTHER_TOOLS_FLAGS.iter().any(|(f, _)| *f == flag)
    }
}

/// Calls `read` with the path and text of every source file under `dir`.
pub fn visit(dir: &Path, read: &mut dyn FnMut(&Path, &str)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(
                name.as_ref(),
                "target" | "node_modules" | ".venv" | "fixtures" | "__pycache__"
            ) && !name.starts_with('.')
            {
                visit(&path, read);
            }
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            read(&path, &text);
        }
    }
}

/// The words of `text` that look like environment variables.
pub fn upper_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.len() > 2 && w.starts_with(|c: char| c.is_ascii_uppercase()))
}

/// Whether a word names a variable of the kind the docs must get right:
/// spot-worker's own, the Azure SDK's, OpenTelemetry's, Application
/// Insights' or `RUST_LOG`.
pub fn is_variable(word: &str) -> bool {
    word == "RUST_LOG"
        || ["SPOT_WORKER_", "AZURE_", "OTEL_", "APPLICATIONINSIGHTS_"]
            .iter()
            .any(|prefix| word.starts_with(prefix) && word.len() > prefix.len())
}

pub fn setting_by_key(key: &str) -> Option<&'static dyn Describe> {
    table::ALL.iter().copied().find(|s| s.key() == key)
}

/// The TOML key of a setting (`drain_budget`).
fn file_key(key: &str) -> String {
    key.strip_prefix("SPOT_WORKER_")
        .unwrap_or(key)
        .to_ascii_lowercase()
}

pub fn setting_by_file_key(name: &str) -> Option<&'static dyn Describe> {
    table::ALL
        .iter()
        .copied()
        .find(|s| file_key(s.key()) == name)
}

pub fn setting_by_flag(flag: &str) -> Option<&'static dyn Describe> {
    table::ALL
        .iter()
        .copied()
        .find(|s| file_key(s.key()).replace('_', "-") == flag)
}

/// The setting a code span names: its variable, its flag (`--drain-budget`,
/// with or without a value) or its TOML key when that has an `_`
/// (`max_deliveries`; a one-word key such as `queue` is too often
/// something else).
pub fn setting_named(span: &str) -> Option<&'static dyn Describe> {
    let first = span.split_whitespace().next()?;
    let first = first.split('=').next()?;
    if let Some(flag) = first.strip_prefix("--") {
        return setting_by_flag(flag);
    }
    setting_by_key(first).or_else(|| {
        first
            .contains('_')
            .then(|| setting_by_file_key(first))
            .flatten()
    })
}

/// Whether `stated` (a value as the docs write it) is the setting's
/// default: the same text, the same duration, the same number, or none
/// for a setting without one.
pub fn is_default(setting: &dyn Describe, stated: &str) -> bool {
    let stated = bytes(stated.trim().trim_matches('`'));
    let shown = setting.default_text();
    if shown == "—" {
        return matches!(
            stated.to_ascii_lowercase().as_str(),
            "none" | "—" | "-" | ""
        );
    }
    let candidates: Vec<&str> = if shown.contains('`') {
        shown.split('`').skip(1).step_by(2).collect()
    } else {
        vec![shown.as_str()]
    };
    candidates.iter().any(|candidate| {
        if candidate.eq_ignore_ascii_case(&stated) {
            return true;
        }
        if let (Ok(a), Ok(b)) = (candidate.parse::<f64>(), stated.parse::<f64>()) {
            return a == b;
        }
        matches!(
            (parse_duration(candidate), parse_duration(&stated)),
            (Ok(a), Ok(b)) if a == b
        )
    })
}

/// `1MiB` as `1048576`, other text as it is.
fn bytes(text: &str) -> String {
    for (unit, factor) in [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)] {
        if let Some(number) = text.strip_suffix(unit)
            && let Ok(n) = number.trim().parse::<u64>()
        {
            return (n * factor).to_string();
        }
    }
    text.to_owned()
}

/// A value the docs write as a stand-in, not a value: `<port>`, `NAME`,
/// `$VAR`, `...`.
pub fn is_placeholder(value: &str) -> bool {
    value.contains(['<', '$', '…'])
        || value.contains("...")
        || (value.chars().any(|c| c.is_ascii_uppercase())
            && value
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c == '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_compare_as_values() {
        let rows: [(&dyn Describe, &str, bool); 10] = [
            (&table::STORAGE_REFUSAL_GRACE, "30s", true),
            (&table::STORAGE_REFUSAL_GRACE, "30 s", true),
            (&table::STORAGE_REFUSAL_GRACE, "0.5m", true),
            (&table::RELEASE_FLOOR, "3s", false),
            (&table::MAX_DELIVERIES, "100", true),
            (&table::CHECKPOINT_MAX_BYTES, "256GiB", true),
            (&table::CHECKPOINT_MAX_BYTES, "1MiB", false),
            (&table::EVICTION_RATE, "0.05", true),
            (&table::RUNTIME_DIR, "/run/spot-worker", true),
            (&table::TIMEOUT, "none", true),
        ];
        for (setting, stated, expected) in rows {
            assert_eq!(
                is_default(setting, stated),
                expected,
                "{} {stated}",
                setting.key()
            );
        }
        assert!(is_placeholder("NAME") && is_placeholder("0.0.0.0:<port>"));
        assert!(!is_placeholder("jobs") && !is_placeholder("{job_key}.json"));
        assert_eq!(
            setting_named("--drain-budget 20s").map(|s| s.key()),
            Some("SPOT_WORKER_DRAIN_BUDGET")
        );
        assert_eq!(
            setting_named("max_deliveries").map(|s| s.key()),
            Some("SPOT_WORKER_MAX_DELIVERIES")
        );
        assert!(setting_named("queue").is_none());
        let words: Vec<&str> = upper_words("env(\"SPOT_WORKER_X\"); A RUST_LOG").collect();
        assert_eq!(words, ["SPOT_WORKER_X", "RUST_LOG"]);
    }
}
