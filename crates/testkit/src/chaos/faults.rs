//! Injecting the faults: the schedule runs in order, each fault after its
//! pause, and goes where its kind says: to a slot's supervisor (Preempt,
//! SIGKILL, Freeze, slow or failing IMDS), to Azurite itself (the outage),
//! or to two VMs at once (the shared Reboot, a scripted step of its own).

use std::sync::{Arc, Mutex};

use anyhow::Result;
use spot_worker_imds_emulator::{Emulator, EventSpec, Fault};
use tokio::sync::mpsc;

use super::fleet::{Order, Shared};
use super::plan::{FaultKind, PlannedFault};
use super::shared_reboot;
use crate::Azurite;

/// Runs the whole schedule; returns once the last fault is injected (or
/// Azurite failed to come back after an outage).
pub(super) async fn run_schedule(
    schedule: &[PlannedFault],
    shared: &Shared,
    slots: &[mpsc::Sender<Order>],
    azurite: &Arc<Mutex<Azurite>>,
) -> Result<()> {
    for fault in schedule {
        tokio::time::sleep(fault.gap).await;
        if let FaultKind::SharedReboot { .. } = fault.kind {
            let record = shared_reboot::run(shared, slots, fault.slot, &fault.kind).await;
            shared.reboots.lock().unwrap().push(record);
        } else if let FaultKind::AzuriteOutage { hold } = fault.kind {
            shared.record_fault(&fault.kind, "azurite");
            let azurite = Arc::clone(azurite);
            tokio::task::spawn_blocking(move || -> Result<()> {
                let mut azurite = azurite.lock().unwrap();
                azurite.stop()?;
                // The outage itself: storage is gone for this long.
                std::thread::sleep(hold);
                azurite.start_again()?;
                Ok(())
            })
            .await??;
        } else {
            slots[fault.slot]
                .send(Order::Fault(fault.kind.clone()))
                .await
                .ok();
        }
    }
    Ok(())
}

/// Whether the fault ends its VM's worker process (the slot then boots a
/// replacement).
pub(super) fn ends_the_vm(kind: &FaultKind) -> bool {
    matches!(kind, FaultKind::Preempt | FaultKind::Kill)
}

/// The faults a VM's IMDS emulator carries out by itself: a Freeze
/// announced on it, or its next Scheduled Events GETs slowed or failed.
pub(super) fn inject_into_imds(emulator: &Emulator, kind: FaultKind) {
    match kind {
        FaultKind::Freeze { notice, secs } => {
            let spec = EventSpec::freeze().notice(notice).duration_secs(secs);
            if let Err(error) = emulator.schedule(spec) {
                eprintln!("chaos: scheduling a Freeze failed: {error}");
            }
        }
        FaultKind::ImdsSlow { delay, count } => {
            emulator.inject_faults(Fault::Delay(delay), count);
        }
        FaultKind::ImdsFailing { fault, count } => {
            emulator.inject_faults(fault, count);
        }
        // The supervisor ends the process itself; the schedule runs the
        // others (they span slots).
        FaultKind::Preempt
        | FaultKind::Kill
        | FaultKind::AzuriteOutage { .. }
        | FaultKind::SharedReboot { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_preempts_and_kills_end_the_vm() {
        let table = [
            (FaultKind::Preempt, true),
            (FaultKind::Kill, true),
            (
                FaultKind::Freeze {
                    notice: Duration::from_secs(1),
                    secs: 2,
                },
                false,
            ),
            (
                FaultKind::AzuriteOutage {
                    hold: Duration::from_secs(1),
                },
                false,
            ),
            (
                FaultKind::ImdsSlow {
                    delay: Duration::from_millis(300),
                    count: 2,
                },
                false,
            ),
            (
                FaultKind::ImdsFailing {
                    fault: Fault::Drop,
                    count: 2,
                },
                false,
            ),
            (
                FaultKind::SharedReboot {
                    peer: 1,
                    notice: Duration::from_secs(12),
                    cancel: true,
                },
                false,
            ),
        ];
        for (kind, ends) in table {
            assert_eq!(ends_the_vm(&kind), ends, "{kind}");
        }
    }
}
