//! What every benchmark binary (`benches/*.rs`, `harness = false`) does
//! before it measures: read its command line (`cargo bench` passes
//! `--bench`, `cargo test` passes none and may pass test filters: then a
//! benchmark runs a short smoke version instead), log errors to stderr,
//! start a runtime, describe the machine in its banner, bound its waits,
//! and find the Python venv of its baselines.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};

/// As in crates/azure/tests/it/python_interop.rs: `0`, `false` or `disabled`
/// switches the Python baselines off.
pub const PYTHON_SWITCH: &str = "SPOT_WORKER_PYTHON_INTEROP";

/// A benchmark's command line (without the program name).
#[derive(Debug, Clone, Default)]
pub struct BenchArgs {
    args: Vec<String>,
}

impl BenchArgs {
    /// This process's arguments.
    pub fn from_env() -> Self {
        Self::new(std::env::args().skip(1).collect())
    }

    /// Given arguments.
    pub fn new(args: Vec<String>) -> Self {
        BenchArgs { args }
    }

    /// Whether this is a real run (`cargo bench`, which passes `--bench`)
    /// rather than the smoke run of `cargo test`.
    pub fn benchmarking(&self) -> bool {
        self.has("--bench")
    }

    /// Whether `flag` is on the command line.
    pub fn has(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }

    /// What follows `flag` (to its end), if `flag` is there: the arguments
    /// of a re-executed child mode such as `--serve-worker QUEUE`.
    pub fn after(&self, flag: &str) -> Option<&[String]> {
        let at = self.args.iter().position(|a| a == flag)?;
        self.args.get(at + 1..)
    }

    /// All of them.
    pub fn all(&self) -> &[String] {
        &self.args
    }

    /// Hands each argument to `apply`, which takes a flag's value from
    /// [`FlagValue`] when it knows the flag; it ignores what is not its own
    /// (`--bench`, `cargo test`'s filters).
    pub fn each_flag(
        &self,
        mut apply: impl FnMut(&str, &mut FlagValue<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut value = FlagValue {
            args: &self.args,
            next: 0,
            flag: "",
        };
        while let Some(arg) = self.args.get(value.next) {
            value.next += 1;
            value.flag = arg;
            apply(arg, &mut value)?;
        }
        Ok(())
    }
}

/// The value after the flag [`BenchArgs::each_flag`] is at.
#[derive(Debug)]
pub struct FlagValue<'a> {
    args: &'a [String],
    next: usize,
    flag: &'a str,
}

impl FlagValue<'_> {
    /// The next argument, as text.
    pub fn text(&mut self) -> Result<String> {
        let value = self
            .args
            .get(self.next)
            .with_context(|| format!("a value after {}", self.flag))?;
        self.next += 1;
        Ok(value.clone())
    }

    /// The next argument, parsed.
    pub fn parse<T>(&mut self) -> Result<T>
    where
        T: FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let text = self.text()?;
        text.parse()
            .with_context(|| format!("{} {text}: not a valid value", self.flag))
    }

    /// The next argument, a number of seconds (`1.5` allowed).
    pub fn seconds(&mut self) -> Result<Duration> {
        let seconds: f64 = self.parse()?;
        Duration::try_from_secs_f64(seconds)
            .with_context(|| format!("{} {seconds}: not a duration", self.flag))
    }
}

/// Logs errors (or what `RUST_LOG` asks for) to stderr, where they do not
/// mix with the benchmark's tables on stdout.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// A multi-threaded tokio runtime with every driver on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// The `p`th percentile of `times` (nearest rank; zero for none).
pub fn percentile(times: &[Duration], p: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted.get(rank).copied().unwrap_or_default()
}

/// The median of `times` ([`percentile`] 50).
pub fn median(times: &[Duration]) -> Duration {
    percentile(times, 50.0)
}

/// The machine a run's figures come from, for its banner: `N CPUs, load
/// average A B C`.
pub fn machine() -> String {
    format!(
        "{} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        crate::procfs::load_average()
    )
}

