//! Two lanes end to end (docs/deploying.md, "The two lanes"): real `spot-worker run` workers on
//! emulated VMs against Azurite, configured only through the environment,
//! durations scaled down through real settings (seconds, not hours). A
//! Spot pool of three VMs, evicted again and again (a Preempt notice, then a
//! replacement VM later), and a regular pool scaled from zero as the
//! deployment's autoscale rules do (docs/deploying.md, "Who keeps the lanes"):
//! on its own queue, and, while no Spot VM runs, by one VM that keeps the
//! lanes. Three jobs, enqueued with `spot-worker enqueue`, each taken by a
//! Spot VM at once:
//!
//! - `tight`: 8 s of work due in 40 s. Once it has run 1.5 s, every Spot VM
//!   is reclaimed at once and Spot capacity stays away 12 s: the job waits,
//!   falls behind its line, and the lane keeper (on the regular VM woken
//!   for it) moves it to the regular lane, where it finishes by its
//!   deadline (back on Spot if it got ahead of its line by two switches,
//!   evicted again there);
//! - `roomy`: 4 s of work due in 300 s, evicted with the rest and twice
//!   more: it stays on Spot;
//! - `plain`: no deadline, evicted the same: it behaves as without lanes.

mod fleet;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fleet::{Fleet, REGULAR_QUEUE, SPOT_QUEUE, Vm};
use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_consumer::CompletionRecord;
use spot_worker_decisions::lanes::Lane;
use spot_worker_decisions::lanes::unix_secs;
use spot_worker_lanes::{FleetSpotCapacity, LaneRecords};
use spot_worker_storage::{CheckpointStore as _, MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;

/// The whole run's bound: generous for a busy machine, finite for a bug.
const RUN_LIMIT: Duration = Duration::from_secs(240);
/// How long a Spot VM is gone after an eviction.
const SPOT_CAPACITY_BACK: Duration = Duration::from_secs(5);
/// How long all Spot capacity is gone after the reclaim.
const SPOT_RECLAIM: Duration = Duration::from_secs(12);
/// How long the regular pool takes to scale out from zero.
const REGULAR_BOOT: Duration = Duration::from_secs(2);
/// How long no Spot VM runs before the regular pool wakes one VM to keep
/// the lanes (the deployment's "keeper wake" rule).
const KEEPER_WAKE: Duration = Duration::from_secs(2);
/// How long the regular queue stays empty before the pool scales in.
const REGULAR_IDLE: Duration = Duration::from_secs(5);

const TIGHT: &str = r#"{"job_id":"tight","steps":32}"#;
const ROOMY: &str = r#"{"job_id":"roomy","steps":16}"#;
const PLAIN: &str = r#"{"job_id":"plain","steps":16}"#;

struct World {
    _azurite: Azurite,
    storage: AzureStorage,
    _dir: tempfile::TempDir,
    fleet: std::sync::Arc<Fleet>,
}

/// `spot-worker enqueue` of `body`, with `args`, as the operator runs it.
async fn enqueue(world: &World, body: &str, args: &[&str]) {
    let file = world.fleet.dir.join("job.jsonl");
    std::fs::write(&file, format!("{body}\n")).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_spot-worker"))
        .arg("enqueue")
        .args(args)
        .arg(&file)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            &world.fleet.connection_string,
        )
        .env("SPOT_WORKER_QUEUE", SPOT_QUEUE)
        .env("SPOT_WORKER_REGULAR_QUEUE", REGULAR_QUEUE)
        .env("SPOT_WORKER_SWITCH_COST", "2s")
        .env("SPOT_WORKER_LANE_KEEPER_EVERY", "1s")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every job's result, and nothing left in either lane's queue.
async fn done(world: &World) -> bool {
    let results = world.storage.result_store("results").unwrap();
    for job in ["tight", "roomy", "plain"] {
        if !matches!(results.get(job).await, Ok(Some(_))) {
            return false;
        }
    }
    for queue in [SPOT_QUEUE, REGULAR_QUEUE] {
        let count = world
            .storage
            .queue(queue)
            .unwrap()
            .approximate_message_count()
            .await;
        if !matches!(count, Ok(0)) {
            return false;
        }
    }
    true
}

/// The Spot pool (three slots, each a VM or the time its replacement
/// comes) and the regular pool (at most one VM, scaled from zero).
struct Pools {
    spot: Vec<(Option<Vm>, Instant)>,
    /// Since when no Spot VM runs.
    no_spot_since: Option<Instant>,
    regular: Option<Vm>,
    regular_boot_at: Option<Instant>,
    regular_idle_since: Option<Instant>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Pools {
    /// The slot of the Spot VM named `vm`, if it runs.
    fn spot_slot(&self, vm: &str) -> Option<usize> {
        self.spot
            .iter()
            .position(|(slot, _)| slot.as_ref().is_some_and(|v| v.name == vm))
    }

    /// Evicts the Spot VM in `slot`; its replacement comes `back` later.
    fn evict(&mut self, slot: usize, back: Duration, fleet: &std::sync::Arc<Fleet>) {
        if let Some(vm) = self.spot[slot].0.take() {
            self.spot[slot].1 = Instant::now() + back;
            let fleet = std::sync::Arc::clone(fleet);
            self.tasks
                .push(tokio::spawn(async move { fleet.preempt(vm).await }));
        }
    }

    /// The regular pool's autoscale: out on its queue, or by one VM while
    /// no Spot VM runs; in once its queue stayed empty and Spot runs.
    async fn scale_regular(&mut self, waiting: u64, fleet: &std::sync::Arc<Fleet>) {
        let spot_runs = self.spot.iter().any(|(vm, _)| vm.is_some());
        self.no_spot_since = if spot_runs {
            None
        } else {
            Some(self.no_spot_since.unwrap_or_else(Instant::now))
        };
        let keeper_wake = self
            .no_spot_since
            .is_some_and(|since| since.elapsed() >= KEEPER_WAKE);
        if self.regular.is_none() {
            if waiting > 0 || keeper_wake {
                let at = *self
                    .regular_boot_at
                    .get_or_insert(Instant::now() + REGULAR_BOOT);
                if Instant::now() >= at {
                    self.regular = Some(fleet.boot(true).await);
                    self.regular_boot_at = None;
                }
            }
            return;
        }
        if waiting > 0 || keeper_wake {
            self.regular_idle_since = None;
            return;
        }
        let idle = *self.regular_idle_since.get_or_insert_with(Instant::now);
        if idle.elapsed() >= REGULAR_IDLE
            && let Some(vm) = self.regular.take()
        {
            let fleet = std::sync::Arc::clone(fleet);
            self.tasks
                .push(tokio::spawn(async move { fleet.stop(vm).await }));
            self.regular_idle_since = None;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_fall_back_to_the_regular_lane_only_when_their_deadline_needs_it() {
    let azurite = crate::support::azurite_from(Azurite::start).await;
    let config = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
    let storage = AzureStorage::new(config).unwrap();
    // The deployment creates both lanes' queues.
    for queue in [SPOT_QUEUE, REGULAR_QUEUE] {
        storage.queue(queue).unwrap().prepare().await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(azurite.connection_string(), dir.path());
    let world = World {
        _azurite: azurite,
        storage,
        _dir: dir,
        fleet,
    };
    let fleet = &world.fleet;

    let now = Instant::now();
    let mut spot = Vec::new();
    for _ in 0..3 {
        spot.push((Some(fleet.boot(false).await), now));
    }
    let mut pools = Pools {
        spot,
        no_spot_since: None,
        regular: None,
        regular_boot_at: None,
        regular_idle_since: None,
        tasks: Vec::new(),
    };
    // The jobs go in once every Spot VM takes work: the pool is up, as
    // when jobs arrive at a running fleet. Before that, a job waiting for
    // a VM still warming up is behind its line too, and the lane keeper on
    // the first VM ready may rightly move it.
    let warming = Instant::now();
    while fleet.logged(&["warmup gate open; taking work"]).len() < 3 {
        assert!(
            warming.elapsed() < RUN_LIMIT,
            "the Spot VMs never opened their warmup gates\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    enqueue(&world, TIGHT, &["--deadline", "40s", "--work", "8s"]).await;
    enqueue(&world, ROOMY, &["--deadline", "300s", "--work", "4s"]).await;
    enqueue(&world, PLAIN, &[]).await;
    let started = Instant::now();

    // When each job's current holder took it, and how often the others were
    // evicted.
    let mut held_since: HashMap<&str, (String, Instant)> = HashMap::new();
    let mut other_evictions: HashMap<&str, u32> = HashMap::new();
    let mut next_other_eviction = started;
    let mut reclaimed = false;
    let mut tight_on_regular_at = None;
    let regular_queue = world.storage.queue(REGULAR_QUEUE).unwrap();
    while !done(&world).await {
        assert!(
            started.elapsed() < RUN_LIMIT,
            "not done within {RUN_LIMIT:?}\n{}",
            fleet.logs()
        );
        for job in ["tight", "roomy", "plain"] {
            if let Some((vm, _)) = fleet.holder(job)
                && held_since.get(job).is_none_or(|(held, _)| *held != vm)
            {
                held_since.insert(job, (vm, Instant::now()));
            }
        }
        // Once `tight` has run 1.5 s on Spot, all Spot capacity is
        // reclaimed at once; later, the Spot VM holding it is evicted each
        // time it has held it 1.5 s.
        if let Some((vm, since)) = held_since.get("tight") {
            if vm.starts_with("regularvmss") {
                tight_on_regular_at.get_or_insert_with(|| started.elapsed());
            } else if since.elapsed() >= Duration::from_millis(1500)
                && let Some(slot) = pools.spot_slot(vm)
            {
                if reclaimed {
                    pools.evict(slot, SPOT_CAPACITY_BACK, fleet);
                } else {
                    for slot in 0..pools.spot.len() {
                        pools.evict(slot, SPOT_RECLAIM, fleet);
                    }
                    reclaimed = true;
                    next_other_eviction = Instant::now() + SPOT_RECLAIM;
                }
            }
        }
        // The others are evicted twice more each once Spot is back, one
        // every 4 s.
        if reclaimed && Instant::now() >= next_other_eviction {
            for job in ["roomy", "plain"] {
                let evicted = other_evictions.entry(job).or_insert(0);
                if *evicted < 2
                    && let Some((vm, since)) = held_since.get(job)
                    && since.elapsed() >= Duration::from_millis(500)
                    && let Some(slot) = pools.spot_slot(vm)
                {
                    pools.evict(slot, SPOT_CAPACITY_BACK, fleet);
                    *evicted += 1;
                    next_other_eviction = Instant::now() + Duration::from_secs(4);
                    break;
                }
            }
        }
        // Spot capacity comes back.
        for slot in 0..pools.spot.len() {
            if pools.spot[slot].0.is_none() && Instant::now() >= pools.spot[slot].1 {
                pools.spot[slot].0 = Some(fleet.boot(false).await);
            }
        }
        let waiting = regular_queue.approximate_message_count().await.unwrap_or(0);
        pools.scale_regular(waiting, fleet).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let run_took = started.elapsed();

    // The end of the run: every VM drains and exits 0.
    for (slot, _) in pools.spot.iter_mut() {
        if let Some(vm) = slot.take() {
            fleet.stop(vm).await;
        }
    }
    if let Some(vm) = pools.regular.take() {
        fleet.stop(vm).await;
    }
    for task in pools.tasks {
        task.await.unwrap();
    }
    let ended = fleet.ended.lock().unwrap().clone();
    let failed: Vec<_> = ended.iter().filter(|e| e.exit_code != Some(0)).collect();
    assert!(
        failed.is_empty(),
        "workers that did not exit 0: {failed:?}\n{}",
        fleet.logs()
    );
    let preempted = ended.iter().filter(|e| e.preempted).count();
    assert!(
        preempted >= 4,
        "Spot VMs evicted again and again: {preempted}"
    );
    eprintln!(
        "lanes e2e: done in {run_took:?}; tight on regular capacity after {tight_on_regular_at:?}; {preempted} Spot evictions; {} VMs",
        ended.len()
    );

    // Every job's result is its body, exactly.
    let results = world.storage.result_store("results").unwrap();
    for (job, body) in [("tight", TIGHT), ("roomy", ROOMY), ("plain", PLAIN)] {
        let result = results.get(job).await.unwrap().unwrap();
        assert_eq!(String::from_utf8(result).unwrap(), body, "{job}");
    }
    for queue in [SPOT_QUEUE, REGULAR_QUEUE] {
        let poison = world.storage.poison_queue(queue).unwrap();
        assert_eq!(
            poison.peek(32).await.unwrap_or_default().len(),
            0,
            "{queue}'s poison"
        );
    }

    let checkpoints = world.storage.checkpoint_store("checkpoints").unwrap();
    let record = |job: &'static str| {
        let checkpoints = checkpoints.clone();
        async move {
            let stored = checkpoints
                .read(&CompletionRecord::key(job))
                .await
                .unwrap()?;
            Some(CompletionRecord::from_checkpoint(&stored.checkpoint, job).unwrap())
        }
    };
    // `tight` fell behind, moved to the regular lane (and back to Spot if
    // it got ahead of its line by two switches there), and finished in
    // time; its record shows its hours in both lanes.
    let tight = record("tight").await.expect("tight's completion record");
    let tight_outcome = tight.deadline.clone().expect("tight's deadline");
    assert!(tight_outcome.met, "{tight:?}\n{}", fleet.logs());
    assert!(tight_outcome.moves >= 1, "{tight:?}");
    // While no Spot VM ran, the keeper that moved it ran on the regular VM
    // woken for it.
    let keepers = fleet.logged(&[
        "lane keeper: moved to the regular lane",
        "\"job\":\"tight\"",
    ]);
    assert!(
        keepers.iter().any(|vm| vm.starts_with("regularvmss")),
        "moved by {keepers:?}\n{}",
        fleet.logs()
    );
    assert!(
        tight.goodput.regular_ms > 0 && tight.goodput.spot_ms() > 0,
        "{tight:?}"
    );
    assert!(tight_on_regular_at.is_some());
    // `roomy` stayed on Spot, evicted or not.
    let roomy = record("roomy").await.expect("roomy's completion record");
    let outcome = roomy.deadline.as_ref().expect("roomy's deadline");
    assert!(
        outcome.met && outcome.moves == 0 && outcome.lane == Lane::Spot,
        "{roomy:?}\n{}",
        fleet.logs()
    );
    assert_eq!(roomy.goodput.regular_ms, 0, "{roomy:?}");
    // `plain`, without a deadline, never touched the lanes.
    let records = LaneRecords::new(std::sync::Arc::new(checkpoints.clone()));
    assert_eq!(records.read("plain").await.unwrap(), None);
    if let Some(plain) = record("plain").await {
        assert!(
            plain.deadline.is_none() && plain.goodput.regular_ms == 0,
            "{plain:?}"
        );
    }
    // The fleet saw the reclaim: Spot capacity gone from the notices until
    // a replacement Spot VM said it ran, at least as long as it was away.
    let sightings = FleetSpotCapacity::new(std::sync::Arc::new(checkpoints.clone()))
        .read()
        .await
        .unwrap();
    let now = unix_secs(std::time::SystemTime::now());
    let longest = sightings.history.outages(now).last().copied();
    assert!(
        longest.is_some_and(|outage| outage >= SPOT_RECLAIM.as_secs_f64() - 1.0),
        "the reclaim in the fleet's Spot sightings: {sightings:?}\n{}",
        fleet.logs()
    );
    let tight_lane = records.read("tight").await.unwrap().unwrap();
    assert!(tight_lane.finished, "{tight_lane:?}");
    assert_eq!(tight_lane.generation, tight_outcome.moves, "{tight_lane:?}");
    eprintln!(
        "lanes e2e: tight {:.1} s on Spot, {:.1} s on regular capacity, {} move(s), finished in the {} lane; roomy {:.1} s on Spot in {} deliveries",
        tight.goodput.spot_ms() as f64 / 1000.0,
        tight.goodput.regular_ms as f64 / 1000.0,
        tight_outcome.moves,
        tight_outcome.lane.as_str(),
        roomy.goodput.spot_ms() as f64 / 1000.0,
        roomy.goodput.deliveries,
    );
}
