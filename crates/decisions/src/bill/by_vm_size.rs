//! The bill split by VM size: a fleet of more than one size (a scale set
//! whose size was changed, a regular lane on other VMs, several pools)
//! pays a different price per hour for each, so `spot-worker status`
//! shows each size's hours apart when there is more than one.

use serde::{Deserialize, Serialize};

use super::{FleetBill, LifetimeRecord, fleet_bill};

/// The size of the VMs whose workers did not know theirs (off Azure, an
/// older worker, instance metadata not answering).
pub const UNKNOWN_VM_SIZE: &str = "unknown";

/// One VM size's part of the bill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmSizeBill {
    /// `compute.vmSize`, or [`UNKNOWN_VM_SIZE`].
    pub vm_size: String,
    /// The price classes seen on it (`Spot`, `Regular`, `Low`,
    /// [`UNKNOWN_VM_SIZE`]), sorted, each once.
    pub priorities: Vec<String>,
    /// Its bill, by lane.
    pub bill: FleetBill,
}

/// The bill of `records` at `now_ms` (workers writing every `period_ms`)
/// for each VM size, sorted by size; empty when there are no records.
pub fn bill_by_vm_size(records: &[LifetimeRecord], now_ms: u64, period_ms: u64) -> Vec<VmSizeBill> {
    let mut sizes: Vec<&str> = records
        .iter()
        .map(|r| r.vm_size.as_deref().unwrap_or(UNKNOWN_VM_SIZE))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|size| {
            let of_size: Vec<LifetimeRecord> = records
                .iter()
                .filter(|r| r.vm_size.as_deref().unwrap_or(UNKNOWN_VM_SIZE) == size)
                .cloned()
                .collect();
            let mut priorities: Vec<String> = of_size
                .iter()
                .map(|r| {
                    r.priority
                        .clone()
                        .unwrap_or_else(|| UNKNOWN_VM_SIZE.to_owned())
                })
                .collect();
            priorities.sort_unstable();
            priorities.dedup();
            VmSizeBill {
                vm_size: size.to_owned(),
                priorities,
                bill: fleet_bill(&of_size, now_ms, period_ms),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bill::{PaidTime, Phase};
    use crate::lanes::Lane;

    fn record(
        size: Option<&str>,
        priority: Option<&str>,
        lane: Lane,
        busy_s: f64,
    ) -> LifetimeRecord {
        LifetimeRecord {
            worker: format!("w-{size:?}-{busy_s}"),
            queue: "jobs".into(),
            lane,
            started_ms: 0,
            ready_ms: Some(0),
            draining_ms: None,
            exited_ms: Some(1_000_000),
            seen_ms: 1_000_000,
            phase: Phase::Exited,
            time: PaidTime {
                busy_s,
                ..PaidTime::default()
            },
            vm_size: size.map(str::to_owned),
            priority: priority.map(str::to_owned),
        }
    }

    #[test]
    fn each_size_is_billed_apart_with_its_price_classes() {
        let d4 = Some("Standard_D4s_v5");
        let f2 = Some("Standard_F2s_v2");
        // (records, expected: size, priorities, spot busy, regular busy)
        type Row = (
            Vec<LifetimeRecord>,
            Vec<(&'static str, Vec<&'static str>, f64, f64)>,
        );
        let table: [Row; 4] = [
            (vec![], vec![]),
            (
                vec![record(None, None, Lane::Spot, 10.0)],
                vec![("unknown", vec!["unknown"], 10.0, 0.0)],
            ),
            (
                vec![
                    record(d4, Some("Spot"), Lane::Spot, 10.0),
                    record(d4, Some("Spot"), Lane::Spot, 5.0),
                    record(f2, Some("Regular"), Lane::Regular, 7.0),
                ],
                vec![
                    ("Standard_D4s_v5", vec!["Spot"], 15.0, 0.0),
                    ("Standard_F2s_v2", vec!["Regular"], 0.0, 7.0),
                ],
            ),
            (
                vec![
                    record(d4, Some("Spot"), Lane::Spot, 1.0),
                    record(d4, Some("Regular"), Lane::Regular, 2.0),
                    record(None, None, Lane::Spot, 3.0),
                ],
                vec![
                    ("Standard_D4s_v5", vec!["Regular", "Spot"], 1.0, 2.0),
                    ("unknown", vec!["unknown"], 3.0, 0.0),
                ],
            ),
        ];
        for (records, expected) in table {
            let got: Vec<(String, Vec<String>, f64, f64)> =
                bill_by_vm_size(&records, 2_000_000, 300_000)
                    .into_iter()
                    .map(|s| {
                        (
                            s.vm_size,
                            s.priorities,
                            s.bill.spot.time.busy_s,
                            s.bill.regular.time.busy_s,
                        )
                    })
                    .collect();
            let expected: Vec<(String, Vec<String>, f64, f64)> = expected
                .into_iter()
                .map(|(size, p, spot, regular)| {
                    (
                        size.to_owned(),
                        p.into_iter().map(str::to_owned).collect(),
                        spot,
                        regular,
                    )
                })
                .collect();
            assert_eq!(got, expected, "{records:?}");
        }
    }

    #[test]
    fn a_record_without_size_reads_back_as_before() {
        let new = record(Some("Standard_D4s_v5"), Some("Spot"), Lane::Spot, 1.0);
        let json = serde_json::to_string(&new).unwrap();
        assert!(json.contains(r#""vm_size":"Standard_D4s_v5""#), "{json}");
        let back: LifetimeRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, new);
        let unknown = record(None, None, Lane::Spot, 1.0);
        let json = serde_json::to_string(&unknown).unwrap();
        assert!(!json.contains("vm_size"), "an old reader's shape: {json}");
        assert!(!json.contains("priority"), "{json}");
        // A record in the shape an older worker wrote reads back as unknown.
        let back: LifetimeRecord = serde_json::from_str(&json).unwrap();
        assert_eq!((back.vm_size, back.priority), (None, None));
    }
}
