//! `spot-worker checkpoints list|show|delete`: the job checkpoints in the
//! checkpoint container (`SPOT_WORKER_CHECKPOINT_CONTAINER`). The worker's
//! own records under `.spot-worker/` (attempt records, write probes) are
//! not jobs: listings skip them and `delete` refuses them.

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use futures_util::{StreamExt as _, stream};
use serde_json::Value;
use spot_worker_azure::{BlobCheckpointStore, StoredBlob};
use spot_worker_storage::{Checkpoint, CheckpointStore as _, StoredCheckpoint};
use time::OffsetDateTime;

use super::terminal::{shown, shown_json};
use super::{Fleet, age, confirm, rfc3339, saved_files, seconds_since};

/// The prefix of the worker's own records in the checkpoint container.
const WORKER_RECORDS: &str = ".spot-worker/";
/// Checkpoint reads in flight at once while listing.
const PARALLEL_READS: usize = 16;

/// List, show or delete job checkpoints.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  spot-worker checkpoints list --in-progress
  spot-worker checkpoints show job-42
  spot-worker checkpoints delete job-42 --yes

The container is SPOT_WORKER_CHECKPOINT_CONTAINER (default `checkpoints`).
`show` prints a checkpoint file saved by `spot-worker run` as its text (or,
if it is not UTF-8, its size and first bytes in hex), not as base64. On a
terminal, control characters a program wrote (an escape sequence, a carriage
return) are shown escaped, as \\u{1b}; piped, the text is exact.")]
pub struct CheckpointsArgs {
    #[command(subcommand)]
    command: CheckpointsCommand,
}

#[derive(Debug, Subcommand)]
enum CheckpointsCommand {
    /// One line per job: status, progress or result, size, last write.
    #[command(after_help = "\
Examples:
  spot-worker checkpoints list
  spot-worker checkpoints list --in-progress
  spot-worker checkpoints list --json | jq -r '.[] | select(.status == \"completed\") | .job'")]
    List {
        /// Only jobs still in progress.
        #[arg(long)]
        in_progress: bool,
        /// One JSON array of `{job, status, progress|result, size, last_write}`.
        #[arg(long)]
        json: bool,
    },
    /// One job's checkpoint in full.
    #[command(after_help = "\
Example:
  spot-worker checkpoints show job-42")]
    Show {
        /// The job key (the checkpoint's name).
        job: String,
    },
    /// Delete jobs' checkpoints, so their next delivery starts from scratch.
    #[command(after_help = "\
Examples:
  spot-worker checkpoints delete job-42            # asks first
  spot-worker checkpoints delete job-42 job-43 --yes

A worker still running the job gets a conflict on its next checkpoint write
and hands the message back; deleting a completed checkpoint lets a
redelivered message run the job again.")]
    Delete {
        /// The job keys.
        #[arg(required = true)]
        jobs: Vec<String>,
        /// Do not ask for confirmation (required when stdin is no terminal).
        #[arg(long)]
        yes: bool,
    },
}

/// One job checkpoint as listed.
pub struct JobRow {
    pub job: String,
    pub len: u64,
    pub last_write: Option<OffsetDateTime>,
    /// The checkpoint, or why it could not be read.
    pub checkpoint: Result<Checkpoint, String>,
}

impl JobRow {
    pub fn is_in_progress(&self) -> bool {
        matches!(self.checkpoint, Ok(Checkpoint::InProgress { .. }))
    }

    /// The row as a JSON object (for `--json`).
    pub fn to_json(&self) -> Value {
        let mut document = serde_json::json!({
            "job": self.job,
            "size": self.len,
            "last_write": self.last_write.map(rfc3339),
        });
        let fields = match &self.checkpoint {
            Ok(checkpoint) => serde_json::to_value(checkpoint).unwrap_or_default(),
            Err(e) => serde_json::json!({"status": "unreadable", "error": e}),
        };
        if let (Some(document), Value::Object(fields)) = (document.as_object_mut(), fields) {
            document.extend(fields);
        }
        document
    }
}

/// Whether a blob of the checkpoint container is a job's checkpoint.
fn is_job(name: &str) -> bool {
    !name.starts_with(WORKER_RECORDS)
}

