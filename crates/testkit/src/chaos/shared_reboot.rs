//! The shared Reboot: one Reboot event, with the same `EventId`, posted to
//! the emulators of two VMs with `Resources` naming both, as Azure lists a
//! maintenance Reboot of two scale-set VMs. Approving it would start it for
//! the peer too, so neither worker may: both must drain (not ready, taking
//! nothing), approve nothing and stay up while it is pending. Then it is
//! either cancelled (both must take work again) or left to start at its
//! short `NotBefore` (both must exit 0, and are replaced like Preempted VMs).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rand::Rng as _;
use rand::rngs::StdRng;
use spot_worker_imds_emulator::EventSpec;
use tokio::sync::mpsc;

use super::Options;
use super::fleet::{Ending, Order, Shared, VmHandle};
use super::logs::{Line, read_log};
use super::plan::{FaultKind, PlannedFault};

/// Notice of a Reboot that is cancelled: far longer than the step.
const CANCELLED_NOTICE: Duration = Duration::from_secs(120);
/// Notice of a Reboot left to start: enough to see both drained and parked
/// (Azure gives 15 minutes; the emulator starts it at `NotBefore`).
const STARTED_NOTICE: Duration = Duration::from_secs(12);
/// How long each stage of the step may take.
const STAGE_BOUND: Duration = Duration::from_secs(30);
/// How long both are watched while the event is pending.
const PENDING_WATCH: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(200);

/// The worker's log message once drained for an event it does not approve
/// (it names the event), and once that event is withdrawn.
const PARKED_PREFIX: &str = "drained for Reboot event ";
const RESUMED: &str = "the notice was withdrawn before the event started; taking work again";

/// Which shared Reboots the schedule holds.
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedReboots {
    /// Cancelled once both workers wait for it.
    pub cancelled: usize,
    /// Left to start at `NotBefore`.
    pub started: usize,
}

/// Adds the shared Reboots to the schedule: the cancelled ones first, while
/// plenty of work is queued for the workers to take again, the started ones
/// halfway through. Each targets two distinct slots.
pub(super) fn plan(rng: &mut StdRng, options: &Options, plan: &mut Vec<PlannedFault>) {
    if options.workers < 2 {
        return;
    }
    let mut reboot = |cancel: bool| {
        let slot = rng.random_range(0..options.workers);
        let peer = (slot + rng.random_range(1..options.workers)) % options.workers;
        let (lo, hi) = options.gap;
        PlannedFault {
            gap: rng.random_range(lo..=hi),
            kind: FaultKind::SharedReboot {
                peer,
                notice: if cancel {
                    CANCELLED_NOTICE
                } else {
                    STARTED_NOTICE
                },
                cancel,
            },
            slot,
        }
    };
    let reboots = options.shared_reboots;
    let started: Vec<_> = (0..reboots.started).map(|_| reboot(false)).collect();
    let cancelled: Vec<_> = (0..reboots.cancelled).map(|_| reboot(true)).collect();
    let middle = plan.len() / 2;
    plan.splice(middle..middle, started);
    plan.splice(0..0, cancelled);
}

/// One shared Reboot, for the report.
#[derive(Clone, Debug)]
pub struct Record {
    pub event_id: String,
    pub vms: Vec<String>,
    pub cancelled: bool,
    /// From posting the event until both workers waited for it.
    pub parked_ms: Option<u64>,
    /// What was seen after that.
    pub outcome: String,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}: {}; {}",
            if self.cancelled {
                "cancelled"
            } else {
                "started"
            },
            self.vms.join(" + "),
            self.parked_ms.map_or("never both parked".to_owned(), |ms| {
                format!("both drained and waiting, not approving, {ms} ms after the notice")
            }),
            self.outcome
        )
    }
}

static REBOOTS: AtomicUsize = AtomicUsize::new(0);

