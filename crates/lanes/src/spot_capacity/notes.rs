//! Each Spot worker's notes as records of its own (issue 37, item 7): a
//! word that it runs or its eviction is one create-only record, named by
//! the worker, the kind and the time
//! (`.spot-worker/fleet/spot-sightings/by-worker/<worker>/evicted-<unix µs>`),
//! which no other worker writes. A note is one write whatever the size of
//! the fleet (no document to read first, no race to lose), and everything
//! a reader needs is in the names: it lists the prefix (5,000 names a
//! request) and reads no record. [`Notes::sightings`] turns a listing into
//! one more record for [`SpotSightings::merge`].
//!
//! What keeps the records few: a worker deletes its own earlier words when
//! it writes a new one ([`Notes::superseded_words`]); notes older than
//! [`FORGET_WORKERS_AFTER`] are ignored by every reader, and deleted by one
//! worker, the first running one in name order ([`Notes::cleaner`]), at
//! most [`CLEAN_AT_MOST`] a recheck ([`Notes::stale`]). A name, once
//! stale, never becomes fresh again (the time is in it), so deleting one
//! unfenced never loses a note.

use std::collections::BTreeMap;

use super::{FORGET_WORKERS_AFTER, SpotSightings};

/// Where the notes live: under the old shards' prefix, so that one listing
/// finds both while workers of the previous version still write shards.
pub const NOTES_PREFIX: &str = ".spot-worker/fleet/spot-sightings/by-worker/";

/// The most stale notes the cleaner deletes in one recheck: the rest wait
/// for the next (the readers ignore them meanwhile).
pub const CLEAN_AT_MOST: usize = 500;

/// What a note says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoteKind {
    /// The worker runs.
    Heard,
    /// The worker got an eviction notice.
    Evicted,
}

impl NoteKind {
    fn name(self) -> &'static str {
        match self {
            NoteKind::Heard => "heard",
            NoteKind::Evicted => "evicted",
        }
    }
}

/// One note, as its name says.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    /// The worker that wrote it.
    pub worker: String,
    /// What it says.
    pub kind: NoteKind,
    /// When, Unix microseconds.
    pub at_us: u64,
}

impl Note {
    /// The note `worker` writes that it was `kind` at `at` (Unix seconds,
    /// kept to the microsecond, as fine as an `f64` of today's time; a
    /// time before 1970 is 1970).
    pub fn new(worker: &str, kind: NoteKind, at: f64) -> Note {
        // `as` saturates: a negative or NaN time is 0.
        let at_us = (at * 1_000_000.0).floor() as u64;
        Note {
            worker: worker.to_owned(),
            kind,
            at_us,
        }
    }

    /// Its time, Unix seconds.
    pub fn at(&self) -> f64 {
        self.at_us as f64 / 1_000_000.0
    }

    /// Its checkpoint key.
    pub fn key(&self) -> String {
        format!(
            "{NOTES_PREFIX}{}/{}-{:016}",
            self.worker,
            self.kind.name(),
            self.at_us
        )
    }

    /// The note a key names; `None` for any other key (a shard, a name
    /// some other version wrote), which the reader skips.
    pub fn parse(key: &str) -> Option<Note> {
        let rest = key.strip_prefix(NOTES_PREFIX)?;
        let (worker, last) = rest.rsplit_once('/')?;
        let (kind, at_us) = last.split_once('-')?;
        let kind = match kind {
            "heard" => NoteKind::Heard,
            "evicted" => NoteKind::Evicted,
            _ => return None,
        };
        let at_us = at_us.parse().ok()?;
        (!worker.is_empty()).then(|| Note {
            worker: worker.to_owned(),
            kind,
            at_us,
        })
    }
}

/// The notes a listing found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Notes {
    notes: Vec<Note>,
}

impl Notes {
    /// The notes among `keys` (others skipped).
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Notes {
        Notes {
            notes: keys.into_iter().filter_map(Note::parse).collect(),
        }
    }

    /// Adds `note` (one just written).
    pub fn push(&mut self, note: Note) {
        self.notes.push(note);
    }

    /// The notes fresh at `now` (Unix seconds) as one record to merge:
    /// per worker its latest word and latest eviction; notes older than
    /// [`FORGET_WORKERS_AFTER`] are left out, as a shard forgot them.
    pub fn sightings(&self, now: f64) -> SpotSightings {
        let mut record = SpotSightings::default();
        for note in self.notes.iter().filter(|note| fresh(note, now)) {
            let map = match note.kind {
                NoteKind::Heard => &mut record.workers,
                NoteKind::Evicted => &mut record.evicted,
            };
            latest_into(map, &note.worker, note.at());
            if note.kind == NoteKind::Heard {
                record.heard_at = Some(record.heard_at.map_or(note.at(), |h| h.max(note.at())));
            }
        }
        record
    }

    /// `worker`'s latest word, Unix seconds.
    pub fn last_word(&self, worker: &str) -> Option<f64> {
        self.notes
            .iter()
            .filter(|note| note.worker == worker && note.kind == NoteKind::Heard)
            .map(Note::at)
            .max_by(f64::total_cmp)
    }

