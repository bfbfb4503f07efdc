//! The fleet's bill for `spot-worker status`: each worker's lifetime
//! record (`.spot-worker/fleet/workers/<worker>`, see
//! `spot_worker_storage::LifetimeLog`) summed by lane into the VM-hours
//! (pod-hours) paid, split into busy, idle, starting and draining, and,
//! with the price settings, the money (docs/deploying.md, "How to read the
//! bill").

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use futures_util::{StreamExt as _, stream};
use serde::Serialize;
use spot_worker_azure::{BlobCheckpointStore, StoredBlob};
use spot_worker_decisions::bill::{
    FleetBill, LaneBill, LifetimeRecord, VmSizeBill, WRITE_EVERY, bill_by_vm_size, fleet_bill,
};
use spot_worker_storage::LifetimeLog;

/// Records read at once.
const PARALLEL_READS: usize = 16;

/// One lane's bill as status shows it.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct LaneBillStatus {
    /// Workers with a record, and of them: exited, running, lost (silent
    /// for two write periods without writing their exit).
    pub workers: usize,
    pub exited: usize,
    pub running: usize,
    pub lost: usize,
    /// VM-hours (pod-hours) paid, up to each worker's last record.
    pub paid_hours: f64,
    pub busy_hours: f64,
    pub idle_hours: f64,
    pub starting_hours: f64,
    pub draining_hours: f64,
    /// At most this many hours more were paid unseen by the lost workers.
    pub unseen_at_most_hours: f64,
    /// `paid_hours` at the lane's price per VM hour (US dollars), if set.
    pub cost: Option<f64>,
    /// The idle part of it.
    pub idle_cost: Option<f64>,
}

/// One VM size's part of the bill, shown when the fleet ran more than one.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct VmSizeStatus {
    /// `compute.vmSize`, or `unknown` (off Azure, an older worker).
    pub vm_size: String,
    /// Its price classes (`Spot`, `Regular`, `Low`, `unknown`).
    pub priorities: Vec<String>,
    pub spot: LaneBillStatus,
    pub regular: LaneBillStatus,
}

/// The fleet's bill by lane.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct BillStatus {
    pub spot: LaneBillStatus,
    pub regular: LaneBillStatus,
    /// The same by VM size (each lane's price applied to every size: the
    /// price settings are per lane), when more than one size ran; empty
    /// otherwise.
    pub by_vm_size: Vec<VmSizeStatus>,
    /// Records beyond --max-reads, not read (the oldest).
    pub not_read: usize,
    /// Records that could not be read or parsed.
    pub unreadable: usize,
}

fn lane_status(lane: &LaneBill, price: Option<f64>) -> LaneBillStatus {
    let hours = |seconds: f64| seconds / 3600.0;
    let paid_hours = hours(lane.time.paid_s());
    let idle_hours = hours(lane.time.idle_s);
    LaneBillStatus {
        workers: lane.workers,
        exited: lane.exited,
        running: lane.running,
        lost: lane.lost,
        paid_hours,
        busy_hours: hours(lane.time.busy_s),
        idle_hours,
        starting_hours: hours(lane.time.starting_s),
        draining_hours: hours(lane.time.draining_s),
        unseen_at_most_hours: hours(lane.unseen_at_most_s),
        cost: price.map(|price| paid_hours * price),
        idle_cost: price.map(|price| idle_hours * price),
    }
}

/// The bill of `bill` at each lane's price per VM hour.
pub fn bill_status(
    bill: &FleetBill,
    spot_price: Option<f64>,
    regular_price: Option<f64>,
    not_read: usize,
    unreadable: usize,
) -> BillStatus {
    BillStatus {
        spot: lane_status(&bill.spot, spot_price),
        regular: lane_status(&bill.regular, regular_price),
        by_vm_size: Vec::new(),
        not_read,
        unreadable,
    }
}

