//! The worker's configuration, read from [the settings
//! table](spot_worker_settings::table): defaults, then an optional TOML
//! file, then environment variables, then code.
//!
//! The environment variables are a contract shared by every worker built on
//! spot-worker, so that one deployment (cloud-init, systemd) fits them all.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use spot_worker_decisions::cadence::IntervalSource;
use spot_worker_decisions::lanes::{Lane, LanePolicy};
use spot_worker_settings::{Source, table};
use spot_worker_storage::MessageEncoding;

use crate::error::ConfigError;

mod drain;
mod lanes;

pub use drain::{DrainSettings, EXIT_MARGIN, STOP_TIMEOUT};
pub use lanes::{DEFAULT_PRICE_RATIO, LaneSettings};
use lanes::{lane, lane_policy, price_ratio};

/// Shortest lease: renewals need time to happen before it runs out.
const MIN_VISIBILITY: Duration = Duration::from_secs(5);
/// Longest lease Azure Storage Queues allow.
const MAX_VISIBILITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Path of an optional TOML file with the same settings.
pub const CONFIG_FILE_ENV: &str = spot_worker_settings::CONFIG_FILE;

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
    /// Crash-loop guard: deliveries without a recorded outcome (no
    /// failure, wait for a peer or release on shutdown: the worker died,
    /// lost its lease, waited for the checkpoint store, or could not record
    /// its release in time) before a message goes to the poison queue
    /// (`SPOT_WORKER_MAX_DELIVERIES`, default 100, at least 1). Evictions
    /// are recorded as releases and do not count.
    pub max_deliveries: u32,
    /// Longest pause between receives while the queue is empty
    /// (`SPOT_WORKER_IDLE_POLL_MAX`, default 1s). It bounds how long a
    /// message released by an evicted worker waits for an idle one; each
    /// idle worker costs one receive per this interval.
    pub idle_poll_max: Duration,
    /// How long the checkpoint store may refuse one kind of request
    /// (401/403) or miss its container before the worker turns not ready
    /// (the reason in `/readyz`) and pauses intake
    /// (`SPOT_WORKER_STORAGE_REFUSAL_GRACE`, default 30s). Shorter refusals
    /// are waited out uncounted, like outages.
    pub storage_refusal_grace: Duration,
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
    pub drain: DrainSettings,
    /// Give up (and exit with an error, so the service manager restarts the
    /// worker) if the warmup gate has not opened after this long
    /// (`SPOT_WORKER_GATE_TIMEOUT`; default: wait as long as it takes).
    pub gate_timeout: Option<Duration>,
    /// A fixed checkpoint interval for [`JobCheckpoint::is_due`]
    /// (`SPOT_WORKER_CHECKPOINT_EVERY`); `None`, the default: the adaptive
    /// interval (docs/checkpoint-interval.md).
    ///
    /// [`JobCheckpoint::is_due`]: spot_worker_storage::JobCheckpoint::is_due
    pub checkpoint_every: Option<Duration>,
    /// Evictions per VM-hour the adaptive interval assumes until the
    /// fleet's own counts outweigh it (`SPOT_WORKER_EVICTION_RATE`,
    /// default 0.05).
    pub eviction_rate: f64,
    /// The two lanes of jobs with a deadline (docs/deploying.md, "The two lanes").
    pub lanes: LaneSettings,
    /// In a Kubernetes pod: where it is, to keep its deletion cost
    /// (`SPOT_WORKER_POD_DELETION_COST`, on in a pod); `None` elsewhere.
    pub pod: Option<crate::kubernetes_api::PodSettings>,
    /// How long a gone worker's lifetime record is kept
    /// (`SPOT_WORKER_LIFETIME_RETENTION`, default 30 days): each worker
    /// deletes a bounded number of older ones once its own is written.
    pub lifetime_retention: Duration,
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

