//! The fleet's goodput for `spot-worker status`: the completion records
//! the workers left (`.spot-worker/goodput/<job>`, see
//! `spot_worker_consumer::CompletionRecord`) summed up by kind of time, and,
//! with a price per VM hour, what that time cost in money; and the lanes'
//! part of them: hours and money by lane, deadlines met and missed.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures_util::{StreamExt as _, stream};
use serde::Serialize;
use spot_worker_azure::{BlobCheckpointStore, StoredBlob};
use spot_worker_consumer::CompletionRecord;
use spot_worker_decisions::goodput::{Ledger, TimeKind};
use spot_worker_storage::{COMPLETION_RECORD_PREFIX, CheckpointStore as _};

/// Completion records read at once.
const PARALLEL_READS: usize = 16;

/// Storage list prices per request, in US dollars, as docs/benchmarks.md
/// ("Cost per million jobs") gives them: a blob write, and any queue
/// operation or blob read.
const BLOB_WRITE_USD: f64 = 0.05 / 10_000.0;
const OTHER_REQUEST_USD: f64 = 0.004 / 10_000.0;

/// The fleet's finished jobs, as their completion records say.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct FleetGoodput {
    /// Completion records read.
    pub jobs: usize,
    /// Completion records beyond --max-reads, not read.
    pub not_read: usize,
    /// Records that could not be read or parsed.
    pub unreadable: usize,
    /// Seconds by kind, summed over the jobs read.
    pub useful_seconds: f64,
    pub redone_seconds: f64,
    pub checkpointing_seconds: f64,
    pub waiting_seconds: f64,
    /// Useful over all; `None` without any time.
    pub goodput: Option<f64>,
    /// Deliveries of these jobs that left no accounting.
    pub unaccounted_deliveries: u64,
    /// The same time in US dollars, with `SPOT_WORKER_PRICE_PER_HOUR`.
    pub cost: Option<Cost>,
}

/// Money by kind of time, in US dollars: the VM's share for that time,
/// and the storage requests that time made.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Cost {
    pub useful: f64,
    pub redone: f64,
    pub checkpointing: f64,
    pub waiting: f64,
    pub total: f64,
}

/// A job's cost in US dollars, split like its time.
///
/// The VM part: each second of the job costs one slot's share of the VM,
/// `price_per_hour / 3600 / slots` (a VM runs `slots` jobs at once). The
/// storage part, by the request model of docs/benchmarks.md: each
/// checkpoint save is a blob write (checkpointing); each delivery a share
/// of a receive, a settle call and one read of the checkpoint (waiting);
/// each `visibility_timeout / 3` of held time one lease renewal, spread
/// over the kinds like the time itself.
pub fn job_cost(
    ledger: &Ledger,
    price_per_hour: f64,
    slots: usize,
    visibility_timeout: Duration,
) -> Cost {
    let slot_second = price_per_hour / 3600.0 / slots.max(1) as f64;
    let renewal_period = (visibility_timeout.as_secs_f64() / 3.0).max(1.0);
    let renewal_per_second = OTHER_REQUEST_USD / renewal_period;
    let deliveries = f64::from(ledger.deliveries.saturating_add(ledger.unaccounted));
    let per_kind = |kind: TimeKind| ledger.seconds(kind) * (slot_second + renewal_per_second);
    let useful = per_kind(TimeKind::Useful);
    let redone = per_kind(TimeKind::Redone);
    let checkpointing =
        per_kind(TimeKind::Checkpointing) + f64::from(ledger.saves) * BLOB_WRITE_USD;
    let waiting = per_kind(TimeKind::Waiting) + deliveries * 3.0 * OTHER_REQUEST_USD;
    Cost {
        useful,
        redone,
        checkpointing,
        waiting,
        total: useful + redone + checkpointing + waiting,
    }
}

/// The price setting's value: a finite, non-negative number.
pub fn parse_price(text: &str) -> Result<f64> {
    let price: f64 = text.trim().parse().with_context(|| {
        format!("SPOT_WORKER_PRICE_PER_HOUR={text:?} is not a number (US dollars per VM hour)")
    })?;
    if !price.is_finite() || price < 0.0 {
        bail!("SPOT_WORKER_PRICE_PER_HOUR={text:?} must be a non-negative number");
    }
    Ok(price)
}

