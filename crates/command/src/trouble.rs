//! What a delivery knows about saves that keep failing, kept where
//! `spot-worker status` reads it ([`SaveTrouble`]): the store unavailable
//! or refusing the worker's credentials, a checkpoint that cannot be read,
//! a directory the program never lets hold still. The log says each at
//! every look; the record says it once per change of the condition or per
//! [`SaveTrouble::REWRITE_EVERY`], and goes at the next good save.
//!
//! [`TroubleLog`] is the decision, pure: what a look met, and whether the
//! record is to be written or deleted now. The delivery's loop performs
//! the write beside itself, so a store that hangs never holds up a look or
//! the stop signal.

use std::time::{Duration, Instant};

use spot_worker_storage::{SaveTrouble, SaveTroubleKind, StorageError};
use time::OffsetDateTime;

/// Looks in a row that met a store or read error before it is recorded: one
/// failed look is a blip the next look may clear.
pub(crate) const RECORD_AFTER: u32 = 2;

/// The kind of trouble a store error is.
pub(crate) fn kind_of(error: &StorageError) -> SaveTroubleKind {
    match error {
        StorageError::Unavailable { .. } => SaveTroubleKind::StoreUnavailable,
        StorageError::Refused { .. } => SaveTroubleKind::CredentialsRefused,
        StorageError::MissingContainer { .. } => SaveTroubleKind::ContainerMissing,
        _ => SaveTroubleKind::StoreError,
    }
}

/// The looks that must meet `kind` in a row before it is recorded.
fn record_after(kind: SaveTroubleKind) -> u32 {
    match kind {
        // Said in the log at the same count (`settle.rs`).
        SaveTroubleKind::NeverHeldStill => crate::settle::REPORT_AFTER,
        _ => RECORD_AFTER,
    }
}

/// What the record should become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// Write it as this.
    Write(SaveTrouble),
    /// Delete it.
    Delete,
}

/// One delivery's save trouble: the condition now, and what the store
/// was last told.
#[derive(Debug)]
pub(crate) struct TroubleLog {
    job: String,
    /// The condition now, if any.
    now: Option<SaveTrouble>,
    /// The kind last written, and when (`None`: nothing written by this
    /// delivery, or the write failed).
    written: Option<(SaveTroubleKind, Instant)>,
    /// Whether the store may hold a record (written by this delivery or
    /// an earlier one) that a good save should delete.
    maybe_stored: bool,
}

impl TroubleLog {
    /// A delivery's log; `maybe_stored` if an earlier delivery of the job
    /// may have left a record.
    pub(crate) fn new(job: &str, maybe_stored: bool) -> Self {
        TroubleLog {
            job: job.to_owned(),
            now: None,
            written: None,
            maybe_stored,
        }
    }

    /// A look met `kind` (`error`: what it said, secrets removed). What
    /// to write now, if anything: once the condition has lasted
    /// [`record_after`] looks, when it changes kind, and every
    /// [`SaveTrouble::REWRITE_EVERY`] while it lasts.
    pub(crate) fn met(
        &mut self,
        kind: SaveTroubleKind,
        error: &str,
        last_saved: Option<OffsetDateTime>,
        (wall, now): (OffsetDateTime, Instant),
    ) -> Option<Record> {
        let trouble = match self.now.take() {
            Some(mut same) if same.kind == kind => {
                same.looks = same.looks.saturating_add(1);
                same
            }
            _ => SaveTrouble {
                job: self.job.clone(),
                kind,
                since: wall,
                updated: wall,
                last_saved: None,
                looks: 1,
                last_error: String::new(),
            },
        };
        let trouble = SaveTrouble {
            updated: wall,
            last_saved,
            last_error: SaveTrouble::shortened(error),
            ..trouble
        };
        let due = trouble.looks >= record_after(kind)
            && match self.written {
                Some((written, at)) => {
                    written != kind || now.duration_since(at) >= SaveTrouble::REWRITE_EVERY
                }
                None => true,
            };
        self.now = Some(trouble.clone());
        if !due {
            return None;
        }
        self.written = Some((kind, now));
        self.maybe_stored = true;
        Some(Record::Write(trouble))
    }

    /// A good save: the condition is over. [`Record::Delete`] if the
    /// store may hold a record.
    pub(crate) fn cleared(&mut self) -> Option<Record> {
        self.now = None;
        self.written = None;
        std::mem::replace(&mut self.maybe_stored, false).then_some(Record::Delete)
    }