impl Default for WorkerConfig {
    /// The defaults of the settings table.
    fn default() -> Self {
        WorkerConfig {
            queue: table::QUEUE.default.to_string(),
            // table::MESSAGE_ENCODING's default, `text` (checked by a test).
            encoding: MessageEncoding::Text,
            concurrency: cpus(),
            visibility_timeout: table::VISIBILITY_TIMEOUT.default,
            max_failures: table::MAX_FAILURES.default,
            max_deliveries: table::MAX_DELIVERIES.default,
            idle_poll_max: table::IDLE_POLL_MAX.default,
            storage_refusal_grace: table::STORAGE_REFUSAL_GRACE.default,
            checkpoint_container: table::CHECKPOINT_CONTAINER.default.to_string(),
            poison_container: table::POISON_CONTAINER.default.to_string(),
            health_addr: table::HEALTH_ADDR.default,
            imds: ImdsSettings {
                enabled: table::IMDS.default,
                endpoint: table::IMDS_ENDPOINT.default.to_string(),
                vm_name: None,
                poll_interval: table::IMDS_POLL_INTERVAL.default,
            },
            drain: DrainSettings {
                release_margin: table::RELEASE_MARGIN.default,
                release_floor: table::RELEASE_FLOOR.default,
                drain_budget: table::DRAIN_BUDGET.default,
                approve_events: table::APPROVE_EVENTS.default,
                approve_shared_events: table::APPROVE_SHARED_EVENTS.default,
                runtime_dir: None,
                watchdog: table::WATCHDOG.default,
                handle_signals: true,
            },
            gate_timeout: table::GATE_TIMEOUT.default,
            checkpoint_every: table::CHECKPOINT_EVERY.default,
            eviction_rate: table::EVICTION_RATE.default,
            lanes: LaneSettings {
                // table::LANE's default, `spot` (checked by a test).
                lane: Lane::Spot,
                regular_queue: None,
                keeper: table::LANE_KEEPER.default,
                keeper_every: table::LANE_KEEPER_EVERY.default,
                switch_cost: table::SWITCH_COST.default,
                // table::LANE_POLICY's default (checked by a test).
                policy: LanePolicy::Patient,
                price_ratio: DEFAULT_PRICE_RATIO,
            },
            // table::POD_NAME has no default: not in a pod.
            pod: None,
            lifetime_retention: table::LIFETIME_RETENTION.default,
        }
    }
}

/// The default concurrency: one message per CPU.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl WorkerConfig {
    /// Defaults, then the TOML file named by `SPOT_WORKER_CONFIG` (if set),
    /// then the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_source(&Source::from_env()?)
    }

    /// As [`from_env`](Self::from_env), reading variables through `lookup`
    /// (for tests and for callers with their own source of settings).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        Self::from_source(&Source::from_lookup(lookup)?)
    }

    /// The worker's settings from `source` (flags, environment, file,
    /// defaults), checked.
    pub fn from_source(source: &Source) -> Result<Self, ConfigError> {
        let config = WorkerConfig {
            queue: source.get(&table::QUEUE)?.into_owned(),
            encoding: encoding(source)?,
            concurrency: source.get(&table::CONCURRENCY)?.unwrap_or_else(cpus),
            visibility_timeout: source.get(&table::VISIBILITY_TIMEOUT)?,
            max_failures: source.get(&table::MAX_FAILURES)?,
            max_deliveries: source.get(&table::MAX_DELIVERIES)?,
            idle_poll_max: source.get(&table::IDLE_POLL_MAX)?,
            storage_refusal_grace: source.get(&table::STORAGE_REFUSAL_GRACE)?,
            checkpoint_container: source.get(&table::CHECKPOINT_CONTAINER)?.into_owned(),
            poison_container: source.get(&table::POISON_CONTAINER)?.into_owned(),
            health_addr: source.get(&table::HEALTH_ADDR)?,
            imds: ImdsSettings {
                enabled: source.get(&table::IMDS)?,
                endpoint: source.get(&table::IMDS_ENDPOINT)?.into_owned(),
                vm_name: source.get(&table::VM_NAME)?.map(|name| name.into_owned()),
                poll_interval: source.get(&table::IMDS_POLL_INTERVAL)?,
            },
            drain: DrainSettings {
                release_margin: source.get(&table::RELEASE_MARGIN)?,
                release_floor: source.get(&table::RELEASE_FLOOR)?,
                drain_budget: source.get(&table::DRAIN_BUDGET)?,
                approve_events: source.get(&table::APPROVE_EVENTS)?,
                approve_shared_events: source.get(&table::APPROVE_SHARED_EVENTS)?,
                runtime_dir: source
                    .get(&table::RUNTIME_DIR)?
                    .map(|dir| PathBuf::from(dir.as_ref())),
                watchdog: source.get(&table::WATCHDOG)?,
                handle_signals: true,
            },
            gate_timeout: source.get(&table::GATE_TIMEOUT)?,
            checkpoint_every: source.get(&table::CHECKPOINT_EVERY)?,
            eviction_rate: source.get(&table::EVICTION_RATE)?,
            lanes: LaneSettings {
                lane: lane(source)?,
                regular_queue: source
                    .get(&table::REGULAR_QUEUE)?
                    .map(|name| name.into_owned()),
                keeper: source.get(&table::LANE_KEEPER)?,
                keeper_every: source.get(&table::LANE_KEEPER_EVERY)?,
                switch_cost: source.get(&table::SWITCH_COST)?,
                policy: lane_policy(source)?,
                price_ratio: price_ratio(source)?,
            },
            pod: crate::kubernetes_api::PodSettings::from_source(source)?,
            lifetime_retention: source.get(&table::LIFETIME_RETENTION)?,
        };
        config.validate()?;
        Ok(config)
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
            return invalid(table::QUEUE.key, String::new(), "a queue name is required");
        }
        if self.concurrency == 0 {
            return invalid(
                table::CONCURRENCY.key,
                "0".into(),
                "at least one message at a time",
            );
        }
        if !(MIN_VISIBILITY..=MAX_VISIBILITY).contains(&self.visibility_timeout) {
            return invalid(
                table::VISIBILITY_TIMEOUT.key,
                format!("{:?}", self.visibility_timeout),
                "must be between 5 s (time to renew) and 7 days (Azure's limit)",
            );
        }
        if self.idle_poll_max < Duration::from_millis(200) {
            return invalid(
                table::IDLE_POLL_MAX.key,
                format!("{:?}", self.idle_poll_max),
                "at least 200ms (the first pause after an empty receive)",
            );
        }
        if self.max_failures == 0 {
            return invalid(
                table::MAX_FAILURES.key,
                "0".into(),
                "at least 1 (the first failure then poisons the message)",
            );
        }
        if self.max_deliveries == 0 {
            return invalid(
                table::MAX_DELIVERIES.key,
                "0".into(),
                "at least 1; keep it high: the crash-loop guard counts every delivery that \
                 left no recorded outcome (a crash, a lost lease, a wait for the store, a \
                 release not recorded within 1 s), not only the job's own faults",
            );
        }
        self.validate_lanes()?;
        if !self.eviction_rate.is_finite() || self.eviction_rate < 0.0 {
            return invalid(
                table::EVICTION_RATE.key,
                self.eviction_rate.to_string(),
                "evictions per hour: a finite number, not negative",
            );
        }
        self.drain.validate()
    }

    /// The queue this worker consumes: its lane's (`SPOT_WORKER_QUEUE` for
    /// the Spot lane, `SPOT_WORKER_REGULAR_QUEUE` for the regular one).
    pub fn consumed_queue(&self) -> &str {
        match (self.lanes.lane, &self.lanes.regular_queue) {
            (Lane::Regular, Some(regular)) => regular,
            _ => &self.queue,
        }
    }

    /// Where the checkpoint interval comes from: the fixed one if set,
    /// otherwise the adaptive one seeded with the eviction rate.
    pub fn interval_source(&self) -> IntervalSource {
        match self.checkpoint_every {
            Some(every) => IntervalSource::Explicit(every),
            None => IntervalSource::Adaptive {
                seed_evictions_per_hour: self.eviction_rate,
            },
        }
    }
}

