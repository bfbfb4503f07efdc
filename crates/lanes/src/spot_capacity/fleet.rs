//! [`FleetSpotCapacity`]: the fleet's Spot sightings in a checkpoint
//! store (see the parent module): each Spot worker's notes as records of
//! its own (`notes.rs`: one create-only write a note, however large the
//! fleet), the fleet's document (history and probes, ETag-fenced, written
//! only when they change, which one worker writes and the rest find done),
//! and, while workers of the previous version still write them, the
//! [`SHARDS`] shards they kept their notes in. A reader lists the notes'
//! prefix (which holds the shards too), reads the fleet's document and any
//! shard the listing found, and merges them all.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use futures_util::future::try_join_all;
use spot_worker_decisions::lanes::unix_secs;

use spot_worker_storage::FleetDocument;
use spot_worker_storage::StorageError;
use spot_worker_storage::{Checkpoint, CheckpointStore, WritePrecondition};
use spot_worker_storage::{Clock, SystemClock};

use super::notes::{Note, NoteKind, Notes};
use super::{FORGET_WORKERS_AFTER, FRESH_FOR_RECHECKS, SpotSightings};

/// How many deletes the cleaner has in flight at once.
const CLEAN_IN_PARALLEL: usize = 16;

/// How many shards workers of the previous version spread their words and
/// evictions over (read while the listing finds them).
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
    store: Arc<dyn CheckpointStore>,
    document: FleetDocument<SpotSightings>,
    shards: Arc<[FleetDocument<SpotSightings>]>,
    fresh_for: Duration,
    clock: Arc<dyn Clock>,
}

impl FleetSpotCapacity {
    /// The checkpoint key of the fleet's document: the history and the
    /// probes (and, from workers of the previous version, everything).
    pub const KEY: &'static str = spot_worker_storage::SPOT_CAPACITY_KEY;

    /// Where the shards of the previous version's words and evictions
    /// live (this and a two-digit shard number), and the notes
    /// ([`NOTES_PREFIX`](super::NOTES_PREFIX)): one listing finds both.
    pub const SHARDS_PREFIX: &'static str = spot_worker_storage::SPOT_SIGHTINGS_PREFIX;

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
            document: FleetDocument::new(Arc::clone(&store), Self::KEY, "fleet Spot sightings"),
            store,
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

