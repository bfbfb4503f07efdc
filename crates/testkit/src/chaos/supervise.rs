//! A worker slot's supervisor: it keeps one VM running in its slot, as a
//! scale set keeps its instance count, replacing the VM whenever it is
//! gone, and carries out the orders sent to the slot (faults, the long
//! job's evictions, the final stop) once the VM's worker is ready.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use spot_worker_imds_emulator::EventSpec;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::fleet::{Ending, Order, Shared, VmHandle};
use super::vm::{SlotKind, Vm, boot_vm, ready, wait_exit};
use super::{FaultKind, PREEMPT_EXIT_BOUND, STOP_EXIT_BOUND, faults};

/// The worker slots: one supervisor each, and the channel of its orders.
pub(super) struct Fleet {
    pub(super) shared: Arc<Shared>,
    pub(super) slots: Vec<mpsc::Sender<Order>>,
    supervisors: Vec<JoinHandle<()>>,
}

impl Fleet {
    /// Starts a supervisor per worker slot (the Spot VMs', then the
    /// regular VMs' and the command VMs', which the schedule never
    /// targets); each boots its first VM.
    pub(super) fn start(shared: Arc<Shared>) -> Fleet {
        let mut slots = Vec::new();
        let mut supervisors = Vec::new();
        for slot in 0..shared.options.slots() {
            let (tx, rx) = mpsc::channel(64);
            slots.push(tx);
            supervisors.push(tokio::spawn(supervise(Arc::clone(&shared), slot, rx)));
        }
        Fleet {
            shared,
            slots,
            supervisors,
        }
    }

    /// Stops every worker with SIGTERM, which drains like a notice, and
    /// waits (bounded) for every supervisor to record how its VM ended.
    pub(super) async fn stop(self) {
        for slot in &self.slots {
            let _ = slot.send(Order::Stop).await;
        }
        for supervisor in self.supervisors {
            let _ =
                tokio::time::timeout(STOP_EXIT_BOUND + Duration::from_secs(10), supervisor).await;
        }
    }
}

/// Runs one worker slot: boots a VM, applies the faults sent to it once the
/// worker is ready, and replaces the VM whenever it is gone (as a scale set
/// replaces an evicted instance).
async fn supervise(shared: Arc<Shared>, slot: usize, mut commands: mpsc::Receiver<Order>) {
    loop {
        let mut vm = match boot_vm(&shared, SlotKind::of(&shared.options, slot)).await {
            Ok(vm) => vm,
            Err(error) => {
                eprintln!("chaos: slot {slot}: {error:#}");
                return;
            }
        };
        // Faults wait until the worker is ready: one that is still warming
        // up would not show how a working worker copes.
        let exited = tokio::select! {
            () = ready(&shared.http, &vm.health) => None,
            status = vm.child.wait() => Some(status.ok()),
        };
        if let Some(status) = exited {
            let ending = Ending::Unexpected(format!("exited before it was ready: {status:?}"));
            shared.record_end(&vm.name, ending, status);
            continue;
        }
        shared.current.lock().unwrap()[slot] = Some(VmHandle {
            name: vm.name.clone(),
            log: vm.log.clone(),
            health: vm.health.clone(),
            emulator: (*vm.emulator).clone(),
        });
        loop {
            let command = tokio::select! {
                status = vm.child.wait() => {
                    let status = status.ok();
                    let expected = shared.expected_exits.lock().unwrap().remove(&vm.name);
                    let ending = expected.unwrap_or_else(|| Ending::Unexpected(format!("exited by itself: {status:?}")));
                    shared.record_end(&vm.name, ending, status);
                    break;
                }
                command = commands.recv() => command.unwrap_or(Order::Stop),
            };
            match command {
                Order::Stop => {
                    if let Some(pid) = vm.child.id().and_then(|id| i32::try_from(id).ok()) {
                        // SAFETY: kill(2) on our own child's pid.
                        unsafe {
                            libc::kill(pid, libc::SIGTERM);
                        }
                    }
                    let status = wait_exit(&mut vm.child, STOP_EXIT_BOUND).await;
                    shared.record_end(&vm.name, Ending::Stopped, status);
                    let _ = vm.emulator.shutdown().await;
                    return;
                }
                Order::EvictIfCurrent { vm: name, evicted } => {
                    if name != vm.name {
                        let _ = evicted.send(false);
                        continue;
                    }
                    shared.retire(slot);
                    shared.record_fault_named("evict-long-job", &vm.name);
                    preempt(&shared, &mut vm).await;
                    let _ = evicted.send(true);
                    break;
                }
                Order::Fault(kind) => {
                    let ends_the_vm = faults::ends_the_vm(&kind);
                    if ends_the_vm {
                        shared.retire(slot);
                    }
                    shared.record_fault(&kind, &vm.name);
                    match kind {
                        FaultKind::Preempt => preempt(&shared, &mut vm).await,
                        FaultKind::Kill => {
                            let _ = vm.child.start_kill();
                            let status = vm.child.wait().await.ok();
                            shared.record_end(&vm.name, Ending::Killed, status);
                        }
                        other => faults::inject_into_imds(&vm.emulator, other),
                    }
                    if ends_the_vm {
                        break;
                    }
                }
            }
        }
        let _ = vm.emulator.shutdown().await;
    }
}

/// Posts a Preempt to the VM and waits (bounded) for its worker to exit;
/// records how it ended.
async fn preempt(shared: &Shared, vm: &mut Vm) {
    let not_before = match vm.emulator.schedule(EventSpec::preempt()) {
        Ok(event) => event.not_before,
        Err(error) => {
            eprintln!("chaos: scheduling a Preempt failed: {error}");
            None
        }
    };
    let status = wait_exit(&mut vm.child, PREEMPT_EXIT_BOUND).await;
    let ending = preempt_ending(status.is_some(), not_before, SystemTime::now());
    shared.record_end(&vm.name, ending, status);
}

/// How a Preempted VM ended, from whether its worker exited within
/// [`PREEMPT_EXIT_BOUND`] and when: our own deadline check, besides the
/// worker's `met_deadline`, is that it was gone before NotBefore, when Azure
/// would take the VM away.
fn preempt_ending(exited: bool, not_before: Option<SystemTime>, now: SystemTime) -> Ending {
    match not_before {
        _ if !exited => Ending::Unexpected(format!(
            "still running {PREEMPT_EXIT_BOUND:?} after a Preempt notice"
        )),
        Some(at) if now >= at => {
            Ending::Unexpected("exited after the Preempt's NotBefore".to_owned())
        }
        _ => Ending::Preempted,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_preempted_worker_must_exit_before_not_before() {
        let now = SystemTime::now();
        let later = Some(now + Duration::from_secs(1));
        let late = "exited after the Preempt's NotBefore".to_owned();
        let stuck = format!("still running {PREEMPT_EXIT_BOUND:?} after a Preempt notice");
        let table = [
            (true, later, Ending::Preempted),
            // The emulator did not say when: the exit bound alone judges.
            (true, None, Ending::Preempted),
            (true, Some(now), Ending::Unexpected(late)),
            (false, later, Ending::Unexpected(stuck.clone())),
            (false, None, Ending::Unexpected(stuck)),
        ];
        for (exited, not_before, ending) in table {
            assert_eq!(
                preempt_ending(exited, not_before, now),
                ending,
                "{exited} {not_before:?}"
            );
        }
    }
}
