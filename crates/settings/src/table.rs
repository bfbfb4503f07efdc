//! Every setting, in the order docs/configuration.md lists them.
//!
//! A crate reads its settings by these constants (`table::DRAIN_BUDGET`),
//! never by building a variable name, so that searching for
//! `SPOT_WORKER_DRAIN_BUDGET` finds its line and every reader.
//!
//! The settings are written in groups, one file each under `table/` (the
//! storage, the queue, the lanes, ...), and listed once here, in [`ALL`]:
//! the one table, in the order of the groups.

use std::borrow::Cow;
use std::time::Duration;

use crate::setting::Describe;

/// Text settings.
type Text = Cow<'static, str>;

const fn text(value: &'static str) -> Text {
    Cow::Borrowed(value)
}

const fn seconds(n: u64) -> Duration {
    Duration::from_secs(n)
}

mod bill;
mod health;
mod lanes;
mod pod_deletion_cost;
mod program;
mod queue;
mod scale_in;
mod scheduled_events;
mod shutdown;
mod storage;
mod telemetry;

pub use bill::*;
pub use health::*;
pub use lanes::*;
pub use pod_deletion_cost::*;
pub use program::*;
pub use queue::*;
pub use scale_in::*;
pub use scheduled_events::*;
pub use shutdown::*;
pub use storage::*;
pub use telemetry::*;

/// Every setting, in the order of docs/configuration.md.
pub const ALL: &[&dyn Describe] = &[
    &CONNECTION_STRING,
    &STORAGE_ACCOUNT_URL,
    &CLIENT_ID,
    &FEDERATED_TOKEN_FILE,
    &TENANT_ID,
    &AUTHORITY_HOST,
    &QUEUE,
    &MESSAGE_ENCODING,
    &CONCURRENCY,
    &VISIBILITY_TIMEOUT,
    &MAX_FAILURES,
    &MAX_DELIVERIES,
    &IDLE_POLL_MAX,
    &STORAGE_REFUSAL_GRACE,
    &PRICE_PER_HOUR,
    &LANE,
    &REGULAR_QUEUE,
    &LANE_KEEPER,
    &LANE_KEEPER_EVERY,
    &LANE_POLICY,
    &SWITCH_COST,
    &REGULAR_PRICE_PER_HOUR,
    &CHECKPOINT_CONTAINER,
    &POISON_CONTAINER,
    &RESULTS_CONTAINER,
    &JOB_KEY,
    &RESULT_NAME,
    &PERMANENT_EXIT_CODES,
    &TIMEOUT,
    &STOP_SIGNAL,
    &CHECKPOINT_EVERY,
    &CHECKPOINT_MARKER,
    &EVICTION_RATE,
    &CHECKPOINT_MAX_BYTES,
    &RESULT_MAX_BYTES,
    &TRANSFER_CONCURRENCY,
    &PASS_ENV,
    &PROGRAM_OUTPUT,
    &PROGRAM_USER,
    &HEALTH_ADDR,
    &GATE_TIMEOUT,
    &IMDS,
    &IMDS_ENDPOINT,
    &IMDS_POLL_INTERVAL,
    &VM_NAME,
    &POD_DELETION_COST,
    &POD_DELETION_COST_STEP,
    &POD_NAME,
    &POD_NAMESPACE,
    &KUBERNETES_SERVICE_HOST,
    &KUBERNETES_SERVICE_PORT,
    &SERVICE_ACCOUNT_DIR,
    &DRAIN_BUDGET,
    &RELEASE_MARGIN,
    &RELEASE_FLOOR,
    &APPROVE_EVENTS,
    &APPROVE_SHARED_EVENTS,
    &RUNTIME_DIR,
    &WATCHDOG,
    &SCALE_IN_PROTECTION,
    &SCALE_IN_IDLE_GRACE,
    &LIFETIME_RETENTION,
    &LOG_FILTER,
    &LOG_FORMAT,
    &SERVICE_NAME,
    &OTLP_ENDPOINT,
    &OTLP_PROTOCOL,
    &OTLP_TIMEOUT,
    &METRIC_EXPORT_INTERVAL,
    &APP_INSIGHTS,
    &SDK_DISABLED,
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::setting::file_key;

    #[test]
    fn keys_and_file_keys_are_unique() {
        let keys: HashSet<_> = ALL.iter().map(|s| s.key()).collect();
        assert_eq!(keys.len(), ALL.len());
        let file_keys: HashSet<_> = ALL.iter().map(|s| file_key(s.key())).collect();
        assert_eq!(file_keys.len(), ALL.len());
        assert!(!keys.contains(crate::CONFIG_FILE));
    }

    #[test]
    fn every_default_reads_back_as_itself() {
        for setting in ALL {
            let shown = setting.default_text();
            if let Some(text) = shown.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
                assert_eq!(setting.check(text), Ok(()), "{}", setting.key());
            }
        }
    }

    #[test]
    fn the_credentials_are_marked_secret() {
        let secrets: Vec<_> = ALL.iter().filter(|s| s.secret()).map(|s| s.key()).collect();
        assert_eq!(
            secrets,
            [CONNECTION_STRING.key, APP_INSIGHTS.key],
            "a setting that carries a key or token is secret"
        );
    }
}
