//! Save trouble: a job whose checkpoint keeps not being saved for a reason
//! that may clear (the store unavailable, credentials refused, a directory
//! the program never lets hold still), recorded where `spot-worker status`
//! reads, so that it is shown and not only logged at every look.
//!
//! One small record per job, `.spot-worker/save-trouble/<job key>`, written
//! by the delivery that runs into the trouble: at most once per change of
//! the condition or per [`SaveTrouble::REWRITE_EVERY`], never per look,
//! and deleted by the next good save (or the job's end). A record whose
//! write fails (the store it describes is the one that fails) is written at
//! a later look; a worker that dies leaves it behind, which its `updated`
//! time tells (`status` shows it).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::checkpoint::Checkpoint;

/// Where a job's save-trouble record is kept: this and the job's key.
pub const SAVE_TROUBLE_PREFIX: &str = ".spot-worker/save-trouble/";

/// Why a job's checkpoint is not being saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveTroubleKind {
    /// The store did not answer (an outage, a timeout, throttling).
    StoreUnavailable,
    /// The store refused this worker's credentials (401/403).
    CredentialsRefused,
    /// The checkpoint container is missing.
    ContainerMissing,
    /// Any other store error a later try may not meet.
    StoreError,
    /// The checkpoint directory was never one state of the program long
    /// enough to be read as one (docs/command.md).
    NeverHeldStill,
    /// The checkpoint could not be read (an I/O error, a SQLite backup
    /// that failed).
    Unreadable,
}

impl SaveTroubleKind {
    /// The kind in a few words, for people.
    pub fn describe(self) -> &'static str {
        match self {
            SaveTroubleKind::StoreUnavailable => "store unavailable",
            SaveTroubleKind::CredentialsRefused => "credentials refused",
            SaveTroubleKind::ContainerMissing => "checkpoint container missing",
            SaveTroubleKind::StoreError => "store error",
            SaveTroubleKind::NeverHeldStill => "directory never held still",
            SaveTroubleKind::Unreadable => "checkpoint unreadable",
        }
    }
}

/// One job's save trouble, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveTrouble {
    /// The job's key.
    pub job: String,
    /// Why it is not saved.
    pub kind: SaveTroubleKind,
    /// When this condition began (the first look that met it).
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// When the record was last written.
    #[serde(with = "time::serde::rfc3339")]
    pub updated: OffsetDateTime,
    /// When this delivery last saved a version (`None`: not yet).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_saved: Option<OffsetDateTime>,
    /// Looks (tries) that met the condition so far.
    pub looks: u32,
    /// The latest error, secrets removed, at most
    /// [`SaveTrouble::MAX_ERROR_LEN`] bytes.
    pub last_error: String,
}

impl SaveTrouble {
    /// How often a record of a condition that has not changed is written
    /// again (its `looks` and `updated`).
    pub const REWRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(180);

    /// The longest `last_error` kept.
    pub const MAX_ERROR_LEN: usize = 512;

    /// The record's key for `job`.
    pub fn key(job: &str) -> String {
        format!("{SAVE_TROUBLE_PREFIX}{job}")
    }

    /// The record as stored (an in-progress checkpoint whose progress is
    /// the record, as attempt records are).
    pub fn to_checkpoint(&self) -> Result<Checkpoint, serde_json::Error> {
        Ok(Checkpoint::InProgress {
            progress: serde_json::to_value(self)?,
        })
    }

    /// The record a stored checkpoint holds; `None` if it is none.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Option<SaveTrouble> {
        let Checkpoint::InProgress { progress } = checkpoint else {
            return None;
        };
        serde_json::from_value(progress.clone()).ok()
    }

    /// `error` cut to [`SaveTrouble::MAX_ERROR_LEN`] bytes at a character
    /// boundary.
    pub fn shortened(error: &str) -> String {
        if error.len() <= Self::MAX_ERROR_LEN {
            return error.to_owned();
        }
        let mut end = Self::MAX_ERROR_LEN;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &error[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_nothing_else_reads_as_one() {
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let trouble = SaveTrouble {
            job: "job-1".to_owned(),
            kind: SaveTroubleKind::NeverHeldStill,
            since: at,
            updated: at,
            last_saved: None,
            looks: 12,
            last_error: "changed while read".to_owned(),
        };
        let stored = trouble.to_checkpoint().unwrap();
        assert_eq!(SaveTrouble::from_checkpoint(&stored), Some(trouble));
        let other = Checkpoint::InProgress {
            progress: serde_json::json!({"failures": 1}),
        };
        assert_eq!(SaveTrouble::from_checkpoint(&other), None);
        assert_eq!(SaveTrouble::key("a/b"), ".spot-worker/save-trouble/a/b");
    }

    #[test]
    fn a_long_error_is_cut_at_a_character_boundary() {
        let long = "é".repeat(SaveTrouble::MAX_ERROR_LEN);
        let short = SaveTrouble::shortened(&long);
        assert!(short.len() <= SaveTrouble::MAX_ERROR_LEN + '…'.len_utf8());
        assert!(short.ends_with('…'));
        assert_eq!(SaveTrouble::shortened("short"), "short");
    }
}
