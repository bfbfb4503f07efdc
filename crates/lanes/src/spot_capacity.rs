//! Whether the fleet's Spot capacity is there, as its workers see it, and
//! what they have seen of it ([`SpotHistory`]): [`FleetSpotCapacity`], in
//! the checkpoint store as records merged by the reader (`fleet.rs`):
//!
//! - each Spot worker's word and eviction is a record of its own, named
//!   by worker, kind and time (`notes.rs`:
//!   `.spot-worker/fleet/spot-sightings/by-worker/<worker>/heard-<µs>`),
//!   created once and written by no other worker, so a note is one write
//!   however large the fleet, and a whole pool evicted at once races on
//!   nothing; a reader lists the prefix and reads no note (the names say
//!   it all);
//! - the fleet's document (`.spot-worker/fleet/spot-capacity`) keeps the
//!   history and the probes, written only when they change (an outage
//!   begins or ends, a probe goes out or is taken), and is read as one
//!   more record;
//! - the [`SHARDS`] shards (`.spot-worker/fleet/spot-sightings/00` …) in
//!   which workers of the previous version keep their notes are read while
//!   the listing finds them, so a fleet mid-upgrade loses no note;
//! - a reader merges them ([`SpotSightings::merge`]) and judges the
//!   evictions ([`SpotSightings::seen_at`]).
//!
//! Azure says nothing of Spot capacity until a VM is asked for, so the
//! fleet learns it from its own Spot workers:
//!
//! - **there**: a Spot worker is running. Each one says so every
//!   [`Lanes::recheck`](super::Lanes::recheck) ([`FleetSpotCapacity::heard`]);
//!   Spot counts as there while the last word is fresher than
//!   [`FRESH_FOR_RECHECKS`] rechecks;
//! - **gone**: the evictions the Spot workers noted
//!   ([`FleetSpotCapacity::lost`]) left none running, or are a mass
//!   eviction (at least half the pool within the time a word stays fresh:
//!   [`spot_capacity_gone`](spot_worker_decisions::lanes::spot_capacity_gone)),
//!   or a job has waited in the Spot lane longer than the fleet's usual
//!   queue wait with no Spot worker heard from since it was sent (the lane
//!   keeper sees that). After a mass eviction, Spot counts as back when a
//!   worker heard from after the outage began is running and the
//!   evictions are older than that time.
//!
//! A Spot pool scaled to zero says neither. A regular worker whose job
//! could go back to Spot but sees no Spot worker **asks for one**: it sends
//! a probe ([`PROBE_BODY`]) to the Spot lane, which the Spot pool's
//! autoscale rule or KEDA trigger answers like any job. A Spot worker that
//! receives a probe says it is there and deletes it; the regular worker
//! hears of it at its next recheck and releases its job to the Spot worker
//! now running. While Spot capacity is away, the probe waits in the queue
//! (it costs nothing) and the job keeps running on regular capacity,
//! instead of being released into an outage to wait, fall behind and come
//! back. One probe at a time per fleet: the document says when the last
//! was sent and taken; another goes out only once it was taken (at most
//! one per [`probe_every`]), or after [`PROBE_LOST_AFTER`] periods without
//! a taker (it may have been cleared from the queue). A probe left over
//! after its job finished starts one Spot VM for nothing, which takes it,
//! idles and is scaled in.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use spot_worker_decisions::lanes::{Reason, SpotHistory, unix_secs};
use tokio_util::sync::CancellationToken;

use spot_worker_storage::MessageEncoding;
use spot_worker_storage::StorageError;

use super::Lanes;

pub use spot_worker_storage::PROBE_BODY;

/// How many rechecks a Spot worker's word stays fresh: it says it every
/// recheck, so two may be missed (a slow write, a worker between jobs).
pub const FRESH_FOR_RECHECKS: u32 = 3;

/// How often a fleet may send a probe: five rechecks (five minutes by
/// default), long enough for an autoscale evaluation and a VM's start.
pub fn probe_every(recheck: Duration) -> Duration {
    recheck.saturating_mul(5)
}

/// How long a Spot worker not heard from stays in the sightings.
pub const FORGET_WORKERS_AFTER: Duration = Duration::from_secs(3600);

/// The most Spot workers a shard of the previous version named (the
/// longest silent went first).
#[cfg(test)]
const MAX_WORKERS: usize = 1024;

/// After how many [`probe_every`] periods a probe nobody took is sent
/// again: twelve (an hour by default).
pub const PROBE_LOST_AFTER: u32 = 12;

