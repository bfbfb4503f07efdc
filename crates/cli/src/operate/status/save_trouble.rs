//! The jobs whose checkpoint keeps not being saved for a reason that may
//! clear (the store unavailable, credentials refused, a directory that
//! never holds still), by job key: what the runner records under
//! `.spot-worker/save-trouble/<job key>` (`spot_worker_storage::SaveTrouble`),
//! written once per change of the condition or every few minutes and
//! deleted at the next good save. One listing, and one read per record,
//! the most recently written first, at most `--max-reads`.

use anyhow::{Context as _, Result};
use futures_util::{StreamExt as _, stream};
use serde::Serialize;
use spot_worker_azure::BlobCheckpointStore;
use spot_worker_storage::{
    CheckpointStore as _, SAVE_TROUBLE_PREFIX, SaveTrouble, SaveTroubleKind,
};

use super::super::checkpoints::{most_recent, shorten};
use super::super::terminal::shown;
use super::super::{age, seconds_since};

/// Records read at once.
const PARALLEL_READS: usize = 16;
/// The longest error a line of the screen shows (`--json` has it whole).
const SHOWN_ERROR: usize = 120;

/// One job's trouble, with the ages `status` works out from it.
#[derive(Debug, Serialize)]
pub(super) struct JobSaveTrouble {
    #[serde(flatten)]
    pub(super) trouble: SaveTrouble,
    /// Seconds since the condition began.
    pub(super) for_seconds: i64,
    /// Seconds since the delivery last saved a version, if it did.
    pub(super) last_saved_seconds_ago: Option<i64>,
    /// Seconds since the record was written (a worker that died leaves
    /// its record behind: an old one says so).
    pub(super) updated_seconds_ago: i64,
}

/// The jobs in save trouble, and the records beyond `--max-reads`.
#[derive(Debug, Default, Serialize)]
pub(super) struct SaveTroubles {
    pub(super) jobs: Vec<JobSaveTrouble>,
    /// Records not read (older than the `--max-reads` newest).
    pub(super) not_read: usize,
}

/// Reads the newest `max_reads` save-trouble records of `store`.
pub(super) async fn save_troubles(
    store: &BlobCheckpointStore,
    max_reads: usize,
) -> Result<SaveTroubles> {
    let records: Vec<_> = store
        .list()
        .await
        .context("listing the checkpoint container")?
        .into_iter()
        .filter(|blob| blob.name.starts_with(SAVE_TROUBLE_PREFIX))
        .collect();
    let (to_read, not_read) = most_recent(records, max_reads);
    let mut jobs: Vec<JobSaveTrouble> = stream::iter(to_read)
        .map(|blob| async move {
            // A record deleted meanwhile (a good save) says nothing.
            match store.read(&blob.name).await {
                Ok(Some(stored)) => SaveTrouble::from_checkpoint(&stored.checkpoint),
                _ => None,
            }
        })
        .buffer_unordered(PARALLEL_READS)
        .filter_map(|trouble| async move { trouble.map(with_ages) })
        .collect()
        .await;
    jobs.sort_by(|a, b| a.trouble.job.cmp(&b.trouble.job));
    Ok(SaveTroubles { jobs, not_read })
}

fn with_ages(trouble: SaveTrouble) -> JobSaveTrouble {
    JobSaveTrouble {
        for_seconds: seconds_since(trouble.since),
        last_saved_seconds_ago: trouble.last_saved.map(seconds_since),
        updated_seconds_ago: seconds_since(trouble.updated),
        trouble,
    }
}

/// What one job's trouble says, in a few words: "not saved for 14m:
/// store unavailable"; "directory never held still: last version 9m old".
pub(super) fn summary(job: &JobSaveTrouble) -> String {
    let kind = job.trouble.kind.describe();
    let saved = match job.last_saved_seconds_ago {
        Some(seconds) => format!("last version {} old", age(seconds)),
        None => "nothing saved by this delivery".to_owned(),
    };
    match job.trouble.kind {
        SaveTroubleKind::NeverHeldStill => format!("{kind} for {}: {saved}", age(job.for_seconds)),
        _ => format!("not saved for {}: {kind} ({saved})", age(job.for_seconds)),
    }
}

/// The lines `status` prints: none when no job is in trouble.
pub(super) fn lines(troubles: &SaveTroubles) -> Vec<String> {
    if troubles.jobs.is_empty() {
        return Vec::new();
    }
    let unread = match troubles.not_read {
        0 => String::new(),
        n => format!("; {n} older record(s) not read, see --max-reads"),
    };
    let mut lines = vec![format!(
        "not saving {} job(s) whose checkpoint is not being saved (save-trouble records{unread}):",
        troubles.jobs.len()
    )];
    for job in &troubles.jobs {
        let stale = if job.updated_seconds_ago > 2 * SaveTrouble::REWRITE_EVERY.as_secs() as i64 {
            format!(
                " [record {} old: its worker may be gone]",
                age(job.updated_seconds_ago)
            )
        } else {
            String::new()
        };
        lines.push(format!(
            "  {:<32} {}, {} look(s), last: {}{stale}",
            shown(&job.trouble.job),
            summary(job),
            job.trouble.looks,
            shown(&shorten(
                job.trouble.last_error.replace('\n', " "),
                SHOWN_ERROR
            ))
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::OffsetDateTime;

    /// When `seconds` ago was.
    fn ago_by(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::now_utc() - time::Duration::seconds(seconds)
    }

    fn trouble(kind: SaveTroubleKind, since: i64, saved: Option<i64>) -> JobSaveTrouble {
        with_ages(SaveTrouble {
            job: "job-7".to_owned(),
            kind,
            since: ago_by(since),
            updated: ago_by(10),
            last_saved: saved.map(ago_by),
            looks: 4,
            last_error: "503 Service Unavailable".to_owned(),
        })
    }

    #[test]
    fn each_condition_reads_as_what_it_means() {
        let unavailable = trouble(SaveTroubleKind::StoreUnavailable, 14 * 60 + 5, None);
        assert_eq!(
            summary(&unavailable),
            "not saved for 14m: store unavailable (nothing saved by this delivery)"
        );
        let still = trouble(SaveTroubleKind::NeverHeldStill, 60, Some(9 * 60 + 1));
        assert_eq!(
            summary(&still),
            "directory never held still for 1m: last version 9m old"
        );
        assert!(lines(&SaveTroubles::default()).is_empty());
        let shown = lines(&SaveTroubles {
            jobs: vec![unavailable, still],
            not_read: 0,
        });
        assert_eq!(shown.len(), 3, "{shown:?}");
        assert!(
            shown[1].contains("job-7") && shown[1].contains("4 look(s)"),
            "{}",
            shown[1]
        );
        assert!(!shown[1].contains("may be gone"), "{}", shown[1]);
    }
}