/// The bill of each VM size, when `sizes` holds more than one; empty
/// otherwise (the lanes' lines say it all).
pub fn vm_size_status(
    sizes: &[VmSizeBill],
    spot_price: Option<f64>,
    regular_price: Option<f64>,
) -> Vec<VmSizeStatus> {
    if sizes.len() < 2 {
        return Vec::new();
    }
    sizes
        .iter()
        .map(|size| VmSizeStatus {
            vm_size: size.vm_size.clone(),
            priorities: size.priorities.clone(),
            spot: lane_status(&size.bill.spot, spot_price),
            regular: lane_status(&size.bill.regular, regular_price),
        })
        .collect()
}

/// Reads the `max_reads` most recently written lifetime records in
/// `store` and sums them into the bill as of now.
pub async fn read_bill(
    store: &BlobCheckpointStore,
    max_reads: usize,
    spot_price: Option<f64>,
    regular_price: Option<f64>,
) -> Result<BillStatus> {
    let mut blobs: Vec<StoredBlob> = store
        .list()
        .await
        .context("listing the checkpoint container")?
        .into_iter()
        .filter(|blob| blob.name.starts_with(LifetimeLog::PREFIX))
        .collect();
    blobs.sort_by_key(|blob| std::cmp::Reverse(blob.last_modified));
    let not_read = blobs.len().saturating_sub(max_reads);
    blobs.truncate(max_reads);
    let read: Vec<Option<LifetimeRecord>> = stream::iter(blobs)
        .map(|blob| async move {
            LifetimeLog::read_key(store, &blob.name)
                .await
                .ok()
                .flatten()
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    let unreadable = read.iter().filter(|record| record.is_none()).count();
    let records: Vec<LifetimeRecord> = read.into_iter().flatten().collect();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    let period_ms = u64::try_from(WRITE_EVERY.as_millis()).unwrap_or(u64::MAX);
    let bill = fleet_bill(&records, now_ms, period_ms);
    let sizes = bill_by_vm_size(&records, now_ms, period_ms);
    Ok(BillStatus {
        by_vm_size: vm_size_status(&sizes, spot_price, regular_price),
        ..bill_status(&bill, spot_price, regular_price, not_read, unreadable)
    })
}

/// The bill's lines: one per lane with workers, and what was not read.
pub fn lines(bill: &BillStatus) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, lane) in [("Spot", &bill.spot), ("regular", &bill.regular)] {
        if lane.workers == 0 {
            continue;
        }
        let money = |cost: Option<f64>| cost.map_or_else(String::new, |c| format!(" (${c:.4})"));
        let share = |hours: f64| {
            if lane.paid_hours > 0.0 {
                hours * 100.0 / lane.paid_hours
            } else {
                0.0
            }
        };
        lines.push(format!(
            "bill    {name}: {:.2} VM-h paid{} by {} worker(s) ({} running, {} exited, {} lost)",
            lane.paid_hours,
            money(lane.cost),
            lane.workers,
            lane.running,
            lane.exited,
            lane.lost,
        ));
        lines.push(format!(
            "  busy {:.2} h {:.1} %, idle {:.2} h {:.1} %{}, starting {:.2} h {:.1} %, draining {:.2} h {:.1} %",
            lane.busy_hours,
            share(lane.busy_hours),
            lane.idle_hours,
            share(lane.idle_hours),
            money(lane.idle_cost),
            lane.starting_hours,
            share(lane.starting_hours),
            lane.draining_hours,
            share(lane.draining_hours),
        ));
        if lane.lost > 0 {
            lines.push(format!(
                "  {} worker(s) gone without writing their exit: at most {:.2} VM-h more paid unseen",
                lane.lost, lane.unseen_at_most_hours
            ));
        }
    }
    if lines.is_empty() {
        lines.push("bill    no worker lifetime record yet".to_owned());
    }
    for size in &bill.by_vm_size {
        let paid = size.spot.paid_hours + size.regular.paid_hours;
        let idle = size.spot.idle_hours + size.regular.idle_hours;
        let cost = match (size.spot.cost, size.regular.cost) {
            (None, None) => String::new(),
            (spot, regular) => format!(" (${:.4})", spot.unwrap_or(0.0) + regular.unwrap_or(0.0)),
        };
        let idle_share = if paid > 0.0 { idle * 100.0 / paid } else { 0.0 };
        lines.push(format!(
            "  {} ({}): {paid:.2} VM-h paid{cost} by {} worker(s), idle {idle:.2} h {idle_share:.1} %",
            size.vm_size,
            size.priorities.join(", "),
            size.spot.workers + size.regular.workers,
        ));
    }
    match (bill.not_read, bill.unreadable) {
        (0, 0) => {}
        (n, bad) => lines.push(format!(
            "  {n} older worker record(s) not read (see --max-reads), {bad} unreadable: the bill above leaves them out"
        )),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_decisions::bill::PaidTime;

    #[test]
    fn hours_shares_and_money_by_lane() {
        let bill = FleetBill {
            spot: LaneBill {
                workers: 3,
                exited: 1,
                running: 1,
                lost: 1,
                time: PaidTime {
                    starting_s: 360.0,
                    busy_s: 5400.0,
                    idle_s: 1440.0,
                    draining_s: 0.0,
                },
                unseen_at_most_s: 300.0,
            },
            regular: LaneBill::default(),
        };
        let status = bill_status(&bill, Some(0.5), Some(2.0), 0, 0);
        assert_eq!(status.spot.paid_hours, 2.0);
        assert_eq!(status.spot.cost, Some(1.0));
        assert_eq!(status.spot.idle_cost, Some(0.2));
        assert_eq!(status.regular.cost, Some(0.0));
        let text = lines(&status).join("\n");
        for expected in [
            "bill    Spot: 2.00 VM-h paid ($1.0000) by 3 worker(s) (1 running, 1 exited, 1 lost)",
            "busy 1.50 h 75.0 %, idle 0.40 h 20.0 % ($0.2000), starting 0.10 h 5.0 %",
            "1 worker(s) gone without writing their exit: at most 0.08 VM-h more paid unseen",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
        assert!(!text.contains("regular:"), "{text}");
        assert!(!text.contains("VM-h paid by"), "one size: no split: {text}");
        let empty = lines(&bill_status(&FleetBill::default(), None, None, 2, 1)).join("\n");
        assert!(empty.contains("no worker lifetime record yet"), "{empty}");
        assert!(
            empty.contains("2 older worker record(s) not read"),
            "{empty}"
        );
    }

    #[test]
    fn the_bill_splits_by_vm_size_only_when_there_are_several() {
        let hour = |busy_s: f64, idle_s: f64| LaneBill {
            workers: 1,
            exited: 1,
            time: PaidTime {
                busy_s,
                idle_s,
                ..PaidTime::default()
            },
            ..LaneBill::default()
        };
        let size = |name: &str, priority: &str, spot: LaneBill, regular: LaneBill| VmSizeBill {
            vm_size: name.into(),
            priorities: vec![priority.into()],
            bill: FleetBill { spot, regular },
        };
        let one = [size(
            "Standard_D4s_v5",
            "Spot",
            hour(3600.0, 0.0),
            LaneBill::default(),
        )];
        assert!(vm_size_status(&one, Some(1.0), None).is_empty());
        let two = [
            size(
                "Standard_D4s_v5",
                "Spot",
                hour(2700.0, 900.0),
                LaneBill::default(),
            ),
            size("unknown", "unknown", LaneBill::default(), hour(7200.0, 0.0)),
        ];
        let status = BillStatus {
            by_vm_size: vm_size_status(&two, Some(0.5), Some(2.0)),
            ..BillStatus::default()
        };
        let text = lines(&status).join("\n");
        for expected in [
            "  Standard_D4s_v5 (Spot): 1.00 VM-h paid ($0.5000) by 1 worker(s), idle 0.25 h 25.0 %",
            "  unknown (unknown): 2.00 VM-h paid ($4.0000) by 1 worker(s), idle 0.00 h 0.0 %",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }
}