/// Whether the lane policy kept a job in the regular lane only for want
/// of Spot capacity (or of a run of it worth joining): then a worker
/// without a Spot worker in sight asks for one ([`Lanes::ask_for_spot`]).
pub fn waits_for_spot(reason: Reason) -> bool {
    matches!(reason, Reason::SpotAway | Reason::WaitingForSpotRun)
}

impl Lanes {
    /// Asks the Spot pool for a worker: sends a probe (text in
    /// `encoding`) to the Spot lane, unless one is waiting there already or
    /// went out within [`probe_every`] ([`SpotSightings`] says). A failure
    /// is logged; the next recheck asks again.
    pub async fn ask_for_spot(&self, encoding: MessageEncoding) {
        let every = probe_every(self.recheck);
        match self.spot_capacity.fleet().claim_probe(every).await {
            Ok(false) => {}
            Ok(true) => {
                let text = match encoding.encode(PROBE_BODY) {
                    Ok(text) => text,
                    Err(error) => {
                        tracing::warn!(%error, "could not encode a probe for Spot capacity");
                        return;
                    }
                };
                match self.spot.send(&text, Duration::ZERO).await {
                    Ok(_) => tracing::info!(
                        "no Spot worker in sight: a probe asks the Spot pool for one"
                    ),
                    Err(error) => {
                        tracing::warn!(%error, "sending a probe for Spot capacity failed; asking again at the next recheck")
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not claim a probe for Spot capacity; asking again at the next recheck")
            }
        }
    }
}

/// What the fleet has seen of its Spot capacity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpotSightings {
    /// Its outages and runs, and whether it is there now (Unix seconds).
    pub history: SpotHistory,
    /// When a Spot worker last said it was running, Unix seconds.
    pub heard_at: Option<f64>,
    /// When each Spot worker last said it was running, Unix seconds, by
    /// worker (those heard from within [`FORGET_WORKERS_AFTER`]).
    #[serde(default)]
    pub workers: BTreeMap<String, f64>,
    /// When each Spot worker got an eviction notice, Unix seconds, by
    /// worker (those within [`FORGET_WORKERS_AFTER`]); kept in the notes.
    #[serde(default)]
    pub evicted: BTreeMap<String, f64>,
    /// When the last probe was sent, Unix seconds.
    pub probe_sent_at: Option<f64>,
    /// When a Spot worker last took a probe, Unix seconds.
    #[serde(default)]
    pub probe_taken_at: Option<f64>,
}

impl SpotSightings {
    /// Whether Spot capacity is there at `now`: the last sighting says so,
    /// and a Spot worker was heard from within `fresh_for`.
    pub fn there(&self, now: SystemTime, fresh_for: Duration) -> bool {
        let now = unix_secs(now);
        self.history.is_there()
            && self
                .heard_at
                .is_some_and(|heard| now - heard <= fresh_for.as_secs_f64())
    }

    /// In the fleet's document: a Spot worker runs at `now`, so Spot has
    /// been there since `since` (the first word after an outage);
    /// `None` when the document says so already, with a word fresher than
    /// `every` / 2 (nothing to write). Workers of the previous version
    /// read only this document; this keeps its word fresh for them.
    fn fleet_heard(&self, since: f64, now: f64, every: Duration) -> Option<SpotSightings> {
        let fresh = self
            .heard_at
            .is_some_and(|heard| now - heard < every.as_secs_f64() / 2.0);
        if fresh && self.history.is_there() {
            return None;
        }
        let mut next = self.clone();
        next.history.see(true, since.min(now));
        next.heard_at = Some(self.heard_at.map_or(now, |heard| heard.max(now)));
        Some(next)
    }

    /// In the fleet's document: Spot capacity went at `at`; `None` when
    /// the history knows it already (or knows of a later change).
    fn outage_from(&self, at: f64) -> Option<SpotSightings> {
        let mut next = self.clone();
        next.history.see(false, at);
        (next.history != self.history).then_some(next)
    }

    /// In the fleet's document: a Spot worker took a probe at `now` (and
    /// so runs).
    fn took_probe(&self, now: f64) -> SpotSightings {
        let mut next = self
            .fleet_heard(now, now, Duration::ZERO)
            .unwrap_or_else(|| self.clone());
        next.probe_taken_at = Some(now);
        next
    }

