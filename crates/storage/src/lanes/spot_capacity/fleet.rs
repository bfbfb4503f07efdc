//! [`FleetSpotCapacity`]: the fleet's Spot sightings in a checkpoint
//! store, as [`SHARDS`] shards and the fleet's document, merged by the
//! reader (see the parent module). Each write is the shared
//! [`FleetDocument`] read and rewrite (ETag-fenced, jittered backoff after
//! a race lost); what makes a mass eviction cheap is where the writes go:
//! a worker writes its own word and eviction to its shard only, and the
//! fleet's document only when the history changes, which one worker
//! writes and the rest find done.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::try_join_all;
use spot_worker_decisions::lanes::unix_secs;

use crate::checkpoint::CheckpointStore;
use crate::clock::{Clock, SystemClock};
use crate::error::StorageError;
use crate::fleet_document::FleetDocument;

use super::{FRESH_FOR_RECHECKS, SpotSightings};

/// How many shards the Spot workers' words and evictions are spread over:
/// a whole pool evicted at once queues on each shard a sixteenth as long as
/// on one document, and a reader reads seventeen small documents at once.
pub const SHARDS: usize = 16;

/// The shards' checkpoint keys.
const SHARD_KEYS: [&str; SHARDS] = [
    ".spot-worker/fleet/spot-sightings/00",
    ".spot-worker/fleet/spot-sightings/01",
    ".spot-worker/fleet/spot-sightings/02",
    ".spot-worker/fleet/spot-sightings/03",
    ".spot-worker/fleet/spot-sightings/04",
    ".spot-worker/fleet/spot-sightings/05",
    ".spot-worker/fleet/spot-sightings/06",
    ".spot-worker/fleet/spot-sightings/07",
    ".spot-worker/fleet/spot-sightings/08",
    ".spot-worker/fleet/spot-sightings/09",
    ".spot-worker/fleet/spot-sightings/10",
    ".spot-worker/fleet/spot-sightings/11",
    ".spot-worker/fleet/spot-sightings/12",
    ".spot-worker/fleet/spot-sightings/13",
    ".spot-worker/fleet/spot-sightings/14",
    ".spot-worker/fleet/spot-sightings/15",
];

/// The fleet's Spot sightings in a checkpoint store.
#[derive(Clone, Debug)]
pub struct FleetSpotCapacity {
    document: FleetDocument<SpotSightings>,
    shards: Arc<[FleetDocument<SpotSightings>]>,
    fresh_for: Duration,
    clock: Arc<dyn Clock>,
}

impl FleetSpotCapacity {
    /// The checkpoint key of the fleet's document: the history and the
    /// probes (and, from workers of the previous version, everything).
    pub const KEY: &'static str = ".spot-worker/fleet/spot-capacity";

    /// Where the shards of the Spot workers' words and evictions live:
    /// this and a two-digit shard number.
    pub const SHARDS_PREFIX: &'static str = ".spot-worker/fleet/spot-sightings/";

