//! The worker's configuration: documented defaults, overridden by an optional
//! TOML file, overridden by environment variables, overridden by code.
//!
//! The environment variables are a contract shared by every worker built on
//! spot-worker, so that one deployment (cloud-init, systemd) fits them all.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use spot_worker_storage::MessageEncoding;

use crate::error::ConfigError;

/// Shortest lease: renewals need time to happen before it runs out.
const MIN_VISIBILITY: Duration = Duration::from_secs(5);
/// Longest lease Azure Storage Queues allow.
const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the service manager gives the worker to stop: the unit's
/// `TimeoutStopSec=28s`, two seconds inside Azure's 30-second Preempt notice.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(28);
/// Kept between the end of the longest drain and [`STOP_TIMEOUT`]: the process
/// must also stop its watcher, flush telemetry and close the health server.
pub const EXIT_MARGIN: Duration = Duration::from_secs(2);

/// Path of an optional TOML file with the same settings.
pub const CONFIG_FILE_ENV: &str = "SPOT_WORKER_CONFIG";

/// Everything a worker needs to know besides its handler and backends.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// Queue to consume (`SPOT_WORKER_QUEUE`, default `jobs`); its poison
    /// queue is `<queue>-poison`.
    pub queue: String,
    /// How message text encodes bodies (`SPOT_WORKER_MESSAGE_ENCODING`:
    /// `text`, the default, or `base64` as Azure Functions send).
    pub encoding: MessageEncoding,
    /// Messages handled at once (`SPOT_WORKER_CONCURRENCY`, default: the
    /// number of CPUs).
    pub concurrency: usize,
    /// How long a received message stays hidden; renewed every third of
    /// it, 5 s to 7 days (`SPOT_WORKER_VISIBILITY_TIMEOUT`, default 30s).
    pub visibility_timeout: Duration,
    /// Handler failures before a message goes to the poison queue
    /// (`SPOT_WORKER_MAX_FAILURES`, default 5, at least 1). Evictions and
    /// other releases never count.
    pub max_failures: u32,
    /// Crash-loop guard: deliveries without a recorded outcome (the worker
    /// died or was evicted mid-job) before a message goes to the poison
    /// queue (`SPOT_WORKER_MAX_DELIVERIES`, default 100, at least 1).
    pub max_deliveries: u32,
    /// Longest pause between receives while the queue is empty
    /// (`SPOT_WORKER_IDLE_POLL_MAX`, default 1s). It bounds how long a
    /// message released by an evicted worker waits for an idle one; each
    /// idle worker costs one receive per this interval.
    pub idle_poll_max: Duration,
    /// Blob container for checkpoints (`SPOT_WORKER_CHECKPOINT_CONTAINER`,
    /// default `checkpoints`).
    pub checkpoint_container: String,
    /// Blob container for the originals of poisoned messages too big for
    /// their poison record (`SPOT_WORKER_POISON_CONTAINER`, default `poison`).
    pub poison_container: String,
    /// Where the liveness and readiness endpoints listen
    /// (`SPOT_WORKER_HEALTH_ADDR`, default `127.0.0.1:8080`).
    pub health_addr: SocketAddr,
    /// Scheduled Events settings.
    pub imds: ImdsSettings,
    /// How the worker stops.
    pub shutdown: ShutdownSettings,
    /// Give up (and exit with an error, so the service manager restarts the
    /// worker) if the warmup gate has not opened after this long
    /// (`SPOT_WORKER_GATE_TIMEOUT`; default: wait as long as it takes).
    pub gate_timeout: Option<Duration>,
}

/// Scheduled Events settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ImdsSettings {
    /// Watch Scheduled Events at all (`SPOT_WORKER_IMDS`, `on` by default;
    /// `off` only for machines that are not Azure VMs).
    pub enabled: bool,
    /// IMDS base URL (`SPOT_WORKER_IMDS_ENDPOINT`, default
    /// `http://169.254.169.254`).
    pub endpoint: String,
    /// This VM's name in `Resources` (`SPOT_WORKER_VM_NAME`; default: asked
    /// from instance metadata).
    pub vm_name: Option<String>,
    /// Poll interval (`SPOT_WORKER_IMDS_POLL_INTERVAL`, default 1s).
    pub poll_interval: Duration,
}