/// The job checkpoints, read (at most [`PARALLEL_READS`] at once), in
/// name order; with `max_reads`, only that many of the most recently
/// written (one request each), and the count of those left unread.
pub async fn job_rows(
    store: &BlobCheckpointStore,
    max_reads: Option<usize>,
) -> Result<(Vec<JobRow>, usize)> {
    let blobs = store
        .list()
        .await
        .context("listing the checkpoint container")?;
    let jobs: Vec<StoredBlob> = blobs
        .into_iter()
        .filter(|blob| is_job(&blob.name))
        .collect();
    let (to_read, unread) = match max_reads {
        Some(max) => most_recent(jobs, max),
        None => (jobs, 0),
    };
    let mut rows: Vec<JobRow> = stream::iter(to_read)
        .map(|blob| read_row(store, blob))
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    rows.sort_by(|a, b| a.job.cmp(&b.job));
    Ok((rows, unread))
}

/// The `max` most recently written blobs (a job being worked on is written
/// often; a finished one never again), and how many were left out.
pub fn most_recent(mut blobs: Vec<StoredBlob>, max: usize) -> (Vec<StoredBlob>, usize) {
    blobs.sort_by_key(|blob| std::cmp::Reverse(blob.last_modified));
    let unread = blobs.len().saturating_sub(max);
    blobs.truncate(max);
    (blobs, unread)
}

async fn read_row(store: &BlobCheckpointStore, blob: StoredBlob) -> JobRow {
    let checkpoint = match store.read(&blob.name).await {
        Ok(Some(stored)) => Ok(stored.checkpoint),
        Ok(None) => Err("deleted while listing".to_owned()),
        Err(e) => Err(e.to_string()),
    };
    JobRow {
        job: blob.name,
        len: blob.len,
        last_write: blob.last_modified,
        checkpoint,
    }
}

/// A JSON value on one line of a table, at most `max` characters.
pub fn compact(value: &Value, max: usize) -> String {
    shorten(value.to_string(), max)
}

/// `text` in at most `max` characters, an ellipsis saying it was cut.
pub fn shorten(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut short: String = text.chars().take(max).collect();
    short.push('…');
    short
}

/// `3m ago`, or `-` when unknown.
pub fn ago(time: Option<OffsetDateTime>) -> String {
    time.map_or_else(
        || "-".to_owned(),
        |t| format!("{} ago", age(seconds_since(t))),
    )
}

pub async fn run(args: CheckpointsArgs) -> Result<()> {
    let fleet = Fleet::from_env()?;
    let store = fleet.checkpoints()?;
    match args.command {
        CheckpointsCommand::List { in_progress, json } => {
            list(&fleet, &store, in_progress, json).await
        }
        CheckpointsCommand::Show { job } => show(&fleet, &store, &job).await,
        CheckpointsCommand::Delete { jobs, yes } => delete(&fleet, &store, &jobs, yes).await,
    }
}

async fn list(
    fleet: &Fleet,
    store: &BlobCheckpointStore,
    in_progress: bool,
    json: bool,
) -> Result<()> {
    let (rows, _) = job_rows(store, None).await?;
    let rows: Vec<JobRow> = rows
        .into_iter()
        .filter(|row| !in_progress || row.is_in_progress())
        .collect();
    if json {
        let documents: Vec<Value> = rows.iter().map(JobRow::to_json).collect();
        println!("{}", shown_json(&serde_json::to_string_pretty(&documents)?));
        return Ok(());
    }
    println!(
        "{:<32}  {:<11}  {:>8}  {:>10}  PROGRESS / RESULT",
        "JOB", "STATUS", "SIZE", "LAST WRITE"
    );
    for row in &rows {
        let (status, detail) = match &row.checkpoint {
            Ok(Checkpoint::InProgress { progress }) => {
                ("in_progress", saved_files::one_line(progress, 60))
            }
            Ok(Checkpoint::Completed { result }) => ("completed", compact(result, 60)),
            Err(e) => ("unreadable", e.clone()),
        };
        let line = format!(
            "{:<32}  {:<11}  {:>8}  {:>10}  {detail}",
            row.job,
            status,
            row.len,
            ago(row.last_write)
        );
        // One row each: a line break in a job key or a value is escaped.
        println!("{}", shown(&line.replace(['\n', '\t'], " ")));
    }
    println!(
        "{} job checkpoint(s) in container {}",
        rows.len(),
        fleet.config.checkpoint_container
    );
    Ok(())
}

