//! The fleet's bill, simulated: a batch of jobs arriving at once on a
//! scale set of N VMs, second by second, under one scale-in policy.
//!
//! What is modelled, and why each part is there:
//!
//! - **start-up**: every VM boots for [`Model::startup`] before it takes
//!   a message (paid, holding nothing: counted idle);
//! - **the queue**: one message per job; a VM holds one at a time; a
//!   message whose VM is removed reappears after the visibility timeout
//!   (its lease runs out), with the progress of its last save;
//! - **checkpoints**: a job saves every [`Model::checkpoint`] of its own
//!   time; a VM removed while busy loses the work since the last save
//!   (`lost_work_hours`), and the job is redone from there;
//! - **the autoscale metric**: the queue's `ApproximateMessageCount`
//!   (waiting, held and not yet visible again: every message not deleted),
//!   sampled each minute; the rules are evaluated every
//!   [`Model::evaluation`], and after an action not again before its
//!   cool-down;
//! - **Azure's choice**: a scale-in removes the VMs with the highest
//!   instance ids first (the default scale-in policy, one zone), skipping
//!   those protected from scale-in where the policy protects;
//! - **ARM calls**: a protect or release lands [`Model::arm_latency`]
//!   after the worker asks; until then the VM's protection is what it was.
//!
//! The policies ([`Policy`]): today's rule (`modules/autoscale.bicep`
//! with `scaleInProtection=false`: nothing held for 15 minutes, then
//! straight to the minimum); Azure's usual queue rule with no protection
//! (fewer messages than instances over 5 minutes: 10 % fewer instances);
//! the prompt rule `modules/autoscale.bicep` ships with
//! `scaleInProtection=true` (the average count per instance over
//! [`Model::window_minutes`] below 1: [`Model::scale_in_step`] fewer
//! instances, then [`Model::cooldown`]) with instance protection set the
//! simple way (protect after taking a message, release when the queue has
//! none for it); and ours, the same prompt rule with the worker as it
//! ships (`spot_worker_runtime::scale_in_protection`): it protects its VM
//! when it takes the first message of a busy period and releases it by
//! [`wants_protection`], after the idle grace.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Result, bail};
use spot_worker::decisions::scale_in::{Activity, wants_protection};

/// A scale-in policy the bench compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `modules/autoscale.bicep` today: scale in only after the queue
    /// held nothing for 15 minutes, straight to the minimum.
    Today,
    /// Azure's usual queue rule, no protection: busy VMs are removed.
    NoProtection,
    /// Instance protection per busy period, set after taking a message
    /// and released as soon as none is left for the VM.
    ProtectPerBusyPeriod,
    /// Ours: the worker's [`wants_protection`], with the idle grace.
    Ours,
}

impl Policy {
    /// Every policy, in the order the bench reports them.
    pub const ALL: [Policy; 4] = [
        Policy::Today,
        Policy::NoProtection,
        Policy::ProtectPerBusyPeriod,
        Policy::Ours,
    ];

    /// The policy's name on the command line and in the JSON lines.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Today => "today",
            Policy::NoProtection => "no-protection",
            Policy::ProtectPerBusyPeriod => "protect-per-busy-period",
            Policy::Ours => "ours",
        }
    }

    /// The policy named `name`.
    pub fn parse(name: &str) -> Result<Policy> {
        match Policy::ALL.into_iter().find(|p| p.name() == name) {
            Some(policy) => Ok(policy),
            None => bail!(
                "--scale-in {name}: not a policy (one of {})",
                Policy::ALL.map(Policy::name).join(", ")
            ),
        }
    }

    fn protects(self) -> bool {
        matches!(self, Policy::ProtectPerBusyPeriod | Policy::Ours)
    }
}

/// The fleet and Azure's timings.
#[derive(Clone, Copy, Debug)]
pub struct Model {
    /// VMs at the start (the batch's scale-out already done).
    pub vms: usize,
    /// `minInstances`.
    pub minimum: usize,
    /// From a VM's creation until it takes its first message.
    pub startup: Duration,
    /// How often autoscale evaluates its rules.
    pub evaluation: Duration,
    /// The cool-down of the prompt rules (today's rule keeps its 10 min).
    pub cooldown: Duration,
    /// The prompt rule's window: the average count per instance over it
    /// (`scaleInWindowMinutes` in `bicep/main.bicep`).
    pub window_minutes: usize,
    /// Instances the prompt rule removes per scale-in, at most
    /// (`scaleInStep` in `bicep/main.bicep`).
    pub scale_in_step: usize,
    /// A job's checkpoint interval.
    pub checkpoint: Duration,
    /// How long a removed VM's message stays invisible.
    pub visibility: Duration,
    /// From asking ARM to protect or release until it holds.
    pub arm_latency: Duration,
    /// The idle grace of [`wants_protection`].
    pub idle_grace: Duration,
}

