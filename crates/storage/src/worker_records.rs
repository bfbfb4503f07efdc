//! Every key this crate writes under `.spot-worker/` in the checkpoint
//! container, in one list: what docs/storage.md ("What stays") must name,
//! and what a retention rule on the container removes.

use crate::fleet_ledger::FleetLedger;
use crate::save_trouble::SAVE_TROUBLE_PREFIX;
use crate::worker_lifetime::LifetimeLog;

/// Where a message's attempt record is kept: this and the message id.
pub const ATTEMPT_RECORD_PREFIX: &str = ".spot-worker/attempts/";

/// Where completion records live in the checkpoint store (written by the
/// consumer, `spot-worker-consumer`).
pub const COMPLETION_RECORD_PREFIX: &str = ".spot-worker/goodput/";

/// Where lane records live in the checkpoint store (`spot-worker-lanes`).
pub const LANE_RECORD_PREFIX: &str = ".spot-worker/lanes/";

/// The name of the blob whose lease makes a worker the lane keeper
/// (`spot-worker-lanes`).
pub const KEEPER_LEASE: &str = ".spot-worker/lanes-keeper";

/// The checkpoint key the fleet's switch-cost samples are kept under
/// (`FleetSwitchCost::KEY` in `spot-worker-lanes`).
pub const SWITCH_COST_KEY: &str = ".spot-worker/fleet/switch-cost";

/// The checkpoint key of the fleet's Spot capacity document: the history
/// and the probes (`FleetSpotCapacity::KEY` in `spot-worker-lanes`).
pub const SPOT_CAPACITY_KEY: &str = ".spot-worker/fleet/spot-capacity";

/// Where the shards of the fleet's Spot sightings live, and their notes
/// (`FleetSpotCapacity::SHARDS_PREFIX` in `spot-worker-lanes`).
pub const SPOT_SIGHTINGS_PREFIX: &str = ".spot-worker/fleet/spot-sightings/";

/// The keys (full, or a prefix ending in `/`) of every record this crate
/// writes under `.spot-worker/`: attempt records, completion records, each
/// queue's fleet counts, each worker's lifetime record, the fleet's switch cost and Spot sightings, lane
/// records, the lane keeper's lease and each job's save trouble. The blob backends add theirs
/// (`spot_worker_azure::WORKER_RECORDS`).
pub const WORKER_RECORDS: [&str; 10] = [
    ATTEMPT_RECORD_PREFIX,
    COMPLETION_RECORD_PREFIX,
    FleetLedger::PREFIX,
    LifetimeLog::PREFIX,
    SWITCH_COST_KEY,
    SPOT_CAPACITY_KEY,
    SPOT_SIGHTINGS_PREFIX,
    LANE_RECORD_PREFIX,
    KEEPER_LEASE,
    SAVE_TROUBLE_PREFIX,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_is_under_the_workers_own_prefix() {
        for key in WORKER_RECORDS {
            assert!(key.starts_with(".spot-worker/"), "{key}");
        }
        let mut keys = WORKER_RECORDS.to_vec();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), WORKER_RECORDS.len());
    }
}
