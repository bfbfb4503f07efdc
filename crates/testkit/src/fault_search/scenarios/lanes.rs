//! One job with a deadline, behind its line, in the Spot lane: a Spot
//! worker and a regular worker (real [`Consumer`]s with lanes) and the
//! lane keeper's passes (a real [`LaneKeeper`]), every queue, checkpoint
//! and lease call faulted, the keeper stopped mid-pass at random. Checked
//! at every step: (b) the job never has two runs under way at once; (d)
//! once poisoned it never runs again, and no other message of it is
//! poisoned (records of one message sent twice after a lost answer are
//! one poisoning); (e) nothing is counted as a failure
//! that was not one (with [`Poison::Never`] the handler never fails, so
//! no run may be poisoned).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spot_worker_consumer::{
    Consumer, ConsumerConfig, HandlerError, Job, MessageHandler, PoisonRecord, permanent,
};
use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, Deadline, Lane, LanePolicy};
use spot_worker_lanes::{FleetSpotCapacity, LaneKeeper, Lanes, SpotCapacity, SwitchCost, enqueue};
use spot_worker_storage::{
    CheckpointStore, Clock, InMemoryCheckpointStore, InMemoryLeases, InMemoryQueue, LeaseStore,
    MessageEncoding, MessageQueue,
};
use tokio_util::sync::CancellationToken;

use crate::fault_search::{FaultPlan, Faulty, PlanClock, run_start};

/// The job's key.
const JOB: &str = "job-1";
/// How long the run lasts on tokio's (paused) clock.
const RUN_FOR: Duration = Duration::from_secs(240);
/// How long a keeper holds what it receives.
const KEEPER_HOLD: Duration = Duration::from_secs(6);

/// Whether the handler fails the job for good on its first run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poison {
    /// Never: the job succeeds each time it runs.
    Never,
    /// On its first run: the job is poisoned, and must stay so.
    FirstRun,
}

/// Which runs are under way, and which have ended for good.
#[derive(Default)]
struct Runs {
    under_way: BTreeMap<String, usize>,
    started: usize,
}

#[derive(Clone)]
struct Handler {
    plan: FaultPlan,
    runs: Arc<Mutex<Runs>>,
    poison: Poison,
    poison_queue: InMemoryQueue,
}

impl MessageHandler for Handler {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let lane = format!("{:?}", job.lane());
        let first = {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            runs.started += 1;
            let others: usize = runs.under_way.values().sum();
            self.plan
                .note(format!("a run starts in lane {lane} ({others} under way)"));
            if others > 0 {
                self.plan.broken(format!(
                    "(b) two runs of {JOB} under way at once (a new one in lane {lane}, others in {:?})",
                    runs.under_way.keys().collect::<Vec<_>>()
                ));
            }
            // Poisoned: its poison record is stored (a failure whose
            // settling did not land may run again, rightly).
            if !self.poison_queue.is_empty() {
                self.plan.broken(format!(
                    "(d) {JOB} was poisoned and runs again (lane {lane})"
                ));
            }
            *runs.under_way.entry(lane.clone()).or_default() += 1;
            runs.started == 1
        };
        // Ends the run however it ends: returned, or its future dropped.
        let under_way = UnderWay {
            runs: Arc::clone(&self.runs),
            lane: lane.clone(),
            plan: self.plan.clone(),
        };
        let work = Duration::from_millis(self.plan.pick(1_000..20_000));
        let cancelled = tokio::select! {
            () = tokio::time::sleep(work) => false,
            () = job.cancellation().cancelled() => true,
        };
        drop(under_way);
        if cancelled {
            self.plan
                .note(format!("the run in lane {lane} is cancelled"));
            return Err("cancelled".into());
        }
        if self.poison == Poison::FirstRun && first {
            self.plan
                .note(format!("the run in lane {lane} fails for good"));
            return Err(permanent("the job cannot succeed"));
        }
        self.plan.note(format!("the run in lane {lane} succeeds"));
        Ok(())
    }

    fn job_key(&self, _body: &[u8]) -> Option<String> {
        Some(JOB.to_owned())
    }
}

/// One run under way, until dropped.
struct UnderWay {
    runs: Arc<Mutex<Runs>>,
    lane: String,
    plan: FaultPlan,
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = runs.under_way.get_mut(&self.lane) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                runs.under_way.remove(&self.lane);
            }
        }
        self.plan
            .note(format!("the run in lane {} ends", self.lane));
    }
}

/// The consumer's settings: short holds, so a hold runs out often.
fn config() -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 4,
        max_in_flight: 4,
        visibility_timeout: Duration::from_secs(6),
        idle_backoff_floor: Duration::from_millis(200),
        idle_backoff_max: Duration::from_secs(2),
        retry_backoff_base: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(4),
        max_failures: 3,
        max_deliveries: 50,
        ..ConsumerConfig::default()
    }
}

