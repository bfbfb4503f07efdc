//! The lanes' settings: the lane this worker serves, the regular lane's
//! queue, its keeper, and the policy and prices that pick a job's lane
//! (docs/deploying.md, "The two lanes").

use std::time::Duration;

use spot_worker_decisions::lanes::{Lane, LanePolicy};
use spot_worker_settings::{Setting, Source, table};

use crate::error::ConfigError;

use super::WorkerConfig;

/// The lanes: Spot capacity, and regular capacity for jobs with a deadline
/// that must (docs/deploying.md, "The two lanes").
#[derive(Debug, Clone, PartialEq)]
pub struct LaneSettings {
    /// The lane this worker serves (`SPOT_WORKER_LANE`: `spot`, the
    /// default, or `regular`).
    pub lane: Lane,
    /// The regular lane's queue (`SPOT_WORKER_REGULAR_QUEUE`); `None`: no
    /// lanes.
    pub regular_queue: Option<String>,
    /// Whether this worker takes turns at keeping the lanes
    /// (`SPOT_WORKER_LANE_KEEPER`, default on).
    pub keeper: bool,
    /// How often the keeper looks and a job on regular capacity is checked
    /// (`SPOT_WORKER_LANE_KEEPER_EVERY`, default 60s).
    pub keeper_every: Duration,
    /// d until the fleet measured its own (`SPOT_WORKER_SWITCH_COST`,
    /// default 6 minutes).
    pub switch_cost: Duration,
    /// The rule that picks a job's lane (`SPOT_WORKER_LANE_POLICY`,
    /// default `patient`).
    pub policy: LanePolicy,
    /// k, a regular hour's price over a Spot hour's: from
    /// `SPOT_WORKER_REGULAR_PRICE_PER_HOUR` over `SPOT_WORKER_PRICE_PER_HOUR`
    /// when both are set, else [`DEFAULT_PRICE_RATIO`].
    pub price_ratio: f64,
}

/// k when the prices are not set: the paper's 3 (Spot at a third of the
/// price; Azure's Spot discounts run from about 60 % to 90 %).
pub const DEFAULT_PRICE_RATIO: f64 = 3.0;

impl LaneSettings {
    /// Whether the worker serves one of two lanes.
    pub fn enabled(&self) -> bool {
        self.regular_queue.is_some()
    }
}

impl WorkerConfig {
    pub(super) fn validate_lanes(&self) -> Result<(), ConfigError> {
        let lanes = &self.lanes;
        let invalid = |setting: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                setting: setting.to_owned(),
                value,
                reason: reason.to_owned(),
            })
        };
        match &lanes.regular_queue {
            None if lanes.lane == Lane::Regular => invalid(
                table::LANE.key,
                "regular".into(),
                "a regular-lane worker needs the regular lane's queue: set SPOT_WORKER_REGULAR_QUEUE",
            ),
            Some(regular) if regular.is_empty() || *regular == self.queue => invalid(
                table::REGULAR_QUEUE.key,
                regular.clone(),
                "the regular lane needs a queue of its own, not SPOT_WORKER_QUEUE's",
            ),
            _ if lanes.keeper_every < Duration::from_secs(1) => invalid(
                table::LANE_KEEPER_EVERY.key,
                format!("{:?}", lanes.keeper_every),
                "at least 1s",
            ),
            _ => Ok(()),
        }
    }
}

/// The lane this worker serves, from `SPOT_WORKER_LANE`.
pub(super) fn lane(source: &Source) -> Result<Lane, ConfigError> {
    let name = source.get(&table::LANE)?;
    match name.to_ascii_lowercase().as_str() {
        "spot" => Ok(Lane::Spot),
        "regular" => Ok(Lane::Regular),
        _ => Err(source
            .invalid(&table::LANE, "use `spot` or `regular`")
            .into()),
    }
}

/// The lane policy, from `SPOT_WORKER_LANE_POLICY`.
pub(super) fn lane_policy(source: &Source) -> Result<LanePolicy, ConfigError> {
    let name = source.get(&table::LANE_POLICY)?;
    LanePolicy::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
        source
            .invalid(&table::LANE_POLICY, "use `patient` or `uniform-progress`")
            .into()
    })
}

/// k from the two lanes' prices, when both are set.
pub(super) fn price_ratio(source: &Source) -> Result<f64, ConfigError> {
    let price = |setting: &Setting<Option<std::borrow::Cow<'static, str>>>| -> Result<Option<f64>, ConfigError> {
        let Some(text) = source.get(setting)? else {
            return Ok(None);
        };
        match text.trim().parse::<f64>() {
            Ok(price) if price.is_finite() && price > 0.0 => Ok(Some(price)),
            _ => Err(source
                .invalid(setting, "a price per hour: a positive number such as 0.0125")
                .into()),
        }
    };
    let spot = price(&table::PRICE_PER_HOUR)?;
    let regular = price(&table::REGULAR_PRICE_PER_HOUR)?;
    Ok(match (spot, regular) {
        (Some(spot), Some(regular)) => regular / spot,
        _ => DEFAULT_PRICE_RATIO,
    })
}