/// Runs one shared Reboot on the VMs of `slot` and the `kind`'s peer slot;
/// failed checks go to `shared.step_failed`.
pub(super) async fn run(
    shared: &Shared,
    slots: &[mpsc::Sender<Order>],
    slot: usize,
    kind: &FaultKind,
) -> Record {
    let &FaultKind::SharedReboot {
        peer,
        notice,
        cancel,
    } = kind
    else {
        unreachable!("run is only called for a shared Reboot");
    };
    let event_id = format!(
        "5A1E0C4D-0000-4000-8000-{:012X}",
        REBOOTS.fetch_add(1, Ordering::SeqCst)
    );
    let mut record = Record {
        event_id: event_id.clone(),
        vms: Vec::new(),
        cancelled: cancel,
        parked_ms: None,
        outcome: "not run".to_owned(),
    };
    let fail = |what: String| shared.step_failed(format!("shared Reboot {event_id}: {what}"));
    let _exclusive = shared.exclusive_step.lock().await;
    let Some(pair) = ready_pair(shared, slots, [slot, peer]).await else {
        fail(format!(
            "slots {slot} and {peer} not both ready within {STAGE_BOUND:?}"
        ));
        return record;
    };
    record.vms = pair.iter().map(|vm| vm.name.clone()).collect();
    shared.record_fault(kind, &record.vms.join("+"));
    if !cancel {
        let mut expected = shared.expected_exits.lock().unwrap();
        for vm in &pair {
            expected.insert(vm.name.clone(), Ending::Rebooted);
        }
    }
    let spec = EventSpec::reboot()
        .id(&event_id)
        .resources(record.vms.clone())
        .notice(notice);
    let posted = Instant::now();
    let mut not_before = None;
    for vm in &pair {
        match vm.emulator.schedule(spec.clone()) {
            Ok(event) => not_before = not_before.max(event.not_before),
            Err(error) => {
                fail(format!("posting it to {}: {error}", vm.name));
                return record;
            }
        }
    }
    let not_before = not_before.unwrap_or_else(SystemTime::now);

    // Both drain and park: not ready, still running, nothing approved.
    if !wait_until(shared, || {
        pair.iter().all(|vm| parked_line(vm, &event_id).is_some())
    })
    .await
    {
        fail(format!("not both parked within {STAGE_BOUND:?}"));
        return record;
    }
    record.parked_ms = Some(posted.elapsed().as_millis() as u64);
    let watch_until = Instant::now() + PENDING_WATCH;
    while Instant::now() < watch_until && SystemTime::now() < not_before {
        for vm in &pair {
            if shared.has_ended(&vm.name) {
                fail(format!("{} exited while the Reboot was pending", vm.name));
                return record;
            }
            if is_ready(shared, vm).await {
                fail(format!("{} ready while drained for the Reboot", vm.name));
            }
        }
        tokio::time::sleep(POLL).await;
    }
    check_not_approved(shared, &pair, &event_id);

    record.outcome = if cancel {
        for vm in &pair {
            if let Err(error) = vm.emulator.cancel_event(&event_id) {
                fail(format!("cancelling it on {}: {error}", vm.name));
            }
        }
        resumed(shared, &pair, &event_id).await
    } else {
        rebooted(shared, &pair, not_before).await
    };
    check_not_approved(shared, &pair, &event_id);
    for vm in &pair {
        check_idle_while_parked(shared, vm, &event_id);
    }
    record
}