/// How the worker stops.
#[derive(Debug, Clone, PartialEq)]
pub struct ShutdownSettings {
    /// Time kept in hand before the hard deadline: handlers still running
    /// this long before it are dropped and their messages released
    /// (`SPOT_WORKER_RELEASE_MARGIN`, default 3s).
    pub release_margin: Duration,
    /// The time releasing in-flight messages always gets before the watchdog
    /// may end the process, however late the notice (already started, or
    /// `NotBefore` passed): one release request per message, concurrently
    /// (`SPOT_WORKER_RELEASE_FLOOR`, default 2s, at most `release_margin`).
    pub release_floor: Duration,
    /// The longest a drain may take after any notice, whatever `NotBefore`
    /// says (`SPOT_WORKER_DRAIN_BUDGET`, default 25s). The rule: the longest
    /// drain ([`longest_drain`](Self::longest_drain)) plus [`EXIT_MARGIN`]
    /// must fit in the unit's [`STOP_TIMEOUT`] (28 s), itself inside Azure's
    /// 30 s Preempt notice; so at most 26s.
    pub drain_budget: Duration,
    /// Approve the Scheduled Event that caused the drain once drained, so
    /// Azure may proceed at once (`SPOT_WORKER_APPROVE_EVENTS`, default on).
    /// Only an event whose `Resources` is exactly this VM is approved, unless
    /// `approve_shared_events` is on.
    pub approve_events: bool,
    /// Also approve events that list other VMs besides this one
    /// (`SPOT_WORKER_APPROVE_SHARED_EVENTS`, default off). Approving starts
    /// the event for every VM it lists, cutting their notice short: turn it
    /// on only when the other VMs need no notice (or do not run workers).
    pub approve_shared_events: bool,
    /// End the process if the drain overruns its hard deadline
    /// (`SPOT_WORKER_WATCHDOG`, default on). Off in tests that run a worker
    /// inside the test process.
    pub watchdog: bool,
    /// Drain on SIGTERM and SIGINT (default on).
    pub handle_signals: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            queue: "jobs".to_owned(),
            encoding: MessageEncoding::Text,
            concurrency: std::thread::available_parallelism().map_or(1, usize::from),
            visibility_timeout: Duration::from_secs(30),
            max_failures: 5,
            max_deliveries: 100,
            idle_poll_max: Duration::from_secs(1),
            checkpoint_container: "checkpoints".to_owned(),
            poison_container: "poison".to_owned(),
            health_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            imds: ImdsSettings {
                enabled: true,
                endpoint: spot_worker_imds::DEFAULT_ENDPOINT.to_owned(),
                vm_name: None,
                poll_interval: Duration::from_secs(1),
            },
            shutdown: ShutdownSettings {
                release_margin: Duration::from_secs(3),
                release_floor: Duration::from_secs(2),
                drain_budget: Duration::from_secs(25),
                approve_events: true,
                approve_shared_events: false,
                watchdog: true,
                handle_signals: true,
            },
            gate_timeout: None,
        }
    }
}

/// The TOML file: the same settings, all optional, named like the
/// environment variables without the `SPOT_WORKER_` prefix, in lower case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    queue: Option<String>,
    message_encoding: Option<String>,
    concurrency: Option<usize>,
    visibility_timeout: Option<String>,
    max_failures: Option<u32>,
    max_deliveries: Option<u32>,
    idle_poll_max: Option<String>,
    checkpoint_container: Option<String>,
    poison_container: Option<String>,
    health_addr: Option<String>,
    imds: Option<String>,
    imds_endpoint: Option<String>,
    vm_name: Option<String>,
    imds_poll_interval: Option<String>,
    release_margin: Option<String>,
    release_floor: Option<String>,
    drain_budget: Option<String>,
    approve_events: Option<bool>,
    approve_shared_events: Option<bool>,
    watchdog: Option<bool>,
    gate_timeout: Option<String>,
}

