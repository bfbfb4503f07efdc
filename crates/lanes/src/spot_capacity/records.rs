//! The sightings as records merged by the reader: what a worker of the
//! previous version wrote to its shard (`heard_in_shard`,
//! `evicted_in_shard`, kept for the tests that build such shards), how the
//! notes, the shards and the fleet's document add up to one view ([`SpotSightings::merge`]), and what that
//! view says of the capacity now ([`SpotSightings::seen_at`]): a mass
//! eviction is gone at once, before anyone wrote it into the history.
//!
//! Merging is a join: per worker, the latest word and the latest eviction
//! win; the latest times win; so the order of the records, a record read
//! twice or a worker of the previous version writing the old document
//! (read as one more record) change nothing.

use std::collections::BTreeMap;

use spot_worker_decisions::lanes::{Evictions, spot_capacity_gone};

use super::SpotSightings;
#[cfg(test)]
use super::{FORGET_WORKERS_AFTER, MAX_WORKERS};

impl SpotSightings {
    #[cfg(test)]
    /// In a shard: Spot `worker` is running at `now`; `None` when the
    /// shard says so already, fresher than `every` / 2 (nothing to write).
    pub(super) fn heard_in_shard(
        &self,
        worker: &str,
        now: f64,
        every: std::time::Duration,
    ) -> Option<SpotSightings> {
        let recent = self
            .workers
            .get(worker)
            .is_some_and(|heard| now - heard < every.as_secs_f64() / 2.0);
        if recent {
            return None;
        }
        let mut next = self.clone();
        next.heard_at = Some(self.heard_at.map_or(now, |heard| heard.max(now)));
        next.workers.insert(worker.to_owned(), now);
        next.forget_before(now);
        Some(next)
    }

    #[cfg(test)]
    /// In a shard: Spot `worker` got an eviction notice at `at`; `None`
    /// when the shard holds it already.
    pub(super) fn evicted_in_shard(&self, worker: &str, at: f64) -> Option<SpotSightings> {
        let known = self.evicted.get(worker).is_some_and(|noted| *noted >= at);
        if known && !self.workers.contains_key(worker) {
            return None;
        }
        let mut next = self.clone();
        next.workers.remove(worker);
        let noted = next.evicted.entry(worker.to_owned()).or_insert(at);
        *noted = noted.max(at);
        next.forget_before(at);
        Some(next)
    }

    #[cfg(test)]
    /// Drops the words and evictions older than [`FORGET_WORKERS_AFTER`]
    /// at `now`, and the oldest past [`MAX_WORKERS`] of each.
    fn forget_before(&mut self, now: f64) {
        for records in [&mut self.workers, &mut self.evicted] {
            records.retain(|_, at| now - *at < FORGET_WORKERS_AFTER.as_secs_f64());
            while records.len() > MAX_WORKERS {
                let oldest = records
                    .iter()
                    .min_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(name, _)| name.clone());
                if let Some(oldest) = oldest {
                    records.remove(&oldest);
                }
            }
        }
    }

    /// The records of the fleet (its document and its shards) as one:
    /// per worker the latest word and eviction, the latest times, and the
    /// history that changed last (only the fleet's document keeps one).
    pub fn merge(records: impl IntoIterator<Item = SpotSightings>) -> SpotSightings {
        let mut merged = SpotSightings::default();
        for record in records {
            let since = |s: &SpotSightings| s.history.current().map(|c| c.since);
            if since(&record) > since(&merged) {
                merged.history = record.history;
            }
            keep_latest(&mut merged.workers, record.workers);
            keep_latest(&mut merged.evicted, record.evicted);
            merged.heard_at = latest(merged.heard_at, record.heard_at);
            merged.probe_sent_at = latest(merged.probe_sent_at, record.probe_sent_at);
            merged.probe_taken_at = latest(merged.probe_taken_at, record.probe_taken_at);
        }
        merged
    }

    /// What the evictions and words within `window` of `now` say: how many
    /// Spot workers were evicted (and not heard from since) and how many
    /// run; evictions before the current run of Spot began do not count.
    /// Also the first of those evictions.
    pub(super) fn evictions(&self, now: f64, window: f64) -> (Evictions, Option<f64>) {
        let run_since = self
            .history
            .current()
            .filter(|c| c.there)
            .map_or(f64::NEG_INFINITY, |c| c.since);
        let from = (now - window).max(run_since);
        let evicted: Vec<f64> = self
            .evicted
            .iter()
            .filter(|(worker, at)| {
                **at >= from && self.workers.get(*worker).is_none_or(|heard| heard <= *at)
            })
            .map(|(_, at)| *at)
            .collect();
        let running = self
            .workers
            .iter()
            .filter(|(worker, heard)| {
                now - **heard <= window && self.evicted.get(*worker).is_none_or(|at| at < *heard)
            })
            .count();
        let first = evicted.iter().copied().min_by(f64::total_cmp);
        let seen = Evictions {
            evicted: evicted.len(),
            running,
        };
        (seen, first)
    }

    /// The merged sightings as they stand at `now` (Unix seconds), with
    /// `window` the time a word stays fresh: when the evictions within it
    /// say the capacity is gone ([`spot_capacity_gone`]: the last worker,
    /// or a mass eviction), it is gone since the first of them, whatever
    /// the history says yet; otherwise, a Spot worker heard from after the
    /// history's outage began (and not evicted since) says it is back.
    pub fn seen_at(mut self, now: f64, window: f64) -> SpotSightings {
        let (seen, first) = self.evictions(now, window);
        if spot_capacity_gone(seen) {
            if let Some(first) = first {
                let since = self.history.current().map_or(first, |c| c.since.max(first));
                self.history.see(false, since);
            }
            return self;
        }
        if self.history.is_there() {
            return self;
        }
        let gone_since = self
            .history
            .current()
            .map_or(f64::NEG_INFINITY, |c| c.since);
        let back = self
            .workers
            .iter()
            .filter(|(worker, heard)| {
                **heard > gone_since && self.evicted.get(*worker).is_none_or(|at| at < *heard)
            })
            .map(|(_, heard)| *heard)
            .min_by(f64::total_cmp);
        if let Some(back) = back {
            self.history.see(true, back);
        }
        self
    }
}

/// `into` with each of `from`'s entries, the later time winning.
fn keep_latest(into: &mut BTreeMap<String, f64>, from: BTreeMap<String, f64>) {
    for (worker, at) in from {
        let kept = into.entry(worker).or_insert(at);
        *kept = kept.max(at);
    }
}

/// The later of two times, either may be missing.
fn latest(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