/// Runs the scenario for `plan`'s seed.
pub async fn run(plan: FaultPlan, poison: Poison) {
    // Every id, every time of day and every jitter drawn from the plan:
    // the run replays exactly.
    let clock: Arc<dyn Clock> = Arc::new(PlanClock::new(&plan));
    let queue = |name| InMemoryQueue::seeded(name, plan.pick(0..u64::MAX), run_start());
    let spot_queue = queue("jobs");
    let regular_queue = queue("jobs-regular");
    let poison_queue = queue("jobs-poison");
    let memory = InMemoryCheckpointStore::new();
    let store: Arc<dyn CheckpointStore> =
        Arc::new(Faulty::new(memory.clone(), &plan, "checkpoints"));
    let spot: Arc<dyn MessageQueue> = Arc::new(Faulty::new(spot_queue.clone(), &plan, "spot"));
    let regular: Arc<dyn MessageQueue> =
        Arc::new(Faulty::new(regular_queue.clone(), &plan, "regular"));
    let leases: Arc<dyn LeaseStore> = Arc::new(Faulty::new(InMemoryLeases::new(), &plan, "leases"));
    let d = Duration::from_secs(60);
    let switch_cost = Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED.scaled_to(d)));
    let capacity_store: Arc<dyn CheckpointStore> = Arc::new(memory.clone());
    let spot_capacity = Arc::new(SpotCapacity::new(
        FleetSpotCapacity::new(capacity_store).with_clock(Arc::clone(&clock)),
        Duration::from_secs(1),
    ));
    let lanes = |lane| Lanes {
        lane,
        spot: Arc::clone(&spot),
        regular: Arc::clone(&regular),
        recheck: Duration::from_secs(1),
        switch_cost: Arc::clone(&switch_cost),
        spot_capacity: Arc::clone(&spot_capacity),
        policy: LanePolicy::default(),
        price_ratio: 3.0,
    };
    // Behind its line: 150 s of work due in 200 s, started 100 s ago.
    let now = clock.now();
    let deadline = Deadline {
        start: now - Duration::from_secs(100),
        due: now + Duration::from_secs(200),
        work: Duration::from_secs(150),
    };
    let plain = Lanes {
        spot: Arc::new(spot_queue.clone()),
        ..lanes(Lane::Spot)
    };
    if let Err(error) = enqueue(&plain, MessageEncoding::Text, b"{}", Some(deadline)).await {
        plan.broken(format!("the job could not be enqueued: {error}"));
        return;
    }
    let runs = Arc::new(Mutex::new(Runs::default()));
    let handler = Handler {
        plan: plan.clone(),
        runs: Arc::clone(&runs),
        poison,
        poison_queue: poison_queue.clone(),
    };
    let poison_q: Arc<dyn MessageQueue> = Arc::new(poison_queue.clone());
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for (lane, queue) in [(Lane::Spot, &spot), (Lane::Regular, &regular)] {
        let consumer = match Consumer::new(Arc::clone(queue), Arc::clone(&poison_q), config()) {
            Ok(consumer) => consumer
                .with_clock(Arc::clone(&clock))
                .with_checkpoints(Arc::clone(&store))
                .with_lanes(lanes(lane)),
            Err(error) => {
                plan.broken(format!("no consumer: {error}"));
                return;
            }
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        workers.push((
            consumer.clone(),
            tokio::spawn(async move { consumer.run(handler, shutdown).await }),
        ));
    }
    let keeper = LaneKeeper::new(
        lanes(Lane::Spot),
        Arc::clone(&store),
        leases,
        MessageEncoding::Text,
        Arc::new(|_: &[u8]| Some(JOB.to_owned())),
        KEEPER_HOLD,
    );
    let started = tokio::time::Instant::now();
    while started.elapsed() < RUN_FOR {
        // The keeper's pass, stopped at a random point one time in five.
        let stop_after = Duration::from_millis(plan.pick(0..30_000));
        let pass = keeper.pass();
        if plan.chance(20) {
            if tokio::time::timeout(stop_after, pass).await.is_err() {
                plan.note(format!("the keeper stops mid-pass after {stop_after:?}"));
            }
        } else if let Err(error) = pass.await {
            plan.note(format!("the keeper's pass failed: {error}"));
        }
        tokio::time::sleep(Duration::from_millis(plan.pick(1_000..10_000))).await;
    }
    shutdown.cancel();
    let mut failed = 0;
    for (consumer, task) in workers {
        let _ = tokio::time::timeout(Duration::from_secs(120), task).await;
        let stats = consumer.stats();
        failed += stats.poisoned + stats.retried;
    }
    // Records of one message share its id: a record sent again because
    // the answer to its send, or the note that it was sent, was lost is
    // the same poisoning (the poison queue's reader drops it by that id).
    let records = poison_queue.messages();
    let poisoned_messages: BTreeSet<String> = records
        .iter()
        .map(
            |stored| match PoisonRecord::from_message_text(&stored.body) {
                Ok(record) => format!("{}/{}", record.queue, record.original_id),
                Err(error) => {
                    plan.broken(format!("a poison record does not read: {error}"));
                    String::new()
                }
            },
        )
        .collect();
    let poisoned_for_good = poisoned_messages.len();
    if records.len() > poisoned_for_good {
        plan.note(format!(
            "{} poison records of {poisoned_for_good} message(s)",
            records.len()
        ));
    }
    if poison == Poison::Never && !records.is_empty() {
        plan.broken(format!(
            "(e) the job never failed, yet {} poison record(s) were written",
            records.len()
        ));
    }
    if poison == Poison::FirstRun && poisoned_for_good > 1 {
        plan.broken(format!(
            "(d) {poisoned_for_good} messages of the job were poisoned ({poisoned_messages:?}): it ran again after it was poisoned"
        ));
    }
    plan.note(format!(
        "the end: {failed} runs counted as failed or retried"
    ));
}