impl WorkerConfig {
    /// Defaults, then the TOML file named by `SPOT_WORKER_CONFIG` (if set),
    /// then the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `lookup`
    /// (for tests and for callers with their own source of settings).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = WorkerConfig::default();
        if let Some(path) = lookup(CONFIG_FILE_ENV).filter(|p| !p.trim().is_empty()) {
            config.apply_file(Path::new(path.trim()))?;
        }
        config.apply(|name| lookup(&format!("SPOT_WORKER_{name}")), Source::Env)?;
        config.validate()?;
        Ok(config)
    }

    /// Applies a TOML file on top of this configuration.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::File {
            path: path.to_owned(),
            source,
        })?;
        self.apply_toml(&text, path)
    }

    fn apply_toml(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Toml {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let value = |name: &str| -> Option<String> {
            match name {
                "QUEUE" => file.queue.clone(),
                "MESSAGE_ENCODING" => file.message_encoding.clone(),
                "CONCURRENCY" => file.concurrency.map(|n| n.to_string()),
                "VISIBILITY_TIMEOUT" => file.visibility_timeout.clone(),
                "MAX_FAILURES" => file.max_failures.map(|n| n.to_string()),
                "MAX_DELIVERIES" => file.max_deliveries.map(|n| n.to_string()),
                "IDLE_POLL_MAX" => file.idle_poll_max.clone(),
                "CHECKPOINT_CONTAINER" => file.checkpoint_container.clone(),
                "POISON_CONTAINER" => file.poison_container.clone(),
                "HEALTH_ADDR" => file.health_addr.clone(),
                "IMDS" => file.imds.clone(),
                "IMDS_ENDPOINT" => file.imds_endpoint.clone(),
                "VM_NAME" => file.vm_name.clone(),
                "IMDS_POLL_INTERVAL" => file.imds_poll_interval.clone(),
                "RELEASE_MARGIN" => file.release_margin.clone(),
                "RELEASE_FLOOR" => file.release_floor.clone(),
                "DRAIN_BUDGET" => file.drain_budget.clone(),
                "APPROVE_EVENTS" => file.approve_events.map(|b| b.to_string()),
                "APPROVE_SHARED_EVENTS" => file.approve_shared_events.map(|b| b.to_string()),
                "WATCHDOG" => file.watchdog.map(|b| b.to_string()),
                "GATE_TIMEOUT" => file.gate_timeout.clone(),
                _ => None,
            }
        };
        self.apply(value, Source::File(path.to_owned()))
    }

    /// Applies every setting `value` knows, by its variable name without
    /// the `SPOT_WORKER_` prefix.
    fn apply(
        &mut self,
        value: impl Fn(&str) -> Option<String>,
        source: Source,
    ) -> Result<(), ConfigError> {
        let get = |name: &str| {
            value(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let invalid = |name: &str, value: &str, reason: String| ConfigError::Invalid {
            setting: source.name(name),
            value: value.to_owned(),
            reason,
        };
        if let Some(v) = get("QUEUE") {
            self.queue = v;
        }
        if let Some(v) = get("MESSAGE_ENCODING") {
            self.encoding = match v.to_ascii_lowercase().as_str() {
                "text" => MessageEncoding::Text,
                "base64" => MessageEncoding::Base64,
                _ => {
                    return Err(invalid(
                        "MESSAGE_ENCODING",
                        &v,
                        "use `text` or `base64`".into(),
                    ));
                }
            };
        }
        if let Some(v) = get("CONCURRENCY") {
            self.concurrency = v
                .parse()
                .map_err(|e| invalid("CONCURRENCY", &v, format!("{e}")))?;
        }
        if let Some(v) = get("VISIBILITY_TIMEOUT") {
            self.visibility_timeout =
                parse_duration(&v).map_err(|e| invalid("VISIBILITY_TIMEOUT", &v, e))?;
        }
        if let Some(v) = get("MAX_FAILURES") {
            self.max_failures = v
                .parse()
                .map_err(|e| invalid("MAX_FAILURES", &v, format!("{e}")))?;
        }
        if let Some(v) = get("MAX_DELIVERIES") {
            self.max_deliveries = v
                .parse()
                .map_err(|e| invalid("MAX_DELIVERIES", &v, format!("{e}")))?;
        }
        if let Some(v) = get("IDLE_POLL_MAX") {
            self.idle_poll_max = parse_duration(&v).map_err(|e| invalid("IDLE_POLL_MAX", &v, e))?;
        }
        if let Some(v) = get("POISON_CONTAINER") {
            self.poison_container = v;
        }
        if let Some(v) = get("CHECKPOINT_CONTAINER") {
            self.checkpoint_container = v;
        }
        if let Some(v) = get("HEALTH_ADDR") {
            self.health_addr = v
                .parse()
                .map_err(|e| invalid("HEALTH_ADDR", &v, format!("{e} (use IP:PORT)")))?;
        }
        if let Some(v) = get("IMDS") {
            self.imds.enabled = parse_switch(&v).map_err(|e| invalid("IMDS", &v, e))?;
        }
        if let Some(v) = get("IMDS_ENDPOINT") {
            self.imds.endpoint = v;
        }
        if let Some(v) = get("VM_NAME") {
            self.imds.vm_name = Some(v);
        }
        if let Some(v) = get("IMDS_POLL_INTERVAL") {
            self.imds.poll_interval =
                parse_duration(&v).map_err(|e| invalid("IMDS_POLL_INTERVAL", &v, e))?;
        }
        if let Some(v) = get("RELEASE_MARGIN") {
            self.shutdown.release_margin =
                parse_duration(&v).map_err(|e| invalid("RELEASE_MARGIN", &v, e))?;
        }
        if let Some(v) = get("RELEASE_FLOOR") {
            self.shutdown.release_floor =
                parse_duration(&v).map_err(|e| invalid("RELEASE_FLOOR", &v, e))?;
        }
        if let Some(v) = get("DRAIN_BUDGET") {
            self.shutdown.drain_budget =
                parse_duration(&v).map_err(|e| invalid("DRAIN_BUDGET", &v, e))?;
        }
        if let Some(v) = get("APPROVE_EVENTS") {
            self.shutdown.approve_events =
                parse_switch(&v).map_err(|e| invalid("APPROVE_EVENTS", &v, e))?;
        }
        if let Some(v) = get("APPROVE_SHARED_EVENTS") {
            self.shutdown.approve_shared_events =
                parse_switch(&v).map_err(|e| invalid("APPROVE_SHARED_EVENTS", &v, e))?;
        }
        if let Some(v) = get("WATCHDOG") {
            self.shutdown.watchdog = parse_switch(&v).map_err(|e| invalid("WATCHDOG", &v, e))?;
        }
        if let Some(v) = get("GATE_TIMEOUT") {
            self.gate_timeout =
                Some(parse_duration(&v).map_err(|e| invalid("GATE_TIMEOUT", &v, e))?);
        }
        Ok(())
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                setting: setting.to_owned(),
                value,
                reason: reason.to_owned(),
            })
        };
        if self.queue.is_empty() {
            return invalid("queue", String::new(), "a queue name is required");
        }
        if self.concurrency == 0 {
            return invalid("concurrency", "0".into(), "at least one message at a time");
        }
        if !(MIN_VISIBILITY..=MAX_VISIBILITY).contains(&self.visibility_timeout) {
            return invalid(
                "visibility_timeout",
                format!("{:?}", self.visibility_timeout),
                "must be between 5 s (time to renew) and 7 days (Azure's limit)",
            );
        }
        if self.idle_poll_max < Duration::from_millis(200) {
            return invalid(
                "idle_poll_max",
                format!("{:?}", self.idle_poll_max),
                "at least 200ms (the first pause after an empty receive)",
            );
        }
        if self.max_failures == 0 {
            return invalid(
                "SPOT_WORKER_MAX_FAILURES",
                "0".into(),
                "at least 1 (the first failure then poisons the message)",
            );
        }
        if self.max_deliveries == 0 {
            return invalid(
                "SPOT_WORKER_MAX_DELIVERIES",
                "0".into(),
                "at least 1; keep it high: evictions count towards this crash-loop guard",
            );
        }
        self.shutdown.validate()
    }
}