/// Sums `records` (`None` for one that could not be read) into the
/// fleet's figures; `cost` prices each job with [`job_cost`].
pub fn sum_up(
    records: &[Option<Ledger>],
    not_read: usize,
    cost: Option<&dyn Fn(&Ledger) -> Cost>,
) -> FleetGoodput {
    let mut total = Ledger::default();
    let mut money = cost.map(|_| Cost::default());
    let mut fleet = FleetGoodput {
        not_read,
        ..FleetGoodput::default()
    };
    for record in records {
        let Some(ledger) = record else {
            fleet.unreadable += 1;
            continue;
        };
        fleet.jobs += 1;
        total = total.plus(ledger);
        if let (Some(sum), Some(cost)) = (money.as_mut(), cost) {
            let job = cost(ledger);
            sum.useful += job.useful;
            sum.redone += job.redone;
            sum.checkpointing += job.checkpointing;
            sum.waiting += job.waiting;
            sum.total += job.total;
        }
    }
    fleet.useful_seconds = total.seconds(TimeKind::Useful);
    fleet.redone_seconds = total.seconds(TimeKind::Redone);
    fleet.checkpointing_seconds = total.seconds(TimeKind::Checkpointing);
    fleet.waiting_seconds = total.seconds(TimeKind::Waiting);
    fleet.goodput = total.goodput();
    fleet.unaccounted_deliveries = u64::from(total.unaccounted);
    fleet.cost = money;
    fleet
}

/// The finished jobs' hours by lane, their money by lane, and how those
/// with a deadline met it (docs/deploying.md, "The two lanes").
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct LaneAccounting {
    /// Hours on Spot capacity, all finished jobs read.
    pub spot_hours: f64,
    /// Hours on regular capacity.
    pub regular_hours: f64,
    /// Spot hours at `SPOT_WORKER_PRICE_PER_HOUR` (US dollars, the VMs'
    /// share only), if set.
    pub spot_cost: Option<f64>,
    /// Regular hours at `SPOT_WORKER_REGULAR_PRICE_PER_HOUR`, if set.
    pub regular_cost: Option<f64>,
    /// Finished jobs with a deadline that met it.
    pub deadlines_met: usize,
    /// Finished jobs with a deadline that missed it.
    pub deadlines_missed: usize,
    /// Moves between lanes of the finished jobs with a deadline.
    pub moves: u64,
}

/// Sums the lanes' part of `records`: each job's time split by lane, at
/// each lane's price per VM hour shared by `slots`.
pub fn lane_accounting(
    records: &[Option<CompletionRecord>],
    spot_price: Option<f64>,
    regular_price: Option<f64>,
    slots: usize,
) -> LaneAccounting {
    let mut sum = LaneAccounting::default();
    for record in records.iter().flatten() {
        let ledger = &record.goodput;
        sum.spot_hours += ledger.spot_ms() as f64 / 3_600_000.0;
        sum.regular_hours += ledger.regular_ms as f64 / 3_600_000.0;
        if let Some(deadline) = &record.deadline {
            if deadline.met {
                sum.deadlines_met += 1;
            } else {
                sum.deadlines_missed += 1;
            }
            sum.moves += u64::from(deadline.moves);
        }
    }
    let slots = slots.max(1) as f64;
    sum.spot_cost = spot_price.map(|price| sum.spot_hours * price / slots);
    sum.regular_cost = regular_price.map(|price| sum.regular_hours * price / slots);
    sum
}

/// The price per hour a job's time is charged at: the Spot price for its
/// Spot time and the regular price for its regular time, weighed by each;
/// the Spot price alone for a job that never ran on regular capacity (or
/// without a regular price).
pub fn blended_price(ledger: &Ledger, spot_price: f64, regular_price: Option<f64>) -> f64 {
    let total = ledger.total_ms();
    match regular_price {
        Some(regular) if total > 0 && ledger.regular_ms > 0 => {
            let regular_share = ledger.regular_ms.min(total) as f64 / total as f64;
            spot_price * (1.0 - regular_share) + regular * regular_share
        }
        _ => spot_price,
    }
}