/// How message text encodes bodies, from `SPOT_WORKER_MESSAGE_ENCODING`.
fn encoding(source: &Source) -> Result<MessageEncoding, ConfigError> {
    let name = source.get(&table::MESSAGE_ENCODING)?;
    match name.to_ascii_lowercase().as_str() {
        "text" => Ok(MessageEncoding::Text),
        "base64" => Ok(MessageEncoding::Base64),
        _ => Err(source
            .invalid(&table::MESSAGE_ENCODING, "use `text` or `base64`")
            .into()),
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
        WorkerConfig::from_lookup(move |name| vars.get(name).cloned())
    }

    #[test]
    fn documented_defaults() {
        let c = config(&[]).unwrap();
        assert_eq!(c, WorkerConfig::default(), "the defaults are the table's");
        assert_eq!(c.queue, "jobs");
        assert_eq!(c.encoding, MessageEncoding::Text);
        assert_eq!(c.health_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.imds.endpoint, "http://169.254.169.254");
        assert!(c.imds.enabled && c.drain.approve_events && c.drain.watchdog);
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
        assert_eq!(c.drain.drain_budget, Duration::from_secs(20));
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
        assert!(!c.drain.watchdog);
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
    fn lanes_are_off_until_a_regular_queue_is_named() {
        let c = config(&[]).unwrap();
        assert!(!c.lanes.enabled());
        assert_eq!((c.lanes.lane, c.consumed_queue()), (Lane::Spot, "jobs"));
        let regular = config(&[
            ("SPOT_WORKER_REGULAR_QUEUE", "jobs-regular"),
            ("SPOT_WORKER_LANE", "Regular"),
            ("SPOT_WORKER_LANE_KEEPER_EVERY", "2s"),
            ("SPOT_WORKER_SWITCH_COST", "3s"),
        ])
        .unwrap();
        assert!(regular.lanes.enabled());
        assert_eq!(regular.consumed_queue(), "jobs-regular");
        assert_eq!(regular.lanes.keeper_every, Duration::from_secs(2));
        assert_eq!(regular.lanes.switch_cost, Duration::from_secs(3));
        // The policy and k: the table's default, and k from the two prices.
        assert_eq!(c.lanes.policy, WorkerConfig::default().lanes.policy);
        assert_eq!(
            LanePolicy::parse(&table::LANE_POLICY.default),
            Some(c.lanes.policy)
        );
        assert_eq!(c.lanes.price_ratio, DEFAULT_PRICE_RATIO);
        let priced = config(&[
            ("SPOT_WORKER_LANE_POLICY", "Uniform-Progress"),
            ("SPOT_WORKER_PRICE_PER_HOUR", "0.5"),
            ("SPOT_WORKER_REGULAR_PRICE_PER_HOUR", "2.5"),
        ])
        .unwrap();
        assert_eq!(priced.lanes.policy, LanePolicy::UniformProgress);
        assert_eq!(priced.lanes.price_ratio, 5.0);
        // (settings, the setting the error names)
        let rows: [(&[(&str, &str)], &str); 6] = [
            (
                &[("SPOT_WORKER_LANE_POLICY", "greedy")],
                "SPOT_WORKER_LANE_POLICY",
            ),
            (
                &[("SPOT_WORKER_PRICE_PER_HOUR", "-1")],
                "SPOT_WORKER_PRICE_PER_HOUR",
            ),
            (&[("SPOT_WORKER_LANE", "regular")], "SPOT_WORKER_LANE"),
            (&[("SPOT_WORKER_LANE", "ondemand")], "SPOT_WORKER_LANE"),
            (
                &[("SPOT_WORKER_REGULAR_QUEUE", "jobs")],
                "SPOT_WORKER_REGULAR_QUEUE",
            ),
            (
                &[
                    ("SPOT_WORKER_REGULAR_QUEUE", "jobs-regular"),
                    ("SPOT_WORKER_LANE_KEEPER_EVERY", "100ms"),
                ],
                "SPOT_WORKER_LANE_KEEPER_EVERY",
            ),
        ];
        for (vars, named) in rows {
            let err = config(vars).unwrap_err();
            assert!(err.to_string().contains(named), "{vars:?}: {err}");
        }
    }

    #[test]
    fn shared_events_are_approved_only_when_asked() {
        assert!(!config(&[]).unwrap().drain.approve_shared_events);
        let c = config(&[("SPOT_WORKER_APPROVE_SHARED_EVENTS", "on")]).unwrap();
        assert!(c.drain.approve_shared_events);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(
            &path,
            "approve_shared_events = true\nrelease_floor = \"1s\"\n",
        )
        .unwrap();
        let c = config(&[(CONFIG_FILE_ENV, path.to_str().unwrap())]).unwrap();
        assert!(c.drain.approve_shared_events);
        assert_eq!(c.drain.release_floor, Duration::from_secs(1));
    }

    #[test]
    fn bad_values_say_which_setting_and_why() {
        let err = config(&[("SPOT_WORKER_CONCURRENCY", "many")]).unwrap_err();
        assert!(err.to_string().contains("SPOT_WORKER_CONCURRENCY"), "{err}");
        let err = config(&[("SPOT_WORKER_MESSAGE_ENCODING", "utf16")]).unwrap_err();
        assert!(err.to_string().contains("text` or `base64"), "{err}");
        let err = config(&[("SPOT_WORKER_CONCURRENCY", "0")]).unwrap_err();
        assert!(err.to_string().contains("SPOT_WORKER_CONCURRENCY"), "{err}");
        let err = config(&[("SPOT_WORKER_VISIBILITY_TIMEOUT", "2s")]).unwrap_err();
        assert!(err.to_string().contains("between 5 s"), "{err}");
        for setting in ["SPOT_WORKER_MAX_FAILURES", "SPOT_WORKER_MAX_DELIVERIES"] {
            let err = config(&[(setting, "0")]).unwrap_err();
            assert!(err.to_string().contains(setting), "{err}");
        }
        // Recorded releases keep evictions from the guard (docs/lifecycle.md):
        // its error must not say they count.
        let err = config(&[("SPOT_WORKER_MAX_DELIVERIES", "0")]).unwrap_err();
        assert!(!err.to_string().contains("evictions count"), "{err}");
        assert!(err.to_string().contains("no recorded outcome"), "{err}");
        // The lease's bounds, as people write them (docs/configuration.md).
        let c = config(&[("SPOT_WORKER_VISIBILITY_TIMEOUT", "7d")]).unwrap();
        assert_eq!(c.visibility_timeout, MAX_VISIBILITY);
        let err = config(&[("SPOT_WORKER_VISIBILITY_TIMEOUT", "8d")]).unwrap_err();
        assert!(err.to_string().contains("between 5 s"), "{err}");

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
