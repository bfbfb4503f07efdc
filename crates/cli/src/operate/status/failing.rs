//! The jobs whose handler failed and whose message will be tried again,
//! by job key, with the latest failure: what each message's attempt record
//! (`.spot-worker/attempts/<message id>`) says. A checkpoint no save can
//! store (over the entry cap, a name that is not UTF-8, a path too long
//! to restore, over the size limit) fails its delivery at the first look,
//! so it is shown here, by the job's key, with the reason. One listing,
//! and one read per record, the most recently written first, at most
//! `--max-reads`. A job given up on leaves its attempt record for the
//! poison queue (`spot-worker poison list`).

use anyhow::{Context as _, Result};
use futures_util::{StreamExt as _, stream};
use serde::Serialize;
use spot_worker_azure::BlobCheckpointStore;
use spot_worker_storage::{ATTEMPT_RECORD_PREFIX, CheckpointStore as _, FailingJob};

use super::super::checkpoints::{most_recent, shorten};
use super::super::terminal::shown;

/// Attempt records read at once.
const PARALLEL_READS: usize = 16;
/// The longest error a line of the screen shows (`--json` has it whole).
const SHOWN_ERROR: usize = 160;

/// The failing jobs, and the attempt records beyond `--max-reads`.
#[derive(Debug, Default, Serialize)]
pub(super) struct FailingJobs {
    pub(super) jobs: Vec<FailingJob>,
    /// Attempt records not read (older than the `--max-reads` newest).
    pub(super) not_read: usize,
}

/// Reads the newest `max_reads` attempt records of `store`.
pub(super) async fn failing_jobs(
    store: &BlobCheckpointStore,
    max_reads: usize,
) -> Result<FailingJobs> {
    let records: Vec<_> = store
        .list()
        .await
        .context("listing the checkpoint container")?
        .into_iter()
        .filter(|blob| blob.name.starts_with(ATTEMPT_RECORD_PREFIX))
        .collect();
    let (to_read, not_read) = most_recent(records, max_reads);
    let mut jobs: Vec<FailingJob> = stream::iter(to_read)
        .map(|blob| async move {
            // A record deleted meanwhile (its message settled) or unreadable
            // says nothing of a failing job.
            match store.read(&blob.name).await {
                Ok(Some(stored)) => FailingJob::from_attempt_record(&stored.checkpoint),
                _ => None,
            }
        })
        .buffer_unordered(PARALLEL_READS)
        .filter_map(|job| async move { job })
        .collect()
        .await;
    jobs.sort_by(|a, b| a.job.cmp(&b.job));
    Ok(FailingJobs { jobs, not_read })
}

/// The lines `status` prints: none when no job is failing.
pub(super) fn lines(failing: &FailingJobs) -> Vec<String> {
    if failing.jobs.is_empty() {
        return Vec::new();
    }
    let unread = match failing.not_read {
        0 => String::new(),
        n => format!("; {n} older attempt record(s) not read, see --max-reads"),
    };
    let mut lines = vec![format!(
        "failing {} job(s) failed and will be tried again (attempt records{unread}):",
        failing.jobs.len()
    )];
    for job in &failing.jobs {
        let key = job.job.as_deref().unwrap_or("(job key not recorded)");
        lines.push(format!(
            "  {:<32} {} failure(s), last: {}",
            shown(key),
            job.failures,
            shown(&shorten(job.last_error.replace('\n', " "), SHOWN_ERROR))
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failing_job_is_one_line_by_its_key_with_its_error() {
        assert!(lines(&FailingJobs::default()).is_empty());
        let failing = FailingJobs {
            jobs: vec![
                FailingJob {
                    job: Some("job-7".to_owned()),
                    failures: 2,
                    last_error:
                        "the checkpoint directory holds more than 10000 files\nand directories"
                            .to_owned(),
                },
                FailingJob {
                    job: None,
                    failures: 1,
                    last_error: "x".repeat(500),
                },
            ],
            not_read: 3,
        };
        let shown = lines(&failing);
        assert_eq!(shown.len(), 3, "{shown:?}");
        assert!(
            shown[0].contains("2 job(s)") && shown[0].contains("3 older"),
            "{}",
            shown[0]
        );
        assert!(shown[1].contains("job-7"), "{}", shown[1]);
        assert!(
            shown[1].contains("2 failure(s), last: the checkpoint directory holds more than 10000 files and directories"),
            "{}",
            shown[1]
        );
        assert!(shown[2].contains("(job key not recorded)"), "{}", shown[2]);
        assert!(shown[2].chars().count() < 260, "{}", shown[2]);
    }
}
