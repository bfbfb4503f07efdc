//! The long job: one job several times longer than the others, enqueued
//! first, and Preempted on whichever VM holds it, more times than
//! `max_failures`. Evictions are never failures, so it must still complete
//! once, correctly, and never be poisoned; and the run fails if it was
//! evicted no more than `max_failures` times, so the check cannot pass
//! vacuously.
//!
//! Which VM holds it is read from the workers' JSON logs: every line of a
//! delivery names its message (the consumer's span, the handler's span, the
//! lease renewals' field), and the newest such line on a running VM that is
//! not a settlement (released, deleted, retried, lease lost) names the
//! holder. The Preempt goes to that VM only if it is still the slot's VM
//! when the order arrives.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng as _;
use rand::rngs::StdRng;
use serde_json::Value;
use spot_worker_primes::PrimesJob;
use tokio::sync::{mpsc, oneshot};

use super::Options;
use super::fleet::{Ending, Order, Shared, VmRecord};
use super::logs::{ALREADY_COMPLETED, Line, RELEASED, WAITED_FOR_PEER, read_log};
use super::report::Report;

/// The long job's `job_id`.
const JOB_ID: &str = "long-job";
/// How often the logs are read while looking for the holder.
const POLL: Duration = Duration::from_millis(250);

/// The consumer's log messages that end a delivery's hold on its message.
const SETTLED: [&str; 7] = [
    RELEASED,
    "handled and deleted",
    "handler failed; will retry",
    ALREADY_COMPLETED,
    WAITED_FOR_PEER,
    "lease lost before settling; the message belongs to another consumer now",
    "moved to the poison queue",
];

/// The long job's settings.
#[derive(Clone, Debug)]
pub struct LongJob {
    /// Numbers in the job (the others have `Options::job_span`).
    pub span: u64,
    /// Preempts of whichever VM holds it: at least `max_failures + 2` for
    /// the run to show that evictions do not count.
    pub evictions: usize,
    /// How long it runs on a VM, once seen there, before that VM is
    /// Preempted (drawn uniformly).
    pub hold: (Duration, Duration),
}

impl LongJob {
    /// The job itself, at a random place.
    pub(super) fn job(&self, rng: &mut StdRng) -> PrimesJob {
        let start = rng.random_range(0..1_000_000_000);
        PrimesJob::new(JOB_ID, start, start + self.span).expect("a valid long job")
    }
}

/// What the evicting task did.
#[derive(Debug)]
pub(super) struct Evicted {
    /// Preempts delivered to the VM seen holding the job.
    sent: usize,
    /// Why it stopped before `evictions`, if it did.
    gave_up: Option<String>,
}

/// The long job's figures, for the report.
#[derive(Clone, Debug)]
pub struct Figures {
    pub planned: usize,
    /// Preempts the evicting task sent to the VM seen holding it.
    pub preempts: usize,
    /// Evictions suffered: drains that released its message on a VM that
    /// then exited for a Preempt (the task's, or a random one).
    pub evicted: usize,
    /// Drains for anything else that released it (a shared Reboot).
    pub other_releases: usize,
    /// Its highest `DequeueCount`.
    pub deliveries: u64,
    /// Handler failures logged for it (the only thing that counts).
    pub failures: usize,
    pub max_failures: u32,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "evicted {} times (planned {}; {} Preempts sent to its holder), released by {} other drains, {} deliveries, {} handler failures, max_failures {}",
            self.evicted,
            self.planned,
            self.preempts,
            self.other_releases,
            self.deliveries,
            self.failures,
            self.max_failures
        )
    }
}

/// Preempts the long job's holder `long.evictions` times, each after it
/// has held the job for a while; stops early (saying why) if the job
/// completes or the run is over. No shorter bound on finding the holder:
/// a released message may wait behind the whole backlog (seen with
/// Azurite: 24 s behind 30 jobs), and a fresh delivery shows
/// first at its first lease renewal, half a lease in; the run's own
/// timeout bounds the wait.
pub(super) async fn evict_repeatedly(
    shared: Arc<Shared>,
    slots: Vec<mpsc::Sender<Order>>,
    long: LongJob,
    message_id: String,
    mut rng: StdRng,
) -> Evicted {
    let mut evicted = Evicted {
        sent: 0,
        gave_up: None,
    };
    while evicted.sent < long.evictions {
        let hold = rng.random_range(long.hold.0..=long.hold.1);
        match evict_once(&shared, &slots, &message_id, hold).await {
            Ok(()) => evicted.sent += 1,
            Err(why) => {
                evicted.gave_up = Some(why);
                break;
            }
        }
    }
    evicted
}

