//! What a finished job's time went into: its goodput ledger (see
//! [`spot_worker_decisions::goodput`]) summed up by the delivery that finishes it, logged,
//! told to the [`GoodputObserver`] (the runtime's metrics) and, for jobs
//! worth the request, kept in a completion record that `spot-worker status`
//! reads.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use spot_worker_decisions::goodput::{Ledger, TimeKind, finished};
use spot_worker_decisions::lanes::{Lane, ProgressReadings, job_progress};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use spot_worker_storage::StorageError;
use spot_worker_storage::{Checkpoint, WritePrecondition};

use super::Consumer;
use super::in_flight::Delivery;

/// Hears of every job a consumer finished, with its ledger (the runtime
/// records its goodput metrics this way).
pub type GoodputObserver = Arc<dyn Fn(&Ledger) + Send + Sync>;

/// Hears of every job with a deadline a consumer finished: whether it met
/// its deadline, with its ledger (hours by lane).
pub type DeadlineObserver = Arc<dyn Fn(&DeadlineOutcome, &Ledger) + Send + Sync>;

pub use spot_worker_storage::COMPLETION_RECORD_PREFIX;

/// A job is given a completion record if it had more than one delivery or
/// took at least this long in all: one blob write is then a small part of
/// its cost. Shorter jobs are in the metrics only, so the request model of
/// small jobs (docs/benchmarks.md) stays what it was.
pub const COMPLETION_RECORD_MIN: Duration = Duration::from_secs(60);

/// A finished job's completion record: its ledger, and when and where it
/// finished (the time is this VM's wall clock, for people; it is never
/// subtracted from another VM's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The job's checkpoint key.
    pub job: String,
    /// The message that finished it.
    pub message_id: String,
    /// RFC 3339, UTC.
    pub finished_at: String,
    /// Where its time went (its time on regular capacity included).
    pub goodput: Ledger,
    /// For a job with a deadline: the deadline, and whether it met it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DeadlineOutcome>,
    /// The share of its work the job had done as it finished (0 to 1), by
    /// the one progress rule every reader uses
    /// ([`spot_worker_decisions::lanes::job_progress`]): a record is written
    /// when the job's handler succeeded, so 1. `None` in a record written
    /// before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
}

// `progress` is a finite share (`job_progress` clamps it): never NaN.
impl Eq for CompletionRecord {}

/// How a job with a deadline ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadlineOutcome {
    /// When it started (its enqueue).
    #[serde(with = "time::serde::rfc3339")]
    pub start: OffsetDateTime,
    /// When it was due.
    #[serde(with = "time::serde::rfc3339")]
    pub due: OffsetDateTime,
    /// Its work as the producer estimated it, seconds.
    pub work_s: f64,
    /// Whether it finished by its deadline (by the finishing VM's clock).
    pub met: bool,
    /// The lane it finished in.
    pub lane: Lane,
    /// How often it moved between lanes.
    pub moves: u32,
}

// `work_s` comes from a `Duration`: never NaN.
impl Eq for DeadlineOutcome {}

impl CompletionRecord {
    /// The checkpoint key of `job`'s record.
    pub fn key(job: &str) -> String {
        format!("{COMPLETION_RECORD_PREFIX}{job}")
    }

    /// Reads a record from the checkpoint it is stored as.
    pub fn from_checkpoint(checkpoint: &Checkpoint, what: &str) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::InvalidData {
            what: what.to_owned(),
            reason,
        };
        let Checkpoint::Completed { result } = checkpoint else {
            return Err(invalid("in progress, not a completion record".to_owned()));
        };
        serde_json::from_value(result.clone()).map_err(|e| invalid(e.to_string()))
    }
}

/// Whether a finished job's ledger is worth a completion record.
pub(crate) fn worth_a_record(ledger: &Ledger) -> bool {
    ledger.deliveries > 1
        || ledger.unaccounted > 0
        || ledger.total_ms() >= u64::try_from(COMPLETION_RECORD_MIN.as_millis()).unwrap_or(0)
}