/// The VMs of both slots once both are ready and untouched by any order,
/// within [`STAGE_BOUND`]. An order queued while a slot's VM booted (a
/// Preempt) would end it mid-check; one taken meanwhile retires the VM
/// from `current`, hence the second look after the readiness probes. No
/// order can come after it: the schedule waits for this step and the
/// evictions for `exclusive_step`.
async fn ready_pair(
    shared: &Shared,
    orders: &[mpsc::Sender<Order>],
    slots: [usize; 2],
) -> Option<Vec<VmHandle>> {
    let untouched = |pair: &[VmHandle]| {
        slots.iter().zip(pair).all(|(slot, vm)| {
            let queued = orders[*slot].capacity() < orders[*slot].max_capacity();
            !queued && shared.current(*slot).is_some_and(|now| now.name == vm.name)
        })
    };
    let give_up = Instant::now() + STAGE_BOUND;
    while Instant::now() < give_up {
        let pair: Vec<VmHandle> = slots.iter().filter_map(|s| shared.current(*s)).collect();
        if pair.len() == 2 && untouched(&pair) {
            let mut all_ready = true;
            for vm in &pair {
                all_ready &= is_ready(shared, vm).await;
            }
            if all_ready && untouched(&pair) {
                return Some(pair);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    None
}

async fn is_ready(shared: &Shared, vm: &VmHandle) -> bool {
    shared
        .http
        .get(&vm.health)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Polls `done` until it holds, within [`STAGE_BOUND`].
async fn wait_until(shared: &Shared, mut done: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + STAGE_BOUND;
    while Instant::now() < give_up && !shared.stopping.load(Ordering::SeqCst) {
        if done() {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    done()
}

/// Where in the VM's log it parked for the event, if it did.
fn parked_line(vm: &VmHandle, event_id: &str) -> Option<usize> {
    read_log(&vm.log)
        .iter()
        .position(|line| is_parked_for(line, event_id))
}

fn is_parked_for(line: &Line, event_id: &str) -> bool {
    line.message.starts_with(PARKED_PREFIX) && line.message.contains(event_id)
}

/// Neither emulator received a `StartRequests` POST for the event.
fn check_not_approved(shared: &Shared, pair: &[VmHandle], event_id: &str) {
    for vm in pair {
        let approvals = vm.emulator.approvals();
        if approvals
            .iter()
            .any(|a| a.event_id.eq_ignore_ascii_case(event_id))
        {
            shared.step_failed(format!(
                "shared Reboot {event_id}: {} approved it ({approvals:?})",
                vm.name
            ));
        }
    }
}

/// After a cancel: both log that they take work again and then a delivery
/// (the first line naming a message: a resumed checkpoint, a lease renewal
/// or a finished job, so seconds later). Returns what was seen.
async fn resumed(shared: &Shared, pair: &[VmHandle], event_id: &str) -> String {
    // Where in the log the VM resumed intake after parking, if it has.
    let resumed_at = |lines: &[Line]| {
        let parked = lines.iter().position(|l| is_parked_for(l, event_id))?;
        Some(parked + lines[parked..].iter().position(|l| l.message == RESUMED)?)
    };
    let resumed = |vm: &VmHandle| resumed_at(&read_log(&vm.log)).is_some();
    let took_work = |vm: &VmHandle| {
        let lines = read_log(&vm.log);
        let at = resumed_at(&lines)?;
        lines[at..]
            .iter()
            .find(|l| l.message_id().is_some())
            .map(drop)
    };
    let cancelled = Instant::now();
    let both_resumed = wait_until(shared, || pair.iter().all(resumed)).await;
    let resumed_ms = cancelled.elapsed().as_millis();
    if both_resumed && wait_until(shared, || pair.iter().all(|vm| took_work(vm).is_some())).await {
        format!(
            "cancelled; both resumed intake within {resumed_ms} ms and logged a delivery within {} ms",
            cancelled.elapsed().as_millis()
        )
    } else {
        let stuck: Vec<&str> = pair
            .iter()
            .filter(|vm| took_work(vm).is_none())
            .map(|vm| vm.name.as_str())
            .collect();
        shared.step_failed(format!(
            "shared Reboot {event_id}: after the cancel, {stuck:?} did not resume and take work within {STAGE_BOUND:?} each"
        ));
        format!("cancelled; {stuck:?} did not take work again")
    }
}

/// After `NotBefore`: both exit by themselves (their status is checked
/// with every VM's ending), none before the event started.
async fn rebooted(shared: &Shared, pair: &[VmHandle], not_before: SystemTime) -> String {
    let give_up = Instant::now() + STAGE_BOUND + STARTED_NOTICE;
    while Instant::now() < give_up && !pair.iter().all(|vm| shared.has_ended(&vm.name)) {
        tokio::time::sleep(POLL).await;
    }
    let after = SystemTime::now()
        .duration_since(not_before)
        .map_or(0, |d| d.as_millis());
    // NotBefore is whole seconds; the emulator starts the event on the
    // first look at or after it.
    let early: Vec<&str> = pair
        .iter()
        .filter(|vm| shared.ended_at(&vm.name).is_some_and(|at| at < not_before))
        .map(|vm| vm.name.as_str())
        .collect();
    if !early.is_empty() {
        shared.step_failed(format!("shared Reboot: {early:?} exited before it started"));
    }
    let running: Vec<&str> = pair
        .iter()
        .filter(|vm| !shared.has_ended(&vm.name))
        .map(|vm| vm.name.as_str())
        .collect();
    if running.is_empty() {
        format!("started at NotBefore; both exited within {after} ms of it")
    } else {
        shared.step_failed(format!(
            "shared Reboot: {running:?} still running {after} ms after it started"
        ));
        format!("started; {running:?} did not exit")
    }
}

/// Between parking for the event and resuming (or exiting), the worker
/// held no message.
fn check_idle_while_parked(shared: &Shared, vm: &VmHandle, event_id: &str) {
    let lines = read_log(&vm.log);
    let Some(parked) = lines.iter().position(|l| is_parked_for(l, event_id)) else {
        return;
    };
    let until = lines[parked..]
        .iter()
        .position(|l| l.message == RESUMED)
        .map_or(lines.len(), |at| parked + at);
    if let Some(line) = lines[parked..until]
        .iter()
        .find(|l| l.message_id().is_some())
    {
        shared.step_failed(format!(
            "shared Reboot {event_id}: {} held message {:?} while waiting for it ({:?})",
            vm.name,
            line.message_id(),
            line.message
        ));
    }
}