async fn evict_once(
    shared: &Shared,
    slots: &[mpsc::Sender<Order>],
    message_id: &str,
    hold: Duration,
) -> Result<(), String> {
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return Err("the run was over first".to_owned());
        }
        if let Some((slot, vm)) = holder(shared, message_id) {
            tokio::time::sleep(hold).await;
            // Not while a shared Reboot is under way (it may have picked
            // this VM); held until the Preempt is answered.
            let _exclusive = shared.exclusive_step.lock().await;
            // Still there after working a while?
            if holder(shared, message_id).is_some_and(|(_, now)| now == vm) {
                let (answer, evicted) = oneshot::channel();
                let order = Order::EvictIfCurrent {
                    vm,
                    evicted: answer,
                };
                if slots[slot].send(order).await.is_ok() && evicted.await == Ok(true) {
                    return Ok(());
                }
            }
            continue;
        }
        if completed(shared) {
            return Err("it completed first".to_owned());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The slot and name of the running VM that holds the message now, if any.
fn holder(shared: &Shared, message_id: &str) -> Option<(usize, String)> {
    let slots = shared.current.lock().unwrap().clone();
    slots
        .into_iter()
        .enumerate()
        .filter_map(|(slot, vm)| {
            let vm = vm?;
            let last = read_log(&vm.log)
                .into_iter()
                .rfind(|line| line.message_id() == Some(message_id))?;
            // A completed job is about to be deleted: Preempting its VM
            // now would release nothing.
            let settled = SETTLED.contains(&last.message.as_str())
                || last.message.starts_with("lease lost")
                || is_completion(&last);
            (!settled).then_some((last.timestamp, slot, vm.name))
        })
        .max()
        .map(|(_, slot, name)| (slot, name))
}

/// Whether a worker logged the long job completed.
fn completed(shared: &Shared) -> bool {
    let logs: Vec<_> = shared
        .vms
        .lock()
        .unwrap()
        .iter()
        .map(|vm| vm.log.clone())
        .collect();
    logs.iter()
        .any(|log| read_log(log).iter().any(is_completion))
}

fn is_completion(line: &Line) -> bool {
    line.message == "job completed"
        && line.fields.get("job_id").and_then(Value::as_str) == Some(JOB_ID)
}

/// The long job's checks, from the workers' logs (its result and that it
/// is not in the poison queue are checked with every job's): it was
/// evicted more than `max_failures` times, and delivered more often than
/// `max_failures` would allow if evictions counted.
pub(super) fn check(
    report: &mut Report,
    long: &LongJob,
    options: &Options,
    message_id: &str,
    evicted: Evicted,
    vms: &[VmRecord],
) -> anyhow::Result<()> {
    let mut figures = Figures {
        planned: long.evictions,
        preempts: evicted.sent,
        evicted: 0,
        other_releases: 0,
        deliveries: 0,
        failures: 0,
        max_failures: options.max_failures,
    };
    for vm in vms {
        let preempted = vm.ending == Some(Ending::Preempted);
        for line in read_log(&vm.log) {
            if line.message_id() != Some(message_id) {
                continue;
            }
            if let Some(count) = line.dequeue_count() {
                figures.deliveries = figures.deliveries.max(count);
            }
            match line.message.as_str() {
                RELEASED if preempted => figures.evicted += 1,
                RELEASED => figures.other_releases += 1,
                "handler failed; will retry" => figures.failures += 1,
                _ => {}
            }
        }
    }
    // Planned: `long.evictions`. Required: more than `max_failures`, which
    // is what shows that evictions do not count; the job may complete
    // before the last planned Preempt on a fast machine.
    let required = options.max_failures as usize + 1;
    if figures.evicted < required {
        report.fail(format!(
            "the long job was evicted {} times, fewer than the {required} required (more than max_failures; {} planned){}",
            figures.evicted,
            long.evictions,
            evicted
                .gave_up
                .map(|why| format!(" (stopped evicting: {why})"))
                .unwrap_or_default()
        ));
    }
    if figures.deliveries <= u64::from(options.max_failures) + 1 {
        report.fail(format!(
            "the long job was delivered {} times, not more than max_failures + 1 ({}): the run shows nothing",
            figures.deliveries,
            options.max_failures + 1
        ));
    }
    report.long_job = Some(figures);
    Ok(())
}