    /// A write or delete of the record failed: the next look tries again
    /// (a record that may be stored is still to be deleted).
    pub(crate) fn failed(&mut self, record: &Record) {
        match record {
            Record::Write(_) => self.written = None,
            Record::Delete => self.maybe_stored = true,
        }
    }

    /// Whether the store may hold a record.
    pub(crate) fn maybe_stored(&self) -> bool {
        self.maybe_stored
    }
}

/// A wall-clock time `ago` before now (for "last saved").
pub(crate) fn wall_ago(ago: Duration) -> OffsetDateTime {
    OffsetDateTime::now_utc() - ago
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks(seconds: u64, start: Instant) -> (OffsetDateTime, Instant) {
        let wall = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        (
            wall + Duration::from_secs(seconds),
            start + Duration::from_secs(seconds),
        )
    }

    fn written(record: Option<Record>) -> Option<SaveTrouble> {
        match record {
            Some(Record::Write(trouble)) => Some(trouble),
            Some(Record::Delete) => panic!("a delete, not a write"),
            None => None,
        }
    }

    #[test]
    fn a_store_outage_is_written_at_its_second_look_then_only_on_change_or_every_few_minutes() {
        let start = Instant::now();
        let mut log = TroubleLog::new("job", false);
        let unavailable = SaveTroubleKind::StoreUnavailable;
        assert_eq!(log.met(unavailable, "503", None, clocks(0, start)), None);
        let first = written(log.met(unavailable, "503", None, clocks(60, start))).unwrap();
        assert_eq!((first.looks, first.kind), (2, unavailable));
        assert_eq!(first.since, clocks(0, start).0, "since the first look");
        // The same condition: not again until REWRITE_EVERY has passed.
        assert_eq!(log.met(unavailable, "503", None, clocks(120, start)), None);
        let again = written(log.met(unavailable, "503", None, clocks(241, start))).unwrap();
        assert_eq!((again.looks, again.since), (4, first.since));
        // A new kind starts its own count and is written once due.
        let refused = SaveTroubleKind::CredentialsRefused;
        assert_eq!(log.met(refused, "403", None, clocks(250, start)), None);
        let changed = written(log.met(refused, "403", None, clocks(260, start))).unwrap();
        assert_eq!((changed.kind, changed.looks), (refused, 2));
        assert_eq!(changed.since, clocks(250, start).0);
        // A good save deletes it, once.
        assert_eq!(log.cleared(), Some(Record::Delete));
        assert_eq!(log.cleared(), None);
    }

    #[test]
    fn a_directory_that_never_holds_still_is_written_when_the_log_says_it() {
        let start = Instant::now();
        let mut log = TroubleLog::new("job", false);
        let kind = SaveTroubleKind::NeverHeldStill;
        for look in 1..crate::settle::REPORT_AFTER {
            assert_eq!(
                log.met(kind, "changing", None, clocks(u64::from(look), start)),
                None
            );
        }
        let trouble = written(log.met(kind, "changing", None, clocks(99, start))).unwrap();
        assert_eq!(trouble.looks, crate::settle::REPORT_AFTER);
    }

    #[test]
    fn a_failed_write_is_tried_at_the_next_look_and_an_earlier_record_is_deleted() {
        let start = Instant::now();
        let mut log = TroubleLog::new("job", false);
        let kind = SaveTroubleKind::StoreUnavailable;
        log.met(kind, "x", None, clocks(0, start));
        let record = log.met(kind, "x", None, clocks(1, start)).unwrap();
        log.failed(&record);
        assert!(written(log.met(kind, "x", None, clocks(2, start))).is_some());
        // No trouble in this delivery, but an earlier one may have left a
        // record: the first good save deletes it.
        let mut later = TroubleLog::new("job", true);
        assert!(later.maybe_stored());
        assert_eq!(later.cleared(), Some(Record::Delete));
        assert_eq!(later.cleared(), None);
        let mut fresh = TroubleLog::new("job", false);
        assert_eq!(fresh.cleared(), None);
    }

    #[test]
    fn store_errors_are_told_apart() {
        let message = || "m".to_owned();
        assert_eq!(
            kind_of(&StorageError::Unavailable { message: message() }),
            SaveTroubleKind::StoreUnavailable
        );
        assert_eq!(
            kind_of(&StorageError::Refused {
                status: 403,
                message: message()
            }),
            SaveTroubleKind::CredentialsRefused
        );
        assert_eq!(
            kind_of(&StorageError::MissingContainer {
                what: "c".to_owned(),
                message: message()
            }),
            SaveTroubleKind::ContainerMissing
        );
    }
}