    /// A probe is sent at `now`; `None` while one waits (for up to
    /// [`PROBE_LOST_AFTER`] × `every`) or one was sent within `every`.
    fn probe(&self, now: f64, every: Duration) -> Option<SpotSightings> {
        if let Some(sent) = self.probe_sent_at {
            let waiting = self.probe_taken_at.is_none_or(|taken| taken < sent);
            let age = now - sent;
            let every = every.as_secs_f64();
            if age < every || (waiting && age < every * f64::from(PROBE_LOST_AFTER)) {
                return None;
            }
        }
        Some(SpotSightings {
            probe_sent_at: Some(now),
            ..self.clone()
        })
    }
}

/// One worker's view of the fleet's Spot capacity: the sightings as last
/// read, refreshed every recheck ([`SpotCapacity::keep`]).
#[derive(Debug)]
pub struct SpotCapacity {
    fleet: FleetSpotCapacity,
    sightings: Mutex<SpotSightings>,
    recheck: Duration,
    /// This worker's name in the sightings: unique per process.
    worker: String,
}

impl SpotCapacity {
    /// The view of the sightings in `fleet`, for workers that recheck every
    /// `recheck` (a word fresh for [`FRESH_FOR_RECHECKS`] of them);
    /// nothing seen until the first read.
    pub fn new(fleet: FleetSpotCapacity, recheck: Duration) -> Self {
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        SpotCapacity {
            fleet: fleet.with_fresh_for(recheck.saturating_mul(FRESH_FOR_RECHECKS)),
            sightings: Mutex::default(),
            recheck,
            worker: format!("{}-{started:x}", std::process::id()),
        }
    }

    /// This worker's name in the sightings.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// How long a Spot worker's word stays fresh: [`FRESH_FOR_RECHECKS`]
    /// rechecks.
    pub fn fresh_for(&self) -> Duration {
        self.recheck.saturating_mul(FRESH_FOR_RECHECKS)
    }

    /// This (Spot) worker was evicted: the fleet's Spot capacity went at
    /// `at`, unless other Spot workers run; the view takes the result.
    pub async fn evicted(&self, at: SystemTime) -> Result<(), StorageError> {
        let sightings = self
            .fleet
            .lost(Some(&self.worker), at, self.fresh_for())
            .await?;
        self.set(sightings);
        Ok(())
    }

    /// This (Spot) worker took a probe: it runs; the view takes the result.
    pub async fn took_probe(&self) -> Result<(), StorageError> {
        let sightings = self.fleet.took_probe(&self.worker).await?;
        self.set(sightings);
        Ok(())
    }

    fn sightings(&self) -> std::sync::MutexGuard<'_, SpotSightings> {
        self.sightings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The fleet's document.
    pub fn fleet(&self) -> &FleetSpotCapacity {
        &self.fleet
    }

    /// Whether Spot capacity is there now, as last read.
    pub fn there(&self) -> bool {
        self.sightings().there(self.now(), self.fresh_for())
    }

    /// The time of day now, by the clock its sightings are timed by
    /// ([`FleetSpotCapacity::with_clock`]; the wall clock by default): the
    /// lanes judge a job's deadline by it too.
    pub fn now(&self) -> SystemTime {
        self.fleet.clock().now()
    }

    /// The fleet's Spot history, as last read.
    pub fn history(&self) -> SpotHistory {
        self.with_history(SpotHistory::clone)
    }

    /// `read` of the fleet's Spot history, as last read, without a copy
    /// (the lane policy asks about every waiting job).
    pub fn with_history<R>(&self, read: impl FnOnce(&SpotHistory) -> R) -> R {
        read(&self.sightings().history)
    }

    /// When a Spot worker was last heard from (Unix seconds), as last read.
    pub fn heard_at(&self) -> Option<f64> {
        self.sightings().heard_at
    }

    /// Takes `sightings` as the fleet's latest.
    pub fn set(&self, sightings: SpotSightings) {
        *self.sightings() = sightings;
    }

    /// Keeps this view in step with the fleet's until `stop`: every
    /// recheck, a Spot worker (`spot_worker`) says it is running, and every
    /// worker reads the sightings back. A failure is logged; the view keeps
    /// what it had, and goes stale (no Spot seen) rather than wrong.
    pub async fn keep(&self, spot_worker: bool, stop: CancellationToken) {
        loop {
            let read = if spot_worker {
                self.fleet.heard(&self.worker, self.recheck).await
            } else {
                self.fleet.read().await
            };
            match read {
                Ok(sightings) => self.set(sightings),
                Err(error) => {
                    tracing::warn!(%error, "could not read or add to the fleet's Spot sightings; trying again at the next recheck");
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.recheck) => {}
            }
        }
    }
}

mod fleet;
mod notes;
mod records;

pub use fleet::{FleetSpotCapacity, SHARDS};
pub use notes::NOTES_PREFIX;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod mass_eviction;
