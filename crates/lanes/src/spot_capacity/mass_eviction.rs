//! A whole Spot pool evicted at once (issue 37, item 7): workers note
//! their eviction within one second against a store that answers each call
//! after 20 ms (tokio's paused clock: simulated time, exact and the same
//! however slow the machine). With a thousand, the outage is in the
//! fleet's document within five seconds of the first notice and every
//! eviction's note is stored; and a note costs the same number of writes
//! whatever the size of the fleet.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::notes::{Note, NoteKind};
use super::{FleetSpotCapacity, NOTES_PREFIX, SpotSightings};
use spot_worker_storage::memory::{DelayedCheckpointStore, InMemoryCheckpointStore};
use spot_worker_storage::{Checkpoint, CheckpointStore};

const LATENCY: Duration = Duration::from_millis(20);
const RECHECK: Duration = Duration::from_secs(60);
const FRESH_FOR: Duration = Duration::from_secs(180);

/// The fleet's document as stored, read past the latency.
fn stored(memory: &InMemoryCheckpointStore) -> SpotSightings {
    match memory.get(FleetSpotCapacity::KEY) {
        Some(Checkpoint::InProgress { progress }) => {
            serde_json::from_value(progress).expect("the fleet's document parses")
        }
        _ => SpotSightings::default(),
    }
}

/// What one mass eviction did.
struct Evicted {
    /// The store as it stands after it.
    memory: Arc<InMemoryCheckpointStore>,
    /// The workers' names.
    names: Vec<String>,
    /// Writes (refused ones included) and deletes during the evictions.
    writes: u64,
    /// Notes that failed, with the first error.
    failed: Vec<String>,
    /// When the fleet's document said Spot was gone, after the first
    /// notice (`None`: not within a simulated minute).
    recorded: Option<Duration>,
    /// The view a reader has afterwards.
    after: SpotSightings,
}

/// A pool of `workers` Spot workers, each heard from within the last
/// recheck, all evicted within one second.
async fn evict_a_pool(workers: usize) -> Evicted {
    let memory = Arc::new(InMemoryCheckpointStore::new());
    let store = Arc::new(DelayedCheckpointStore::new(
        Arc::clone(&memory) as Arc<dyn CheckpointStore>,
        LATENCY,
    ));
    let fleet = FleetSpotCapacity::new(Arc::clone(&store) as Arc<dyn CheckpointStore>);
    let names: Vec<String> = (0..workers).map(|i| format!("spot-{i:05}")).collect();
    // The pool runs: each worker said so once in the last recheck.
    let mut said = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let (fleet, name) = (fleet.clone(), name.clone());
        let offset = RECHECK.mul_f64(i as f64 / workers as f64);
        said.spawn(async move {
            tokio::time::sleep(offset).await;
            fleet.heard(&name, RECHECK).await
        });
    }
    while let Some(heard) = said.join_next().await {
        heard.expect("no panic").expect("a word is noted");
    }
    let before = fleet.read().await.expect("read");
    assert!(before.history.is_there(), "{:?}", before.history);
    assert_eq!(before.workers.len(), workers, "every word is read");
    let writes_before = store.writes() + store.deletes();
    // The whole pool evicted within one second.
    let first_notice = Instant::now();
    let mut evictions = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let (fleet, name) = (fleet.clone(), name.clone());
        let offset = Duration::from_secs(1).mul_f64(i as f64 / workers as f64);
        evictions.spawn(async move {
            tokio::time::sleep(offset).await;
            fleet.lost(Some(&name), SystemTime::now(), FRESH_FOR).await
        });
    }
    // Watch the fleet's document until it says Spot is gone (bounded: a
    // minute of simulated time).
    let watcher = tokio::spawn({
        let memory = Arc::clone(&memory);
        async move {
            for _ in 0..6000 {
                if stored(&memory).history.current().is_some_and(|c| !c.there) {
                    return Some(first_notice.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        }
    });
    let mut failed = Vec::new();
    while let Some(noted) = evictions.join_next().await {
        if let Err(error) = noted.expect("no panic") {
            failed.push(error.to_string());
        }
    }
    let writes = store.writes() + store.deletes() - writes_before;
    let recorded = watcher.await.expect("no panic");
    let after = fleet.read().await.expect("read");
    Evicted {
        memory,
        names,
        writes,
        failed,
        recorded,
        after,
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_workers_evicted_within_a_second_record_the_outage_within_five_seconds() {
    let workers = 1000;
    let evicted = evict_a_pool(workers).await;
    assert!(
        evicted.failed.is_empty(),
        "{} of {workers} evictions not noted: {:?}",
        evicted.failed.len(),
        evicted.failed.first()
    );
    assert!(
        evicted
            .recorded
            .is_some_and(|after| after <= Duration::from_secs(5)),
        "the outage in the fleet's document {:?} after the first notice",
        evicted.recorded
    );
    // Every note stored, each worker's own.
    let noted: Vec<Note> = evicted
        .memory
        .keys()
        .iter()
        .filter(|key| key.starts_with(NOTES_PREFIX))
        .filter_map(|key| Note::parse(key))
        .filter(|note| note.kind == NoteKind::Evicted)
        .collect();
    let mut workers_noted: Vec<&str> = noted.iter().map(|note| note.worker.as_str()).collect();
    workers_noted.sort_unstable();
    assert_eq!(workers_noted, evicted.names);
    assert_eq!(evicted.after.evicted.len(), workers, "every eviction read");
    let running: Vec<_> = evicted
        .after
        .workers
        .iter()
        .filter(|(worker, heard)| {
            evicted
                .after
                .evicted
                .get(*worker)
                .is_none_or(|at| at < heard)
        })
        .collect();
    assert!(
        running.is_empty(),
        "evicted workers still running: {running:?}"
    );
    assert!(
        !evicted.after.history.is_there(),
        "{:?}",
        evicted.after.history
    );
    assert!(!evicted.after.there(SystemTime::now(), FRESH_FOR));
}

/// The write load of a mass eviction stays flat as the fleet grows: the
/// same writes per worker (one note, and a share of the one outage
/// written) for a pool of 100 and of 1,000. Counts, not timings.
#[tokio::test(start_paused = true)]
async fn a_notes_writes_do_not_grow_with_the_fleet() {
    let mut per_worker = Vec::new();
    for workers in [100, 1000] {
        let evicted = evict_a_pool(workers).await;
        assert!(evicted.failed.is_empty(), "{:?}", evicted.failed.first());
        per_worker.push(evicted.writes as f64 / workers as f64);
    }
    let [small, large] = per_worker[..] else {
        unreachable!("two fleets")
    };
    assert!(small >= 1.0, "each eviction is noted: {small}");
    assert!(
        large <= 1.2 && large <= small + 0.05,
        "writes per worker grow with the fleet: {small:.2} for 100, {large:.2} for 1,000"
    );
}
