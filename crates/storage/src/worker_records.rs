//! Every key this crate writes under `.spot-worker/` in the checkpoint
//! container, in one list: what docs/storage.md ("What stays") must name,
//! and what a retention rule on the container removes.

use crate::consumer::COMPLETION_RECORD_PREFIX;
use crate::fleet_ledger::FleetLedger;
use crate::lanes::{FleetSpotCapacity, FleetSwitchCost, KEEPER_LEASE, LANE_RECORD_PREFIX};
use crate::save_trouble::SAVE_TROUBLE_PREFIX;
use crate::worker_lifetime::LifetimeLog;

/// Where a message's attempt record is kept: this and the message id.
pub const ATTEMPT_RECORD_PREFIX: &str = ".spot-worker/attempts/";

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
    FleetSwitchCost::KEY,
    FleetSpotCapacity::KEY,
    FleetSpotCapacity::SHARDS_PREFIX,
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