    /// The checkpoint key of the shard a worker of the previous version
    /// wrote `worker`'s word and eviction to.
    pub fn shard_key_of(worker: &str) -> &'static str {
        SHARD_KEYS[Self::shard_index(worker)]
    }

    fn shard_index(worker: &str) -> usize {
        let hash = blake3::hash(worker.as_bytes());
        usize::from(hash.as_bytes()[0]) % SHARDS
    }

    /// The sightings as they stand now: the fleet's document, the notes
    /// and any shard of the previous version, merged and judged
    /// ([`SpotSightings::seen_at`]).
    pub async fn read(&self) -> Result<SpotSightings, StorageError> {
        let snapshot = self.snapshot().await?;
        Ok(self.view(&snapshot, unix_secs(self.clock.now())))
    }

    /// One reading of everything: the listing (one request a page of
    /// 5,000 names) and the fleet's document at once, then the shards
    /// the listing found (none once the previous version is gone).
    async fn snapshot(&self) -> Result<Snapshot, StorageError> {
        let (keys, document) = futures_util::future::try_join(
            self.store.list(Self::SHARDS_PREFIX),
            self.document.read(),
        )
        .await?;
        let present: Vec<usize> = (0..SHARDS)
            .filter(|&i| keys.iter().any(|key| key == SHARD_KEYS[i]))
            .collect();
        let shards = try_join_all(present.iter().map(|&i| self.shards[i].read())).await?;
        Ok(Snapshot {
            document,
            shards: present.into_iter().zip(shards).collect(),
            notes: Notes::from_keys(keys.iter().map(String::as_str)),
        })
    }

    /// The merged view of `snapshot` at `now`.
    fn view(&self, snapshot: &Snapshot, now: f64) -> SpotSightings {
        let records = std::iter::once(snapshot.document.clone())
            .chain(snapshot.shards.iter().map(|(_, shard)| shard.clone()))
            .chain(std::iter::once(snapshot.notes.sightings(now)));
        SpotSightings::merge(records).seen_at(now, self.fresh_for.as_secs_f64())
    }

    /// Writes `note`: created, never overwritten; found there already
    /// (a retry whose first try landed) is written.
    async fn write_note(&self, note: &Note) -> Result<(), StorageError> {
        let progress = serde_json::json!({ "worker": note.worker, "at": note.at() });
        match self
            .store
            .write(
                &note.key(),
                &Checkpoint::InProgress { progress },
                WritePrecondition::Create,
                None,
            )
            .await
        {
            Ok(_) | Err(StorageError::Conflict { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    /// Spot `worker` is running now (it says so every `every`): a note of
    /// its own, unless its last is fresher than `every` / 2 (its earlier
    /// words deleted), and into the fleet's document when the history did
    /// not know Spot was there, or its word is older than `every` / 2.
    /// The first running worker in name order also deletes stale notes.
    /// Returns the sightings.
    pub async fn heard(
        &self,
        worker: &str,
        every: Duration,
    ) -> Result<SpotSightings, StorageError> {
        let now = unix_secs(self.clock.now());
        let mut snapshot = self.snapshot().await?;
        let recent = snapshot
            .notes
            .last_word(worker)
            .is_some_and(|heard| now - heard < every.as_secs_f64() / 2.0);
        if !recent {
            let note = Note::new(worker, NoteKind::Heard, now);
            self.write_note(&note).await?;
            let superseded: Vec<String> = snapshot
                .notes
                .superseded_words(worker, &note)
                .map(Note::key)
                .collect();
            self.delete_all(superseded).await;
            snapshot.notes.push(note);
        }
        if snapshot
            .notes
            .cleaner(worker, now, self.fresh_for.as_secs_f64())
        {
            self.clean(&snapshot, now).await;
        }
        let view = self.view(&snapshot, now);
        self.note_there(&snapshot.document, &view, now, every)
            .await?;
        Ok(view)
    }

    /// Deletes `keys` (notes no reader needs), a few at a time; a failure
    /// is logged and the note deleted at a later pass (readers ignore it
    /// meanwhile).
    async fn delete_all(&self, keys: Vec<String>) {
        futures_util::stream::iter(keys)
            .for_each_concurrent(CLEAN_IN_PARALLEL, |key| async move {
                if let Err(error) = self.store.delete(&key).await {
                    tracing::debug!(%error, key, "could not delete a stale Spot sighting; deleting it later");
                }
            })
            .await;
    }

    /// The cleaner's pass: the stale notes ([`Notes::stale`]), and the
    /// shards of the previous version that hold nothing fresher than
    /// [`FORGET_WORKERS_AFTER`] (no worker of that version has written
    /// there for that long: every one says it runs each recheck).
    async fn clean(&self, snapshot: &Snapshot, now: f64) {
        let forget = FORGET_WORKERS_AFTER.as_secs_f64();
        let stale_shards = snapshot
            .shards
            .iter()
            .filter(|(_, shard)| {
                let times = shard.workers.values().chain(shard.evicted.values());
                times
                    .chain(shard.heard_at.iter())
                    .all(|at| now - at >= forget)
            })
            .map(|(i, _)| SHARD_KEYS[*i].to_owned());
        let keys = snapshot
            .notes
            .stale(now)
            .map(Note::key)
            .chain(stale_shards)
            .collect();
        self.delete_all(keys).await;
    }

    /// Writes into the fleet's document that Spot is there, if the view
    /// says so and the document (as read) does not (or its word is
    /// stale): workers of the previous version read its word.
    async fn note_there(
        &self,
        document: &SpotSightings,
        view: &SpotSightings,
        now: f64,
        every: Duration,
    ) -> Result<(), StorageError> {
        let Some(since) = view.history.current().filter(|c| c.there).map(|c| c.since) else {
            return Ok(());
        };
        if document.fleet_heard(since, now, every).is_some() {
            self.document
                .update(|s| s.fleet_heard(since, now, every))
                .await?;
        }
        Ok(())
    }

    /// Spot capacity went at `at`: `worker` got an eviction notice (a
    /// note of its own; gone if the evictions say so:
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
        let note = worker.map(|worker| Note::new(worker, NoteKind::Evicted, at));
        if let Some(note) = &note {
            self.write_note(note).await?;
        }
        let mut snapshot = self.snapshot().await?;
        if let Some(note) = note {
            snapshot.notes.push(note);
        }
        let now = unix_secs(self.clock.now());
        let mut view = self
            .view(&snapshot, now)
            .seen_at(now, fresh_for.as_secs_f64());
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
            if snapshot.document.outage_from(start).is_some() {
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
        self.write_note(&Note::new(worker, NoteKind::Heard, now))
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

/// One reading of the fleet's records.
struct Snapshot {
    /// The fleet's document.
    document: SpotSightings,
    /// The shards of the previous version found, by number.
    shards: Vec<(usize, SpotSightings)>,
    /// The notes found.
    notes: Notes,
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