    /// The sightings in `store`, a word fresh for [`FRESH_FOR_RECHECKS`]
    /// rechecks of a minute (see [`with_fresh_for`](Self::with_fresh_for)).
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        let shards = SHARD_KEYS
            .iter()
            .map(|key| {
                FleetDocument::new(
                    Arc::clone(&store),
                    key,
                    "a shard of the fleet's Spot sightings",
                )
            })
            .collect();
        FleetSpotCapacity {
            document: FleetDocument::new(store, Self::KEY, "fleet Spot sightings"),
            shards,
            fresh_for: Duration::from_secs(60).saturating_mul(FRESH_FOR_RECHECKS),
            clock: Arc::new(SystemClock),
        }
    }

    /// The same sightings, timed by `clock` instead of the wall clock
    /// ([`SystemClock`], the default): a seeded fault search replays a
    /// run exactly this way.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock its sightings are timed by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The same sightings, read with a word fresh for `fresh_for` (the
    /// window in which evictions are judged together).
    pub fn with_fresh_for(mut self, fresh_for: Duration) -> Self {
        self.fresh_for = fresh_for;
        self
    }

    /// The checkpoint keys of the shards.
    pub fn shard_keys() -> &'static [&'static str] {
        &SHARD_KEYS
    }

    /// The checkpoint key of the shard `worker`'s word and eviction go to:
    /// the same in every process, so a worker's records stay in one place.
    pub fn shard_key_of(worker: &str) -> &'static str {
        SHARD_KEYS[Self::shard_index(worker)]
    }

    fn shard_index(worker: &str) -> usize {
        let hash = blake3::hash(worker.as_bytes());
        usize::from(hash.as_bytes()[0]) % SHARDS
    }

    /// The shard `worker`'s word and eviction go to.
    fn shard_of(&self, worker: &str) -> &FleetDocument<SpotSightings> {
        &self.shards[Self::shard_index(worker)]
    }

    /// The sightings as they stand now: the fleet's document and every
    /// shard, merged and judged ([`SpotSightings::seen_at`]).
    pub async fn read(&self) -> Result<SpotSightings, StorageError> {
        Ok(self.read_all().await?.1)
    }

    /// The fleet's document as stored, and the merged view at now.
    async fn read_all(&self) -> Result<(SpotSightings, SpotSightings), StorageError> {
        let reads = std::iter::once(&self.document)
            .chain(self.shards.iter())
            .map(FleetDocument::read);
        let records = try_join_all(reads).await?;
        let document = records.first().cloned().unwrap_or_default();
        let now = unix_secs(self.clock.now());
        let view = SpotSightings::merge(records).seen_at(now, self.fresh_for.as_secs_f64());
        Ok((document, view))
    }

    /// Spot `worker` is running now (it says so every `every`): written to
    /// its shard, and to the fleet's document when the history did not
    /// know Spot was there, or its word is older than `every` / 2. Returns
    /// the sightings.
    pub async fn heard(
        &self,
        worker: &str,
        every: Duration,
    ) -> Result<SpotSightings, StorageError> {
        let now = unix_secs(self.clock.now());
        self.shard_of(worker)
            .update(|s| s.heard_in_shard(worker, now, every))
            .await?;
        self.note_there(now, every).await
    }

    /// Writes into the fleet's document that Spot is there, if the view
    /// says so and the document does not (or its word is stale).
    async fn note_there(&self, now: f64, every: Duration) -> Result<SpotSightings, StorageError> {
        let (document, view) = self.read_all().await?;
        let Some(since) = view.history.current().filter(|c| c.there).map(|c| c.since) else {
            return Ok(view);
        };
        if document.fleet_heard(since, now, every).is_some() {
            self.document
                .update(|s| s.fleet_heard(since, now, every))
                .await?;
        }
        Ok(view)
    }

    /// Spot capacity went at `at`: `worker` got an eviction notice
    /// (written to its shard; gone if the evictions say so:
    /// [`SpotSightings::seen_at`]), or (`None`) a job waited for Spot in
    /// vain (gone unless a Spot worker was heard from since `at`). An
    /// outage is written into the fleet's document once. Returns the
    /// sightings.
    pub async fn lost(
        &self,
        worker: Option<&str>,
        at: SystemTime,
        fresh_for: Duration,
    ) -> Result<SpotSightings, StorageError> {
        let at = unix_secs(at);
        if let Some(worker) = worker {
            self.shard_of(worker)
                .update(|s| s.evicted_in_shard(worker, at))
                .await?;
        }
        let (document, view) = self.read_all().await?;
        let now = unix_secs(self.clock.now());
        let mut view = view.seen_at(now, fresh_for.as_secs_f64());
        let outage = match worker {
            Some(_) => view.history.current().filter(|c| !c.there).map(|c| c.since),
            None => {
                let heard_since = view.workers.iter().any(|(worker, heard)| {
                    *heard > at && view.evicted.get(worker).is_none_or(|gone| gone < heard)
                });
                (!heard_since).then_some(at)
            }
        };
        if let Some(start) = outage {
            if document.outage_from(start).is_some() {
                self.document.update(|s| s.outage_from(start)).await?;
            }
            view.history.see(false, start);
        }
        Ok(view)
    }

    /// Spot `worker` took a probe now (and so runs); returns the sightings.
    pub async fn took_probe(&self, worker: &str) -> Result<SpotSightings, StorageError> {
        let now = unix_secs(self.clock.now());
        self.document.update(|s| Some(s.took_probe(now))).await?;
        self.shard_of(worker)
            .update(|s| s.heard_in_shard(worker, now, Duration::ZERO))
            .await?;
        self.read().await
    }

    /// Whether this worker is the one to send a probe now: `true` once per
    /// `every` across the fleet (it wrote the document's probe time).
    pub async fn claim_probe(&self, every: Duration) -> Result<bool, StorageError> {
        let now = unix_secs(self.clock.now());
        let after = self.document.update(|s| s.probe(now, every)).await?;
        Ok(after.probe_sent_at == Some(now))
    }
}

#[cfg(test)]
mod shard_key_tests {
    use super::*;

    #[test]
    fn every_shard_lives_under_the_shards_prefix_once() {
        let mut numbers: Vec<&str> = SHARD_KEYS
            .iter()
            .map(|key| {
                key.strip_prefix(FleetSpotCapacity::SHARDS_PREFIX)
                    .unwrap_or_else(|| panic!("{key} is outside the shards' prefix"))
            })
            .collect();
        numbers.dedup();
        assert_eq!(numbers.len(), SHARDS);
    }
}
