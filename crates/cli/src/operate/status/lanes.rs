//! The lanes' part of `spot-worker status` (docs/deploying.md, "The two lanes"): d, the switch
//! cost the rule uses, by part; and every job with a deadline not finished
//! yet, with its lane, progress and slack, those at risk (slack below two
//! switches and a recheck: they must run on regular capacity now to make
//! it) and those late (slack below zero) named first. The jobs come from
//! their lane records (one read each, and one of their checkpoint for the
//! progress), and from the messages waiting at the front of both queues
//! that no worker has received yet.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use futures_util::{StreamExt as _, stream};
use serde::Serialize;
use spot_worker_azure::{AzureQueue, BlobCheckpointStore, StoredBlob};
use spot_worker_decisions::goodput::{split_stamp, stamp_progress};
use spot_worker_decisions::lanes::{
    DEFAULT_SWITCH_COST_SEED, Deadline, Lane, SwitchCostParts, switch_cost,
};
use spot_worker_lanes::{
    Envelope, FleetSwitchCost, LANE_RECORD_PREFIX, LaneRecord, LaneRecords, progress_of,
};
use spot_worker_runtime::LaneSettings;
use spot_worker_storage::{CheckpointStore, MessageEncoding, StorageError};

use crate::operate::age;

/// Reads in flight at once.
const PARALLEL_READS: usize = 16;

#[derive(Debug, Serialize)]
pub(super) struct LanesStatus {
    /// d, seconds, and its parts.
    switch_cost_seconds: f64,
    switch_cost_parts: Parts,
    /// Switches the fleet measured (samples of queue wait).
    measured_switches: u64,
    /// The keeper's period: the rule's recheck.
    recheck_seconds: f64,
    /// Jobs with a deadline not finished yet, most urgent first.
    jobs: Vec<DeadlineJob>,
    /// Of those, at risk (slack below two switches and a recheck).
    at_risk: usize,
    /// Of those, late (even running from now on misses the deadline).
    late: usize,
    /// Lane records beyond --max-reads, not read.
    not_read: usize,
}

#[derive(Debug, Serialize)]
struct Parts {
    queue_wait: f64,
    start_up: f64,
    restore: f64,
    lost_work: f64,
}

#[derive(Debug, Serialize)]
struct DeadlineJob {
    job: String,
    lane: Lane,
    /// `waiting` (no worker has taken it yet), or `started`.
    state: &'static str,
    due: String,
    work_seconds: f64,
    /// As of the job's last save (0 before its first).
    progress_seconds: f64,
    /// Whether the job has saved a checkpoint yet: before its first save
    /// the fleet knows nothing of its progress, and says so.
    saved_yet: bool,
    /// Time left less work left, seconds; negative: late.
    slack_seconds: f64,
    /// Ahead of the line (negative: behind), seconds of work.
    lead_seconds: f64,
    at_risk: bool,
}