impl Consumer {
    /// Sums up the ledger of the job `delivery` finished (its message is
    /// deleted), before its attempt record is: logs it, tells the observer,
    /// and writes the completion record if it is worth one. Nothing here
    /// can fail the job; a read or write that fails is logged.
    pub(super) async fn job_finished(&self, delivery: &Delivery) {
        // Earlier deliveries' tails are in the attempt record; a first
        // delivery has none, and costs no read.
        let mut looks = 0;
        let tails = if delivery.message.dequeue_count == 1 {
            Ledger::default()
        } else {
            let read = tokio::time::timeout(
                self.config.settle_timeout,
                self.attempts.read(&delivery.message.id),
            )
            .await;
            match read {
                Ok(Ok(read)) => {
                    looks = read.attempts.looks;
                    read.attempts.goodput
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "could not read the attempt record; the job's redone work is reported without its earlier deliveries' tails");
                    Ledger::default()
                }
                Err(_) => {
                    tracing::warn!(
                        "reading the attempt record timed out; the job's redone work is reported without its earlier deliveries' tails"
                    );
                    Ledger::default()
                }
            }
        };
        // A job moved between lanes carries its earlier messages' tails and
        // deliveries; the lane keeper's looks were no deliveries.
        let carried = delivery.lane.as_ref().map(|lane| lane.envelope.carried);
        let tails = match &carried {
            Some(carried) => tails.plus(&carried.tails),
            None => tails,
        };
        let deliveries = delivery
            .message
            .dequeue_count
            .saturating_sub(looks)
            .saturating_add(carried.map_or(0, |carried| carried.deliveries));
        let ledger = finished(
            &delivery.clock.carried(),
            &tails,
            &delivery.clock.now(),
            deliveries,
        );
        let seconds = |kind| ledger.seconds(kind);
        tracing::info!(
            useful_s = seconds(TimeKind::Useful),
            redone_s = seconds(TimeKind::Redone),
            checkpointing_s = seconds(TimeKind::Checkpointing),
            waiting_s = seconds(TimeKind::Waiting),
            goodput = ledger.goodput().unwrap_or(1.0),
            deliveries = ledger.deliveries,
            unaccounted = ledger.unaccounted,
            saves = ledger.saves,
            job = delivery.leftover.key(),
            "job finished: where its time went"
        );
        // The job's length, for the interval of jobs that say nothing of
        // their end: the work it needed, its useful time.
        self.cadence
            .note_job_length(Duration::from_millis(ledger.useful_ms));
        if let Some(observer) = &self.goodput_observer {
            observer(&ledger);
        }
        let deadline = self.deadline_outcome(delivery);
        if let Some(outcome) = &deadline {
            tracing::info!(
                met = outcome.met,
                lane = outcome.lane.as_str(),
                moves = outcome.moves,
                spot_s = ledger.spot_ms() as f64 / 1000.0,
                regular_s = ledger.regular_ms as f64 / 1000.0,
                "job with a deadline finished"
            );
            if let Some(observer) = &self.deadline_observer {
                observer(outcome, &ledger);
            }
        }
        // A job with a deadline always gets one: whether it met it.
        if deadline.is_some() || worth_a_record(&ledger) {
            self.write_completion_record(delivery, ledger, deadline)
                .await;
        }
    }

    /// How the job `delivery` finished met its deadline, if it has one.
    fn deadline_outcome(&self, delivery: &Delivery) -> Option<DeadlineOutcome> {
        let envelope = &delivery.lane.as_ref()?.envelope;
        let now = OffsetDateTime::now_utc();
        let due = OffsetDateTime::from(envelope.deadline.due);
        Some(DeadlineOutcome {
            start: OffsetDateTime::from(envelope.deadline.start),
            due,
            work_s: envelope.deadline.work.as_secs_f64(),
            met: now <= due,
            lane: self.lanes.as_ref().map_or(Lane::Spot, |lanes| lanes.lane()),
            moves: envelope.generation,
        })
    }

    async fn write_completion_record(
        &self,
        delivery: &Delivery,
        goodput: Ledger,
        deadline: Option<DeadlineOutcome>,
    ) {
        let Some(store) = &self.checkpoints else {
            return;
        };
        let job = delivery.leftover.key().to_owned();
        let record = CompletionRecord {
            job: job.clone(),
            message_id: delivery.message.id.to_string(),
            finished_at: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            goodput,
            deadline,
            progress: final_progress(),
        };
        let result = match serde_json::to_value(&record) {
            Ok(result) => result,
            Err(error) => {
                tracing::warn!(%error, "the completion record does not serialize; not written");
                return;
            }
        };
        let key = CompletionRecord::key(&job);
        let checkpoint = Checkpoint::Completed { result };
        let write = store.write(&key, &checkpoint, WritePrecondition::Create, None);
        match tokio::time::timeout(self.config.settle_timeout, write).await {
            Ok(Ok(_)) => tracing::debug!(key, "completion record written"),
            // A duplicate message of the same job finished it before: its
            // record stands.
            Ok(Err(StorageError::Conflict { .. })) => {
                tracing::debug!(key, "a completion record for this job exists already");
            }
            Ok(Err(error)) => {
                tracing::warn!(key, %error, "could not write the completion record");
            }
            Err(_) => tracing::warn!(key, "writing the completion record timed out"),
        }
    }
}

/// The progress a completion record carries: the job finished, so all of
/// its work, whatever it last reported.
fn final_progress() -> Option<f64> {
    let readings = ProgressReadings {
        finished: true,
        ..ProgressReadings::default()
    };
    job_progress(&readings, Duration::ZERO).share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_or_interrupted_jobs_get_a_record() {
        let ledger = |useful_ms, deliveries, unaccounted| Ledger {
            useful_ms,
            deliveries,
            unaccounted,
            ..Ledger::default()
        };
        // (ledger, recorded)
        let rows = [
            (ledger(10, 1, 0), false),
            (ledger(59_999, 1, 0), false),
            (ledger(60_000, 1, 0), true),
            (ledger(10, 2, 0), true),
            (ledger(10, 1, 1), true),
        ];
        for (ledger, recorded) in rows {
            assert_eq!(worth_a_record(&ledger), recorded, "{ledger:?}");
        }
    }

    #[test]
    fn records_round_trip_through_their_checkpoint() {
        let record = CompletionRecord {
            job: "j1".to_owned(),
            message_id: "m1".to_owned(),
            finished_at: "2026-11-25T00:00:00Z".to_owned(),
            goodput: Ledger {
                useful_ms: 5,
                deliveries: 2,
                ..Ledger::default()
            },
            deadline: None,
            progress: final_progress(),
        };
        assert_eq!(record.progress, Some(1.0));
        let checkpoint = Checkpoint::Completed {
            result: serde_json::to_value(&record).unwrap(),
        };
        assert_eq!(
            CompletionRecord::from_checkpoint(&checkpoint, "r").unwrap(),
            record
        );
        let progress = Checkpoint::InProgress {
            progress: serde_json::json!({}),
        };
        assert!(CompletionRecord::from_checkpoint(&progress, "r").is_err());
        assert_eq!(CompletionRecord::key("j1"), ".spot-worker/goodput/j1");
    }
}