impl ShutdownSettings {
    /// The longest a drain can take from its notice to its hard deadline:
    /// the drain budget, or the release margin plus the release floor when a
    /// short notice stretches the release past the time left.
    pub fn longest_drain(&self) -> Duration {
        self.drain_budget
            .max(self.release_margin + self.release_floor)
    }

    /// Checks that the drain fits the stop timeout and its stages fit the
    /// drain.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: Duration, reason: String| {
            Err(ConfigError::Invalid {
                setting: setting.to_owned(),
                value: format!("{value:?}"),
                reason,
            })
        };
        if self.release_floor < Duration::from_millis(100) {
            return invalid(
                "SPOT_WORKER_RELEASE_FLOOR",
                self.release_floor,
                "at least 100ms: releasing takes one request per message".into(),
            );
        }
        if self.release_floor > self.release_margin {
            return invalid(
                "SPOT_WORKER_RELEASE_FLOOR",
                self.release_floor,
                format!(
                    "at most SPOT_WORKER_RELEASE_MARGIN ({:?})",
                    self.release_margin
                ),
            );
        }
        if self.drain_budget <= self.release_margin {
            return invalid(
                "SPOT_WORKER_DRAIN_BUDGET",
                self.drain_budget,
                format!(
                    "must be longer than SPOT_WORKER_RELEASE_MARGIN ({:?})",
                    self.release_margin
                ),
            );
        }
        if self.longest_drain() + EXIT_MARGIN > STOP_TIMEOUT {
            return invalid(
                "SPOT_WORKER_DRAIN_BUDGET",
                self.drain_budget,
                format!(
                    "the drain ({:?} at most) plus {EXIT_MARGIN:?} to exit must fit in the \
                     service's stop timeout (TimeoutStopSec={}s), inside Azure's 30 s notice",
                    self.longest_drain(),
                    STOP_TIMEOUT.as_secs()
                ),
            );
        }
        Ok(())
    }
}