/// Reads d and the jobs with a deadline not finished yet.
pub(super) async fn lanes_status(
    checkpoints: &BlobCheckpointStore,
    settings: &LaneSettings,
    queues: [(&AzureQueue, Lane); 2],
    encoding: MessageEncoding,
    key_field: Option<&str>,
    max_reads: usize,
) -> Result<LanesStatus> {
    let store: Arc<dyn CheckpointStore> = Arc::new(checkpoints.clone());
    let seed = DEFAULT_SWITCH_COST_SEED.scaled_to(settings.switch_cost);
    let samples = match FleetSwitchCost::new(Arc::clone(&store)).read().await {
        Ok(samples) => samples,
        Err(StorageError::NotFound { .. } | StorageError::MissingContainer { .. }) => {
            Default::default()
        }
        Err(error) => return Err(error.into()),
    };
    let parts = switch_cost(&seed, &samples);
    let d = parts.total();
    let margin = d * 2 + settings.keeper_every;

    let mut blobs: Vec<StoredBlob> = match checkpoints.list().await {
        Ok(blobs) => blobs,
        Err(StorageError::NotFound { .. } | StorageError::MissingContainer { .. }) => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    blobs.retain(|blob| blob.name.starts_with(LANE_RECORD_PREFIX));
    blobs.sort_by_key(|blob| std::cmp::Reverse(blob.last_modified));
    let not_read = blobs.len().saturating_sub(max_reads);
    blobs.truncate(max_reads);
    let records = LaneRecords::new(Arc::clone(&store));
    let read: Vec<Option<(String, LaneRecord, Option<Duration>)>> = stream::iter(blobs)
        .map(|blob| {
            let (records, store) = (records.clone(), Arc::clone(&store));
            async move {
                let job = blob.name.strip_prefix(LANE_RECORD_PREFIX)?.to_owned();
                let record = records.read(&job).await.ok()??;
                // A poisoned job is in the poison queue, not running.
                if record.finished || record.poisoned {
                    return None;
                }
                let progress = progress_from(&store, &job, &record.deadline()).await;
                Some((job, record, progress))
            }
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    // The records, by job key, and which job each live message is.
    let mut started: BTreeMap<String, (LaneRecord, Option<Duration>)> = BTreeMap::new();
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    for (job, record, progress) in read.into_iter().flatten() {
        live.insert(record.message.clone(), job.clone());
        started.insert(job, (record, progress));
    }
    let mut jobs: BTreeMap<String, DeadlineJob> = BTreeMap::new();
    // Jobs whose message waits in a queue, visible: no worker holds them
    // (new ones, released ones, moved ones), in the lane of that queue.
    for (queue, lane) in queues {
        let Ok(visible) = queue.peek(32).await else {
            continue;
        };
        for message in visible {
            let Ok(bytes) = encoding.decode(&message.body) else {
                continue;
            };
            let Ok((Some(envelope), body)) = Envelope::unwrap(&bytes) else {
                continue;
            };
            let id = message.id.to_string();
            // Keyed as a worker keys it: the job its live message is, the
            // body's field (`run`'s SPOT_WORKER_JOB_KEY), the key carried,
            // or the message id.
            let job = live
                .get(&id)
                .cloned()
                .or_else(|| key_field.and_then(|field| spot_worker_command::key_of(body, field)))
                .or_else(|| envelope.key.clone())
                .unwrap_or_else(|| id.clone());
            let known = started.get(&job);
            let waiting = match known {
                Some((record, _)) => waits(record, &id, envelope.generation),
                // A job no worker took yet (an earlier copy once received
                // has a record).
                None => message.dequeue_count == 0,
            };
            if !waiting || jobs.contains_key(&job) {
                continue;
            }
            let progress = match known {
                Some((_, progress)) => *progress,
                None => progress_from(&store, &job, &envelope.deadline).await,
            };
            let row = row(&job, lane, "waiting", envelope.deadline, progress, margin);
            jobs.insert(job, row);
        }
    }
    // The rest are held by a worker: running where their record says.
    for (job, (record, progress)) in started {
        jobs.entry(job.clone()).or_insert_with(|| {
            row(
                &job,
                record.lane,
                "started",
                record.deadline(),
                progress,
                margin,
            )
        });
    }
    let mut jobs: Vec<DeadlineJob> = jobs.into_values().collect();
    jobs.sort_by(|a, b| a.slack_seconds.total_cmp(&b.slack_seconds));
    Ok(LanesStatus {
        switch_cost_seconds: d.as_secs_f64(),
        switch_cost_parts: Parts::of(&parts),
        measured_switches: samples.queue_wait.count,
        recheck_seconds: settings.keeper_every.as_secs_f64(),
        at_risk: jobs.iter().filter(|job| job.at_risk).count(),
        late: jobs.iter().filter(|job| job.slack_seconds < 0.0).count(),
        jobs,
        not_read,
    })
}

impl Parts {
    fn of(parts: &SwitchCostParts) -> Parts {
        Parts {
            queue_wait: parts.queue_wait.as_secs_f64(),
            start_up: parts.start_up.as_secs_f64(),
            restore: parts.restore.as_secs_f64(),
            lost_work: parts.lost_work.as_secs_f64(),
        }
    }
}

/// Whether a visible message (`message`, of `generation`) is where the job
/// of `record` waits: its live message (released, not held by a worker),
/// or a newer copy a move sent that no worker has claimed yet. An older
/// copy is stale, and says nothing of where the job is.
fn waits(record: &LaneRecord, message: &str, generation: u32) -> bool {
    record.message == message || generation > record.generation
}

/// The job's progress as of its last save, from its checkpoint's stamp;
/// `None` before its first save (no checkpoint to read).
async fn progress_from(
    store: &Arc<dyn CheckpointStore>,
    job: &str,
    deadline: &Deadline,
) -> Option<Duration> {
    let stamp = match store.read(job).await {
        Ok(Some(stored)) => stored.stamp,
        _ => return None,
    };
    let fraction = stamp.as_deref().and_then(stamp_progress);
    let ledger = stamp.as_deref().and_then(|stamp| split_stamp(stamp).1);
    Some(progress_of(deadline, fraction, ledger.as_ref()))
}

fn row(
    job: &str,
    lane: Lane,
    state: &'static str,
    deadline: Deadline,
    progress: Option<Duration>,
    margin: Duration,
) -> DeadlineJob {
    // Before a save, none of the work counts: the slack is the least it
    // can be.
    let done = progress.unwrap_or_default();
    let standing = deadline.standing(done, SystemTime::now());
    DeadlineJob {
        job: job.to_owned(),
        lane,
        state,
        due: crate::operate::rfc3339(time::OffsetDateTime::from(deadline.due)),
        work_seconds: deadline.work.as_secs_f64(),
        progress_seconds: done.as_secs_f64(),
        saved_yet: progress.is_some(),
        slack_seconds: standing.slack_secs(),
        lead_seconds: standing.lead_secs(),
        at_risk: standing.slack_secs() < margin.as_secs_f64(),
    }
}

/// A number of seconds as people read it, signed.
fn signed_age(seconds: f64) -> String {
    let text = age(seconds.abs().round() as i64);
    if seconds < 0.0 {
        format!("-{text}")
    } else {
        text
    }
}

/// How much of `job` is done, as `status` prints it: the share as of its
/// last save, or "no save yet" (not 0 %: the fleet cannot know before the
/// job's first save).
fn done(job: &DeadlineJob) -> String {
    if !job.saved_yet {
        return format!("{:>12}", "no save yet");
    }
    let done = if job.work_seconds > 0.0 {
        100.0 * job.progress_seconds / job.work_seconds
    } else {
        100.0
    };
    format!("{done:>5.1} % done")
}

/// The lines `status` prints.
pub(super) fn lines(status: &LanesStatus) -> Vec<String> {
    let p = &status.switch_cost_parts;
    let mut lines = vec![format!(
        "lanes   d {:.0} s per switch (queue wait {:.0} s, start-up {:.0} s, restore {:.0} s, lost work {:.0} s; {} switch(es) measured), recheck {:.0} s",
        status.switch_cost_seconds,
        p.queue_wait,
        p.start_up,
        p.restore,
        p.lost_work,
        status.measured_switches,
        status.recheck_seconds
    )];
    let unread = match status.not_read {
        0 => String::new(),
        n => format!("; {n} older lane record(s) not read, see --max-reads"),
    };
    lines.push(format!(
        "  {} job(s) with a deadline not finished: {} at risk, {} late{unread}",
        status.jobs.len(),
        status.at_risk,
        status.late
    ));
    for job in &status.jobs {
        let flag = if job.slack_seconds < 0.0 {
            "LATE"
        } else if job.at_risk {
            "AT RISK"
        } else {
            "ok"
        };
        lines.push(format!(
            "  {:<24} {:<7} {:<7} {}, slack {:>6}, {} the line by {}, due {}  {flag}",
            job.job,
            job.lane.as_str(),
            job.state,
            done(job),
            signed_age(job.slack_seconds),
            if job.lead_seconds < 0.0 {
                "behind"
            } else {
                "ahead of"
            },
            age(job.lead_seconds.abs().round() as i64),
            job.due
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_visible_message_is_where_its_job_waits_unless_it_is_an_old_copy() {
        let record = |generation: u32, message: &str| LaneRecord {
            generation,
            message: message.into(),
            moved_from: None,
            origin: "m0".into(),
            finished: false,
            poisoned: false,
            held: 1,
            lane: Lane::Spot,
            moving: None,
            start: time::OffsetDateTime::UNIX_EPOCH,
            deadline: time::OffsetDateTime::UNIX_EPOCH,
            work_s: 1.0,
            updated_at: time::OffsetDateTime::UNIX_EPOCH,
        };
        // (record's generation and message, visible message, its
        // generation) → waits there
        let rows = [
            ((0, "m0"), "m0", 0, true),  // released, back in its queue
            ((0, "m0"), "m1", 1, true),  // moved, not claimed yet
            ((1, "m1"), "m0", 0, false), // an old copy the move left
            ((1, "m1"), "m2", 1, false), // a second copy of the same move
        ];
        for ((generation, live), message, of, expected) in rows {
            assert_eq!(
                waits(&record(generation, live), message, of),
                expected,
                "{live} {message}"
            );
        }
    }

    /// A running job that has not saved yet says so, not 0 %; one that has
    /// saved shows its share, 0 % included.
    #[test]
    fn a_job_before_its_first_save_shows_no_save_yet_not_0_percent() {
        let start = SystemTime::now() - Duration::from_secs(60);
        let deadline = Deadline {
            start,
            due: SystemTime::now() + Duration::from_secs(7200),
            work: Duration::from_secs(1000),
        };
        let margin = Duration::from_secs(60);
        // (progress as of the last save) → shown
        let rows = [
            (None, "no save yet"),
            (Some(0.0), "0.0 % done"),
            (Some(375.0), "37.5 % done"),
        ];
        for (progress, shown) in rows {
            let job = row(
                "job-1",
                Lane::Spot,
                "started",
                deadline,
                progress.map(Duration::from_secs_f64),
                margin,
            );
            assert_eq!(job.saved_yet, progress.is_some());
            let status = LanesStatus {
                switch_cost_seconds: 1.0,
                switch_cost_parts: Parts {
                    queue_wait: 0.0,
                    start_up: 0.0,
                    restore: 0.0,
                    lost_work: 0.0,
                },
                measured_switches: 0,
                recheck_seconds: 60.0,
                jobs: vec![job],
                at_risk: 0,
                late: 0,
                not_read: 0,
            };
            let lines = lines(&status);
            let line = lines.last().unwrap();
            assert!(line.contains(shown), "{progress:?}: {line}");
            assert!(line.contains("job-1"), "{line}");
            if progress.is_none() {
                assert!(!line.contains('%'), "{line}");
            }
        }
    }

    #[test]
    fn a_job_is_at_risk_below_two_switches_and_a_recheck_and_late_below_nothing() {
        let start = SystemTime::now() - Duration::from_secs(3600);
        let margin = Duration::from_secs(13 * 60);
        // (due in s from now, work s, progress s) → (slack s, at risk)
        let rows = [
            (7200.0, 3600.0, 1800.0, 5400.0, false),
            (7200.0, 3600.0, 0.0, 3600.0, false),
            (3600.0, 3600.0, 600.0, 600.0, true),
            (600.0, 3600.0, 0.0, -3000.0, true),
        ];
        for (due_in, work, progress, slack, at_risk) in rows {
            let deadline = Deadline {
                start,
                due: SystemTime::now() + Duration::from_secs_f64(due_in),
                work: Duration::from_secs_f64(work),
            };
            let row = row(
                "j",
                Lane::Spot,
                "started",
                deadline,
                Some(Duration::from_secs_f64(progress)),
                margin,
            );
            assert!((row.slack_seconds - slack).abs() < 2.0, "{row:?}");
            assert_eq!(row.at_risk, at_risk, "{row:?}");
        }
        assert_eq!(signed_age(-90.0), "-1m");
        assert_eq!(signed_age(30.0), "30s");
    }
}