    /// `worker`'s words older than `kept` (its newest): the worker deletes
    /// them once `kept` is written.
    pub fn superseded_words<'a>(
        &'a self,
        worker: &'a str,
        kept: &'a Note,
    ) -> impl Iterator<Item = &'a Note> + 'a {
        self.notes.iter().filter(move |note| {
            note.worker == worker && note.kind == NoteKind::Heard && note.at_us < kept.at_us
        })
    }

    /// Whether `worker` is the one to delete the stale notes at `now`:
    /// the first in name order of the workers whose word is fresher than
    /// `window` and who were not evicted since. One worker a fleet (two for
    /// a moment as workers come and go: deleting twice is harmless).
    pub fn cleaner(&self, worker: &str, now: f64, window: f64) -> bool {
        let view = self.sightings(now);
        let first = view
            .workers
            .iter()
            .filter(|(name, heard)| {
                now - **heard <= window && view.evicted.get(*name).is_none_or(|at| at < *heard)
            })
            .map(|(name, _)| name.as_str())
            .next();
        first == Some(worker)
    }

    /// The notes stale at `now` (older than [`FORGET_WORKERS_AFTER`]), at
    /// most [`CLEAN_AT_MOST`].
    pub fn stale(&self, now: f64) -> impl Iterator<Item = &Note> {
        self.notes
            .iter()
            .filter(move |note| !fresh(note, now))
            .take(CLEAN_AT_MOST)
    }
}

/// Whether `note` still counts at `now`.
fn fresh(note: &Note, now: f64) -> bool {
    now - note.at() < FORGET_WORKERS_AFTER.as_secs_f64()
}

/// `worker` at `at` in `map`, the later time winning.
fn latest_into(map: &mut BTreeMap<String, f64>, worker: &str, at: f64) {
    map.entry(worker.to_owned())
        .and_modify(|kept| *kept = kept.max(at))
        .or_insert(at);
}

#[cfg(test)]
mod note_tests {
    use super::*;

    #[test]
    fn a_notes_name_says_all_of_it() {
        let t = 1_800_000_000.123;
        for (worker, kind) in [
            ("1234-abc", NoteKind::Heard),
            ("spot-0001", NoteKind::Evicted),
            ("a/b", NoteKind::Evicted),
        ] {
            let note = Note::new(worker, kind, t);
            let key = note.key();
            assert!(key.starts_with(NOTES_PREFIX), "{key}");
            assert_eq!(Note::parse(&key), Some(note.clone()), "{key}");
            assert!((note.at() - t).abs() < 0.000_01);
        }
        for other in [
            ".spot-worker/fleet/spot-sightings/07",
            ".spot-worker/fleet/spot-sightings/by-worker/w/slept-1",
            ".spot-worker/fleet/spot-sightings/by-worker/w/heard-x",
            ".spot-worker/fleet/spot-sightings/by-worker//heard-1",
            ".spot-worker/fleet/spot-sightings/by-worker/heard-1",
        ] {
            assert_eq!(Note::parse(other), None, "{other}");
        }
        assert_eq!(Note::new("w", NoteKind::Heard, -5.0).at_us, 0);
    }

    #[test]
    fn the_latest_notes_count_and_the_stale_are_cleaned_by_one() {
        let t = 1_800_000_000.0;
        let hour = FORGET_WORKERS_AFTER.as_secs_f64();
        let keys: Vec<String> = [
            Note::new("b", NoteKind::Heard, t - 60.0),
            Note::new("b", NoteKind::Heard, t - 1.0),
            Note::new("c", NoteKind::Heard, t - 10.0),
            Note::new("c", NoteKind::Evicted, t - 5.0),
            Note::new("a", NoteKind::Heard, t - hour - 1.0),
            Note::new("a", NoteKind::Evicted, t - hour),
        ]
        .iter()
        .map(Note::key)
        .collect();
        let notes = Notes::from_keys(keys.iter().map(String::as_str));
        let seen = notes.sightings(t);
        assert_eq!(
            seen.workers,
            BTreeMap::from([("b".into(), t - 1.0), ("c".into(), t - 10.0)])
        );
        assert_eq!(seen.evicted, BTreeMap::from([("c".into(), t - 5.0)]));
        assert_eq!(seen.heard_at, Some(t - 1.0));
        assert_eq!(notes.last_word("b"), Some(t - 1.0));
        let newest = Note::new("b", NoteKind::Heard, t);
        let superseded: Vec<f64> = notes.superseded_words("b", &newest).map(Note::at).collect();
        assert_eq!(superseded, [t - 60.0, t - 1.0]);
        // "a" is stale, "c" evicted: "b" cleans, and only "a"'s notes.
        assert!(notes.cleaner("b", t, 180.0));
        assert!(!notes.cleaner("c", t, 180.0));
        assert!(!notes.cleaner("a", t, 180.0));
        let stale: Vec<&str> = notes.stale(t).map(|n| n.worker.as_str()).collect();
        assert_eq!(stale, ["a", "a"]);
    }
}