/// Where a setting came from, for error messages.
enum Source {
    Env,
    File(PathBuf),
}

impl Source {
    fn name(&self, setting: &str) -> String {
        match self {
            Source::Env => format!("SPOT_WORKER_{setting}"),
            Source::File(path) => format!("{} in {}", setting.to_ascii_lowercase(), path.display()),
        }
    }
}

/// Parses `1s`, `250ms`, `2m` or a bare number of seconds.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_runtime::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 1s, 250ms or 2m"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s or m)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn parse_switch(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err("use on or off".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<WorkerConfig, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WorkerConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn documented_defaults() {
        let c = config(&[]).unwrap();
        assert_eq!(c.queue, "jobs");
        assert_eq!(c.encoding, MessageEncoding::Text);
        assert_eq!(c.health_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.imds.endpoint, "http://169.254.169.254");
        assert!(c.imds.enabled && c.shutdown.approve_events && c.shutdown.watchdog);
        assert!(c.concurrency >= 1);
    }

    #[test]
    fn environment_overrides() {
        let c = config(&[
            ("SPOT_WORKER_QUEUE", "primes"),
            ("SPOT_WORKER_MESSAGE_ENCODING", "BASE64"),
            ("SPOT_WORKER_CONCURRENCY", "32"),
            ("SPOT_WORKER_HEALTH_ADDR", "0.0.0.0:9000"),
            ("SPOT_WORKER_IMDS_ENDPOINT", "http://127.0.0.1:8089"),
            ("SPOT_WORKER_DRAIN_BUDGET", "20s"),
            ("SPOT_WORKER_IMDS", "off"),
        ])
        .unwrap();
        assert_eq!(c.queue, "primes");
        assert_eq!(c.encoding, MessageEncoding::Base64);
        assert_eq!(c.concurrency, 32);
        assert_eq!(c.health_addr.port(), 9000);
        assert_eq!(c.imds.endpoint, "http://127.0.0.1:8089");
        assert_eq!(c.shutdown.drain_budget, Duration::from_secs(20));
        assert!(!c.imds.enabled);
    }

    #[test]
    fn the_file_sits_between_defaults_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(
            &path,
            "queue = \"from-file\"\nconcurrency = 3\nwatchdog = false\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let c = config(&[(CONFIG_FILE_ENV, file), ("SPOT_WORKER_CONCURRENCY", "7")]).unwrap();
        assert_eq!(c.queue, "from-file");
        assert_eq!(c.concurrency, 7, "the environment wins");
        assert!(!c.shutdown.watchdog);
    }

    #[test]
    fn the_drain_must_fit_the_stop_timeout() {
        // (drain budget, release margin, release floor, accepted)
        let table = [
            ("25s", "3s", "2s", true),
            ("26s", "3s", "2s", true),
            ("27s", "3s", "2s", false),
            ("30s", "3s", "2s", false),
            ("5s", "3s", "3s", true),
            ("3s", "3s", "2s", false),
            ("10s", "3s", "4s", false),
            ("10s", "3s", "50ms", false),
        ];
        for (budget, margin, floor, accepted) in table {
            let result = config(&[
                ("SPOT_WORKER_DRAIN_BUDGET", budget),
                ("SPOT_WORKER_RELEASE_MARGIN", margin),
                ("SPOT_WORKER_RELEASE_FLOOR", floor),
            ]);
            assert_eq!(
                result.is_ok(),
                accepted,
                "{budget} {margin} {floor}: {result:?}"
            );
            if let Err(err) = result {
                let text = err.to_string();
                assert!(
                    text.contains("SPOT_WORKER_DRAIN_BUDGET")
                        || text.contains("SPOT_WORKER_RELEASE_FLOOR"),
                    "{text}"
                );
            }
        }
        let err = config(&[("SPOT_WORKER_DRAIN_BUDGET", "27s")]).unwrap_err();
        assert!(err.to_string().contains("TimeoutStopSec=28s"), "{err}");
    }

    #[test]
    fn shared_events_are_approved_only_when_asked() {
        assert!(!config(&[]).unwrap().shutdown.approve_shared_events);
        let c = config(&[("SPOT_WORKER_APPROVE_SHARED_EVENTS", "on")]).unwrap();
        assert!(c.shutdown.approve_shared_events);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(
            &path,
            "approve_shared_events = true\nrelease_floor = \"1s\"\n",
        )
        .unwrap();
        let c = config(&[(CONFIG_FILE_ENV, path.to_str().unwrap())]).unwrap();
        assert!(c.shutdown.approve_shared_events);
        assert_eq!(c.shutdown.release_floor, Duration::from_secs(1));
    }

    #[test]
    fn bad_values_say_which_setting_and_why() {
        let err = config(&[("SPOT_WORKER_CONCURRENCY", "many")]).unwrap_err();
        assert!(err.to_string().contains("SPOT_WORKER_CONCURRENCY"), "{err}");
        let err = config(&[("SPOT_WORKER_MESSAGE_ENCODING", "utf16")]).unwrap_err();
        assert!(err.to_string().contains("text` or `base64"), "{err}");
        let err = config(&[("SPOT_WORKER_CONCURRENCY", "0")]).unwrap_err();
        assert!(err.to_string().contains("concurrency"), "{err}");
        let err = config(&[("SPOT_WORKER_VISIBILITY_TIMEOUT", "2s")]).unwrap_err();
        assert!(err.to_string().contains("between 5 s"), "{err}");
        for setting in ["SPOT_WORKER_MAX_FAILURES", "SPOT_WORKER_MAX_DELIVERIES"] {
            let err = config(&[(setting, "0")]).unwrap_err();
            assert!(err.to_string().contains(setting), "{err}");
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(&path, "queue = \"q\"\ntypo = 1\n").unwrap();
        let err = config(&[(CONFIG_FILE_ENV, path.to_str().unwrap())]).unwrap_err();
        assert!(err.to_string().contains("typo"), "{err}");
        let err = config(&[(CONFIG_FILE_ENV, "/nonexistent/worker.toml")]).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/worker.toml"),
            "{err}"
        );
    }
}
