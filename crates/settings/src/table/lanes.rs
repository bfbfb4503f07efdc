//! The settings of lanes: jobs with a deadline on Spot, or regular capacity
//! when they must (docs/deploying.md, "The two lanes").

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, seconds, text};

/// The lane this worker serves.
pub const LANE: Setting<Text> = Setting {
    key: "SPOT_WORKER_LANE",
    default: text("spot"),
    default_doc: None,
    doc: "the lane this worker serves: `spot` (it consumes `SPOT_WORKER_QUEUE`) or `regular` (it consumes `SPOT_WORKER_REGULAR_QUEUE`, on regular-priority VMs); see [the two lanes](deploying.md#the-two-lanes)",
    secret: false,
};

/// The regular lane's queue.
pub const REGULAR_QUEUE: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_REGULAR_QUEUE",
    default: None,
    default_doc: None,
    doc: "the regular lane's queue (e.g. `jobs-regular`; both lanes poison into `<SPOT_WORKER_QUEUE>-poison`), where jobs with a deadline go when the lane rule says they must; unset: no lanes, and a job with a deadline runs where it was sent",
    secret: false,
};

/// Take part in keeping the lanes.
pub const LANE_KEEPER: Setting<bool> = Setting {
    key: "SPOT_WORKER_LANE_KEEPER",
    default: true,
    default_doc: None,
    doc: "with lanes: take turns (one worker of the fleet at a time, by a blob lease) at moving to the regular lane the jobs waiting in the Spot lane that `SPOT_WORKER_LANE_POLICY` sends there (`uniform-progress`: behind their line; `patient`: behind it once the Spot outage has outlasted what the job can afford to wait out), after the fleet's usual queue wait (at once for the safety net)",
    secret: false,
};

/// How often the lanes are looked at.
pub const LANE_KEEPER_EVERY: Setting<Duration> = Setting {
    key: "SPOT_WORKER_LANE_KEEPER_EVERY",
    default: seconds(60),
    default_doc: None,
    doc: "with lanes: how often the lane keeper looks at the Spot lane, and a job running on regular capacity is checked (back to Spot once ahead of its line); the lane rule keeps this much more slack",
    secret: false,
};

/// The switch cost assumed until the fleet measured its own.
pub const SWITCH_COST: Setting<Duration> = Setting {
    key: "SPOT_WORKER_SWITCH_COST",
    default: seconds(360),
    default_doc: None,
    doc: "with lanes: d, what one switch of lane costs a job (queue wait, start-up, restore, lost work), assumed until the fleet's own measurements outweigh it; split in the proportions of the default",
    secret: false,
};

/// Which rule picks a job's lane.
pub const LANE_POLICY: Setting<Text> = Setting {
    key: "SPOT_WORKER_LANE_POLICY",
    default: text("patient"),
    default_doc: None,
    doc: "with lanes: the rule that picks a job's lane: `patient` (Uniform Progress that learns from the fleet's Spot outages how long a job can afford to wait one out, and goes back to Spot only for runs worth a switch) or `uniform-progress` (the paper's rule as it stands); both keep the safety net and never move a job that runs on Spot; see [the patient policy](deadlines.md#the-patient-policy-the-default)",
    secret: false,
};

/// What a regular VM costs.
pub const REGULAR_PRICE_PER_HOUR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_REGULAR_PRICE_PER_HOUR",
    default: None,
    default_doc: None,
    doc: "`status`: a regular-priority worker VM's price per hour in US dollars, for the jobs' hours in the regular lane (with `SPOT_WORKER_PRICE_PER_HOUR` for their Spot hours)",
    secret: false,
};

/// Blob container for checkpoints.
pub const CHECKPOINT_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_CHECKPOINT_CONTAINER",
    default: text("checkpoints"),
    default_doc: None,
    doc: "blob container for checkpoints",
    secret: false,
};

/// Blob container for poisoned originals.
pub const POISON_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_POISON_CONTAINER",
    default: text("poison"),
    default_doc: None,
    doc: "blob container for poisoned originals too big for their record",
    secret: false,
};

/// Blob container for results (the `primes` worker).
pub const RESULTS_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_RESULTS_CONTAINER",
    default: text("results"),
    default_doc: None,
    doc: "blob container for results (the `primes` worker and `spot-worker run`)",
    secret: false,
};
