//! Does a `spot-worker` invocation shown in the docs exist? Its
//! subcommands and flags are checked against the command's own `--help`
//! (clap's definitions, as users see them), and `run`'s settings flags
//! against the settings table they are parsed with.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use spot_worker::settings::table;

/// What `spot-worker <path> --help` lists.
#[derive(Debug, Default, Clone)]
struct Help {
    subcommands: BTreeSet<String>,
    flags: BTreeSet<String>,
}

fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line.trim_end_matches(':');
            continue;
        }
        let trimmed = line.trim_start();
        match section {
            "Commands" => {
                if let Some(name) = trimmed.split_whitespace().next()
                    && line.starts_with("  ")
                    && !line.starts_with("   ")
                {
                    help.subcommands.insert(name.to_owned());
                }
            }
            "Options" | "Arguments" => {
                for word in trimmed.split([' ', ',', '=']).filter(|w| !w.is_empty()) {
                    if let Some(flag) = word.strip_prefix("--")
                        && !flag.is_empty()
                    {
                        help.flags.insert(flag.to_owned());
                    }
                    if !word.starts_with('-') {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    help
}

/// Checks invocations against one `spot-worker` binary, asking each
/// command's `--help` once.
pub struct Checker {
    binary: String,
    helps: HashMap<Vec<String>, Help>,
}

impl Checker {
    pub fn new(binary: &str) -> Self {
        Checker {
            binary: binary.to_owned(),
            helps: HashMap::new(),
        }
    }

    fn help(&mut self, path: &[String]) -> Help {
        if let Some(help) = self.helps.get(path) {
            return help.clone();
        }
        let output = Command::new(&self.binary)
            .args(path)
            .arg("--help")
            .output()
            .expect("spot-worker --help runs");
        assert!(
            output.status.success(),
            "spot-worker {path:?} --help failed"
        );
        let help = parse_help(&String::from_utf8_lossy(&output.stdout));
        self.helps.insert(path.to_vec(), help.clone());
        help
    }

    /// Every flag of every `spot-worker` command (without its dashes),
    /// asking each command's `--help` once.
    pub fn all_flags(&mut self) -> BTreeSet<String> {
        let mut flags = BTreeSet::new();
        let mut pending = vec![Vec::new()];
        while let Some(path) = pending.pop() {
            let help = self.help(&path);
            flags.extend(help.flags.iter().cloned());
            for sub in help.subcommands.iter().filter(|s| *s != "help") {
                let mut next = path.clone();
                next.push(sub.clone());
                pending.push(next);
            }
        }
        flags
    }

    /// Why `args` (what follows `spot-worker`) is not a command the binary
    /// has, if it is not.
    pub fn check(&mut self, args: &[String]) -> Result<(), String> {
        let mut path: Vec<String> = Vec::new();
        let mut help = self.help(&path);
        for raw in args {
            if raw == "--" {
                return Ok(());
            }
            let word = raw.trim_end_matches("...");
            if let Some(flag) = word.strip_prefix("--") {
                let flag = flag.split('=').next().unwrap_or_default();
                let is_setting = path.first().is_some_and(|c| c == "run") && setting_flag(flag);
                if !help.flags.contains(flag) && !is_setting {
                    return Err(format!(
                        "`spot-worker {}` has no flag --{flag}",
                        path.join(" ")
                    ));
                }
            } else if help.subcommands.contains(word) {
                path.push(word.to_owned());
                help = self.help(&path);
            } else if path.is_empty() && !word.starts_with('-') {
                return Err(format!("`spot-worker` has no subcommand {word:?}"));
            }
        }
        Ok(())
    }
}

/// A flag `spot-worker run` reads as a setting (`--job-key` for
/// `SPOT_WORKER_JOB_KEY`), as `Source::with_args` reads it.
pub fn setting_flag(flag: &str) -> bool {
    table::ALL.iter().any(|setting| {
        let key = setting.key();
        key.strip_prefix("SPOT_WORKER_")
            .unwrap_or(key)
            .to_ascii_lowercase()
            .replace('_', "-")
            == flag
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_sections_are_read() {
        let text = "About\n\nUsage: spot-worker events [OPTIONS] [COMMAND]\n\n\
                    Commands:\n  watch    Stream transitions\n           continued\n  help     Print\n\n\
                    Options:\n      --json  The document\n  -h, --help  Print help\n      --listen <LISTEN>  Where\n";
        let help = parse_help(text);
        assert_eq!(
            help.subcommands.iter().collect::<Vec<_>>(),
            ["help", "watch"]
        );
        assert!(help.flags.contains("json") && help.flags.contains("help"));
        assert!(help.flags.contains("listen"));
        assert!(setting_flag("job-key") && setting_flag("queue"));
        assert!(!setting_flag("no-such-setting"));
    }
}