/// One policy's bill: the JSON line's numbers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bill {
    pub paid_vm_hours: f64,
    pub busy_vm_hours: f64,
    pub idle_vm_hours: f64,
    pub busy_removed: u64,
    pub lost_work_hours: f64,
    pub makespan_hours: f64,
    /// Protect and release calls the workers made (not in the JSON line).
    pub arm_calls: u64,
}

/// Today's rule: the window over which the count must stay at 0.
const TODAY_WINDOW_MINUTES: usize = 15;
/// Today's rule's cool-down (`modules/autoscale.bicep`).
const TODAY_COOLDOWN: u64 = 600;
/// The rule without protection removes this share of the instances.
const NO_PROTECTION_STEP: f64 = 0.10;
/// The longest simulated time before the bench gives up: 60 days.
const HORIZON_SECS: u64 = 60 * 86_400;

struct Running {
    job: usize,
    /// When this delivery started.
    started: u64,
    /// Job seconds done before it (its last save).
    progress_at_start: u64,
}

struct Vm {
    removed_at: Option<u64>,
    running: Option<Running>,
    idle_since: u64,
    protected: bool,
    /// An ARM call under way: when it lands and what it sets.
    pending: Option<(u64, bool)>,
    /// Seconds it existed (paid), and of those, held a message.
    paid_secs: u64,
    busy_secs: u64,
}

/// Runs the batch `jobs` (seconds of work each) under `policy`.
pub fn simulate(jobs: &[u64], model: &Model, policy: Policy) -> Result<Bill> {
    if model.vms == 0 {
        bail!("--vms 0: no VM to run the batch on");
    }
    let startup = model.startup.as_secs();
    let checkpoint = model.checkpoint.as_secs().max(1);
    let mut vms: Vec<Vm> = (0..model.vms)
        .map(|_| Vm {
            removed_at: None,
            running: None,
            idle_since: startup,
            protected: false,
            pending: None,
            paid_secs: 0,
            busy_secs: 0,
        })
        .collect();
    // (job, progress): waiting; (visible at, job, progress): not yet visible.
    let mut waiting: VecDeque<(usize, u64)> = (0..jobs.len()).map(|job| (job, 0)).collect();
    let mut hidden: Vec<(u64, usize, u64)> = Vec::new();
    let mut done = 0usize;
    let mut bill = Bill::default();
    let mut samples: Vec<usize> = Vec::new();
    let mut last_action: Option<u64> = None;
    let mut makespan = 0u64;
    let mut t = 0u64;
    loop {
        // ARM calls land; hidden messages reappear.
        for vm in vms.iter_mut().filter(|vm| vm.removed_at.is_none()) {
            if let Some((at, value)) = vm.pending
                && at <= t
            {
                vm.protected = value;
                vm.pending = None;
            }
        }
        hidden.retain(|&(at, job, progress)| {
            if at <= t {
                waiting.push_back((job, progress));
                false
            } else {
                true
            }
        });
        // Each VM: finish, take, protect, release.
        for vm in vms.iter_mut().filter(|vm| vm.removed_at.is_none()) {
            vm.paid_secs += 1;
            if t < startup {
                continue;
            }
            if let Some(run) = &vm.running
                && run.started + (jobs[run.job] - run.progress_at_start) <= t
            {
                done += 1;
                makespan = t;
                vm.running = None;
                vm.idle_since = t;
            }
            if vm.running.is_none() {
                step_idle_vm(vm, t, &mut waiting, model, policy, &mut bill);
            }
            if vm.running.is_some() {
                vm.busy_secs += 1;
            }
        }
        if done == jobs.len() && live(&vms) <= model.minimum.max(1) {
            break;
        }
        // The metric, each minute: every message not deleted.
        if t.is_multiple_of(60) {
            let held = vms
                .iter()
                .filter(|vm| vm.removed_at.is_none() && vm.running.is_some())
                .count();
            samples.push(waiting.len() + hidden.len() + held);
        }
        let evaluate = t.is_multiple_of(model.evaluation.as_secs().max(1));
        if evaluate
            && let Some(wanted) = scale_in_wanted(policy, &samples, &vms, model, t, last_action)
        {
            let removed = remove(
                &mut vms,
                wanted,
                policy,
                t,
                checkpoint,
                model,
                &mut hidden,
                &mut bill,
            );
            if removed > 0 {
                last_action = Some(t);
            }
        }
        t += 1;
        if t > HORIZON_SECS {
            bail!(
                "{}: the batch did not finish within 60 simulated days",
                policy.name()
            );
        }
    }
    let paid: u64 = vms.iter().map(|vm| vm.paid_secs).sum();
    let busy: u64 = vms.iter().map(|vm| vm.busy_secs).sum();
    bill.paid_vm_hours = paid as f64 / 3600.0;
    bill.busy_vm_hours = busy as f64 / 3600.0;
    bill.idle_vm_hours = paid.saturating_sub(busy) as f64 / 3600.0;
    bill.makespan_hours = makespan as f64 / 3600.0;
    Ok(bill)
}