async fn show(fleet: &Fleet, store: &BlobCheckpointStore, job: &str) -> Result<()> {
    let Some(StoredCheckpoint {
        checkpoint,
        etag,
        stamp,
    }) = store
        .read(job)
        .await
        .with_context(|| format!("reading the checkpoint of job {job:?}"))?
    else {
        bail!(
            "no checkpoint for job {job:?} in container {} (see `spot-worker checkpoints list`)",
            fleet.config.checkpoint_container
        );
    };
    let (status, label, value) = match &checkpoint {
        Checkpoint::InProgress { progress } => ("in_progress", "progress", progress),
        Checkpoint::Completed { result } => ("completed", "result", result),
    };
    let mut out = format!(
        "job:         {job}\nstatus:      {status}\netag:        {}\n",
        etag.as_str()
    );
    if let Some(stamp) = stamp {
        out.push_str(&format!("written by:  {stamp}\n"));
    }
    match saved_files::describe(value) {
        // What `spot-worker run` saved: the files, not their base64 or
        // chunk lists.
        Some(files) => out.push_str(&format!("{label}:\n{files}\n")),
        None => out.push_str(&format!(
            "{label}:\n{}\n",
            serde_json::to_string_pretty(value)?
        )),
    }
    // The program's bytes: escaped on a terminal, exact when piped.
    print!("{}", shown(&out));
    Ok(())
}

async fn delete(
    fleet: &Fleet,
    store: &BlobCheckpointStore,
    jobs: &[String],
    yes: bool,
) -> Result<()> {
    if let Some(record) = jobs.iter().find(|job| !is_job(job)) {
        bail!("{record:?} is one of the worker's own records ({WORKER_RECORDS}), not a job");
    }
    let question = format!(
        "delete the checkpoint(s) of {} from container {}",
        jobs.join(", "),
        fleet.config.checkpoint_container
    );
    if !confirm(&question, yes)? {
        bail!("not confirmed: nothing was deleted");
    }
    let mut missing = Vec::new();
    for job in jobs {
        let exists = store
            .read(job)
            .await
            .with_context(|| format!("reading the checkpoint of job {job:?}"))?
            .is_some();
        if !exists {
            missing.push(job.as_str());
            continue;
        }
        store
            .delete(job)
            .await
            .with_context(|| format!("deleting the checkpoint of job {job:?}"))?;
        println!("deleted the checkpoint of {job}");
    }
    if !missing.is_empty() {
        bail!("no checkpoint for job(s) {}", missing.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_own_records_are_not_jobs() {
        for (name, job) in [
            ("job-1", true),
            ("a/b", true),
            (".spot-worker/attempts/abc", false),
            (".spot-worker/probe-1", false),
            (".spot-workers", true),
        ] {
            assert_eq!(is_job(name), job, "{name}");
        }
    }

    #[test]
    fn the_most_recently_written_are_read_first() {
        let blob = |name: &str, minute: Option<i64>| StoredBlob {
            name: name.to_owned(),
            len: 1,
            last_modified: minute.map(|m| OffsetDateTime::UNIX_EPOCH + time::Duration::minutes(m)),
        };
        let blobs = || {
            vec![
                blob("old", Some(1)),
                blob("new", Some(3)),
                blob("mid", Some(2)),
                blob("unknown", None),
            ]
        };
        let names = |(blobs, unread): (Vec<StoredBlob>, usize)| {
            (
                blobs.into_iter().map(|b| b.name).collect::<Vec<_>>(),
                unread,
            )
        };
        for (max, expected, unread) in [
            (0, vec![], 4),
            (2, vec!["new", "mid"], 2),
            (4, vec!["new", "mid", "old", "unknown"], 0),
            (9, vec!["new", "mid", "old", "unknown"], 0),
        ] {
            assert_eq!(
                names(most_recent(blobs(), max)),
                (expected.into_iter().map(str::to_owned).collect(), unread),
                "{max}"
            );
        }
    }

    #[test]
    fn json_values_fit_one_table_cell() {
        assert_eq!(compact(&serde_json::json!({"next": 7}), 20), "{\"next\":7}");
        assert_eq!(compact(&serde_json::json!("abcdef"), 4), "\"abc…");
        assert_eq!(compact(&Value::Null, 4), "null");
    }
}