/// The completion records in `store`, the `max_reads` most recent of them
/// read (one request each), and how many were left unread.
pub async fn read_records(
    store: &BlobCheckpointStore,
    max_reads: usize,
) -> Result<(Vec<Option<CompletionRecord>>, usize)> {
    let mut blobs: Vec<StoredBlob> = store
        .list()
        .await
        .context("listing the checkpoint container")?
        .into_iter()
        .filter(|blob| blob.name.starts_with(COMPLETION_RECORD_PREFIX))
        .collect();
    blobs.sort_by_key(|blob| std::cmp::Reverse(blob.last_modified));
    let not_read = blobs.len().saturating_sub(max_reads);
    blobs.truncate(max_reads);
    let records = stream::iter(blobs)
        .map(|blob| async move {
            match store.read(&blob.name).await {
                Ok(Some(stored)) => {
                    CompletionRecord::from_checkpoint(&stored.checkpoint, &blob.name).ok()
                }
                _ => None,
            }
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    Ok((records, not_read))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(useful_s: u64, redone_s: u64, saves: u32, deliveries: u32) -> Ledger {
        Ledger {
            useful_ms: useful_s * 1000,
            redone_ms: redone_s * 1000,
            saves,
            deliveries,
            ..Ledger::default()
        }
    }

    #[test]
    fn a_job_costs_its_slots_share_and_its_requests() {
        let hour = Duration::from_secs(3600);
        // One hour useful on a $0.36/h VM with 4 slots: $0.09 of VM, plus
        // 3 renewals of a 1 h lease... per hour: 3 requests.
        let cost = job_cost(&ledger(3600, 0, 0, 1), 0.36, 4, hour);
        assert!(
            (cost.useful - (0.09 + 3.0 * OTHER_REQUEST_USD)).abs() < 1e-12,
            "{cost:?}"
        );
        assert!((cost.waiting - 3.0 * OTHER_REQUEST_USD).abs() < 1e-12);
        assert_eq!((cost.redone, cost.checkpointing), (0.0, 0.0));
        // Saves are blob writes; a free VM still pays for storage.
        let cost = job_cost(&ledger(0, 0, 10, 1), 0.0, 1, hour);
        assert!((cost.checkpointing - 10.0 * BLOB_WRITE_USD).abs() < 1e-15);
        // Redone time costs like useful time.
        let cost = job_cost(&ledger(60, 60, 0, 2), 1.0, 1, hour);
        assert!((cost.useful - cost.redone).abs() < 1e-15);
        assert!((cost.total - (cost.useful + cost.redone + cost.waiting)).abs() < 1e-15);
    }

    #[test]
    fn prices_must_be_plain_non_negative_numbers() {
        // (text, accepted)
        for (text, accepted) in [
            ("0.0125", true),
            (" 2 ", true),
            ("0", true),
            ("-1", false),
            ("NaN", false),
            ("inf", false),
            ("$0.01", false),
            ("", false),
        ] {
            assert_eq!(parse_price(text).is_ok(), accepted, "{text:?}");
        }
    }

    #[test]
    fn hours_and_money_by_lane_and_the_deadlines_met() {
        use spot_worker_consumer::DeadlineOutcome;
        use spot_worker_decisions::lanes::Lane;
        let hours = |h: u64| h * 3_600_000;
        let record = |spot_h: u64, regular_h: u64, met: Option<bool>| {
            Some(CompletionRecord {
                job: "j".into(),
                message_id: "m".into(),
                finished_at: String::new(),
                goodput: Ledger {
                    useful_ms: hours(spot_h + regular_h),
                    regular_ms: hours(regular_h),
                    deliveries: 1,
                    ..Ledger::default()
                },
                deadline: met.map(|met| DeadlineOutcome {
                    start: time::OffsetDateTime::UNIX_EPOCH,
                    due: time::OffsetDateTime::UNIX_EPOCH,
                    work_s: 1.0,
                    met,
                    lane: Lane::Regular,
                    moves: 2,
                }),
                progress: None,
            })
        };
        let records = [
            record(3, 1, Some(true)),
            record(2, 0, None),
            None,
            record(0, 2, Some(false)),
        ];
        let sum = lane_accounting(&records, Some(0.02), Some(0.06), 2);
        assert_eq!((sum.spot_hours, sum.regular_hours), (5.0, 3.0));
        assert!((sum.spot_cost.unwrap() - 0.05).abs() < 1e-12, "{sum:?}");
        assert!((sum.regular_cost.unwrap() - 0.09).abs() < 1e-12, "{sum:?}");
        assert_eq!(
            (sum.deadlines_met, sum.deadlines_missed, sum.moves),
            (1, 1, 4)
        );
        assert_eq!(lane_accounting(&records, None, None, 1).spot_cost, None);
        // A job a quarter on regular capacity is charged a quarter at its price.
        let ledger = records[0].as_ref().unwrap().goodput;
        assert!((blended_price(&ledger, 0.02, Some(0.06)) - 0.03).abs() < 1e-12);
        assert_eq!(blended_price(&ledger, 0.02, None), 0.02);
        let spot_only = records[1].as_ref().unwrap().goodput;
        assert_eq!(blended_price(&spot_only, 0.02, Some(0.06)), 0.02);
    }

    #[test]
    fn the_fleet_sums_its_jobs_and_counts_what_it_could_not_read() {
        let records = [Some(ledger(30, 10, 3, 2)), None, Some(ledger(60, 0, 1, 1))];
        let fleet = sum_up(&records, 5, None);
        assert_eq!((fleet.jobs, fleet.unreadable, fleet.not_read), (2, 1, 5));
        assert_eq!((fleet.useful_seconds, fleet.redone_seconds), (90.0, 10.0));
        assert_eq!(fleet.goodput, Some(0.9));
        assert_eq!(fleet.cost, None);
        let price = |ledger: &Ledger| job_cost(ledger, 3.6, 1, Duration::from_secs(30));
        let priced = sum_up(&records, 0, Some(&price));
        let cost = priced.cost.unwrap();
        // $0.001 per second: 90 s useful, 10 s redone, plus requests.
        assert!(cost.useful > 0.09 && cost.useful < 0.0901, "{cost:?}");
        assert!(cost.redone > 0.01 && cost.redone < 0.0101, "{cost:?}");
        assert_eq!(sum_up(&[], 0, None).goodput, None);
    }
}