/// `future`, or an error naming `what` if it takes longer than `patience`.
pub async fn bounded<T>(
    what: &str,
    patience: Duration,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(patience, future)
        .await
        .with_context(|| format!("{what}: timed out after {patience:?}"))?
}

/// `tools/python` in the workspace: the Python baselines' scripts.
pub fn python_dir() -> PathBuf {
    crate::workspace_root().join("tools/python")
}

/// The venv's interpreter (`SPOT_WORKER_PYTHON`, or `tools/python/.venv`);
/// `None` if [`PYTHON_SWITCH`] turns the Python baselines off. A missing
/// venv is an error otherwise, like in the interop tests.
pub fn python() -> Result<Option<PathBuf>> {
    if python_disabled(std::env::var(PYTHON_SWITCH).ok().as_deref()) {
        return Ok(None);
    }
    let interpreter = std::env::var_os("SPOT_WORKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| python_dir().join(".venv/bin/python"));
    ensure!(
        interpreter.exists(),
        "{} is missing: run scripts/test.sh (or set {PYTHON_SWITCH}=0 to skip the Python baseline)",
        interpreter.display()
    );
    Ok(Some(interpreter))
}

fn python_disabled(switch: Option<&str>) -> bool {
    switch.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "disabled"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> BenchArgs {
        BenchArgs::new(line.split_whitespace().map(str::to_owned).collect())
    }

    #[test]
    fn cargo_bench_passes_bench_and_cargo_test_does_not() {
        assert!(args("--bench --only memory").benchmarking());
        assert!(!args("some_filter --nocapture").benchmarking());
    }

    #[test]
    fn flags_take_their_values_and_the_rest_is_ignored() {
        let mut seen = (0usize, None::<String>, Duration::ZERO);
        args("--bench --messages 12 filter --only redone --idle 1.5 --exact")
            .each_flag(|flag, value| {
                match flag {
                    "--messages" => seen.0 = value.parse()?,
                    "--only" => seen.1 = Some(value.text()?),
                    "--idle" => seen.2 = value.seconds()?,
                    _ => {}
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(
            seen,
            (12, Some("redone".to_owned()), Duration::from_millis(1500))
        );
    }

    #[test]
    fn a_missing_or_bad_value_names_the_flag() {
        let parse = |line: &str| {
            args(line)
                .each_flag(|flag, value| {
                    if flag == "--rounds" {
                        let _: usize = value.parse()?;
                    }
                    Ok(())
                })
                .unwrap_err()
                .to_string()
        };
        assert_eq!(parse("--rounds"), "a value after --rounds");
        assert_eq!(parse("--rounds many"), "--rounds many: not a valid value");
    }

    #[test]
    fn a_child_mode_gets_what_follows_its_flag() {
        let line = args("--serve-worker jobs 100");
        assert_eq!(line.after("--serve-worker"), Some(&line.all()[1..]));
        assert_eq!(line.after("--serve-emulator"), None);
    }

    #[test]
    fn the_python_switch_reads_like_the_interop_tests() {
        for off in ["0", "false", " Disabled "] {
            assert!(python_disabled(Some(off)), "{off}");
        }
        for on in [None, Some("1"), Some("yes")] {
            assert!(!python_disabled(on), "{on:?}");
        }
    }

    #[test]
    fn the_banner_names_cpus_and_load() {
        let banner = machine();
        assert!(banner.contains(" CPUs, load average "), "{banner}");
    }

    #[tokio::test]
    async fn a_wait_past_its_patience_is_an_error_naming_it() {
        let never = bounded("the drain", Duration::from_millis(20), async {
            std::future::pending::<()>().await;
            Ok(())
        });
        let error = never.await.unwrap_err().to_string();
        assert_eq!(error, "the drain: timed out after 20ms");
        let on_time = bounded("quick", Duration::from_secs(1), async { Ok(7) });
        assert_eq!(on_time.await.unwrap(), 7);
    }
}