/// A VM holding nothing: takes a message if one waits (and asks for its
/// protection where the policy protects), or asks for its protection to go.
fn step_idle_vm(
    vm: &mut Vm,
    t: u64,
    waiting: &mut VecDeque<(usize, u64)>,
    model: &Model,
    policy: Policy,
    bill: &mut Bill,
) {
    let mut ask = |vm: &mut Vm, value: bool| {
        if vm.pending.is_none() && vm.protected != value {
            vm.pending = Some((t + model.arm_latency.as_secs(), value));
            bill.arm_calls += 1;
        }
    };
    if let Some((job, progress)) = waiting.pop_front() {
        vm.running = Some(Running {
            job,
            started: t,
            progress_at_start: progress,
        });
        // Both protect once they hold the message (ours: the first of a
        // busy period; still protected from the last one, no call).
        if policy.protects() {
            ask(vm, true);
        }
        return;
    }
    match policy {
        Policy::ProtectPerBusyPeriod => ask(vm, false),
        Policy::Ours => {
            let idle = Activity::Idle {
                idle_for: Duration::from_secs(t - vm.idle_since),
            };
            if !wants_protection(idle, model.idle_grace) {
                ask(vm, false);
            }
        }
        Policy::Today | Policy::NoProtection => {}
    }
}

fn live(vms: &[Vm]) -> usize {
    vms.iter().filter(|vm| vm.removed_at.is_none()).count()
}

/// How many instances the policy's autoscale rule asks to remove now.
fn scale_in_wanted(
    policy: Policy,
    samples: &[usize],
    vms: &[Vm],
    model: &Model,
    t: u64,
    last_action: Option<u64>,
) -> Option<usize> {
    let instances = live(vms);
    if instances <= model.minimum {
        return None;
    }
    let cooldown = match policy {
        Policy::Today => TODAY_COOLDOWN,
        _ => model.cooldown.as_secs(),
    };
    if last_action.is_some_and(|at| t < at + cooldown) {
        return None;
    }
    let surplus = instances - model.minimum;
    match policy {
        Policy::Today => {
            let window = samples
                .len()
                .checked_sub(TODAY_WINDOW_MINUTES)
                .map(|from| &samples[from..])?;
            window.iter().all(|&count| count == 0).then_some(surplus)
        }
        _ => {
            let window = samples
                .len()
                .checked_sub(model.window_minutes.max(1))
                .map(|from| &samples[from..])?;
            let average = window.iter().sum::<usize>() as f64 / window.len() as f64;
            if average / instances as f64 >= 1.0 {
                return None;
            }
            let step = if policy.protects() {
                // The prompt rule: a fixed step, protected VMs skipped.
                model.scale_in_step
            } else {
                (instances as f64 * NO_PROTECTION_STEP).ceil() as usize
            };
            Some(step.clamp(1, surplus))
        }
    }
}

/// Azure's scale-in: up to `wanted` VMs, highest instance id first,
/// skipping protected ones where the policy protects. Returns how many
/// went.
#[allow(clippy::too_many_arguments)]
fn remove(
    vms: &mut [Vm],
    wanted: usize,
    policy: Policy,
    t: u64,
    checkpoint: u64,
    model: &Model,
    hidden: &mut Vec<(u64, usize, u64)>,
    bill: &mut Bill,
) -> usize {
    let mut removed = 0;
    for vm in vms.iter_mut().rev() {
        if removed == wanted {
            break;
        }
        if vm.removed_at.is_some() || (policy.protects() && vm.protected) {
            continue;
        }
        vm.removed_at = Some(t);
        removed += 1;
        if let Some(run) = vm.running.take() {
            let progress = run.progress_at_start + (t - run.started);
            let saved = progress / checkpoint * checkpoint;
            let saved = saved.max(run.progress_at_start);
            bill.busy_removed += 1;
            bill.lost_work_hours += (progress - saved) as f64 / 3600.0;
            hidden.push((t + model.visibility.as_secs(), run.job, saved));
        }
    }
    removed
}
