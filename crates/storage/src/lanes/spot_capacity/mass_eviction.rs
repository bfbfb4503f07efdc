//! A whole Spot pool evicted at once (issue 37, item 7): a thousand
//! workers note their eviction within one second against a store that
//! answers each call after 20 ms (tokio's paused clock: simulated time,
//! exact and the same however slow the machine). The outage is in the
//! fleet's document within five seconds of the first notice, and every
//! eviction is noted.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{FleetSpotCapacity, SpotSightings};
use crate::checkpoint::{Checkpoint, CheckpointStore};
use crate::memory::{DelayedCheckpointStore, InMemoryCheckpointStore};

const WORKERS: usize = 1000;
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

#[tokio::test(start_paused = true)]
async fn a_thousand_workers_evicted_within_a_second_record_the_outage_within_five_seconds() {
    let memory = Arc::new(InMemoryCheckpointStore::new());
    let store: Arc<dyn CheckpointStore> = Arc::new(DelayedCheckpointStore::new(
        Arc::clone(&memory) as Arc<dyn CheckpointStore>,
        LATENCY,
    ));
    let fleet = FleetSpotCapacity::new(store);
    let names: Vec<String> = (0..WORKERS).map(|i| format!("spot-{i:04}")).collect();
    // The pool runs: each worker said so once in the last recheck.
    let mut said = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let (fleet, name) = (fleet.clone(), name.clone());
        let offset = RECHECK.mul_f64(i as f64 / WORKERS as f64);
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
    // The whole pool evicted within one second.
    let first_notice = Instant::now();
    let mut evictions = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let (fleet, name) = (fleet.clone(), name.clone());
        let offset = Duration::from_secs(1).mul_f64(i as f64 / WORKERS as f64);
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
    let recorded = watcher.await.expect("no panic");
    assert!(
        failed.is_empty(),
        "{} of {WORKERS} evictions not noted: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(
        recorded.is_some_and(|after| after <= Duration::from_secs(5)),
        "the outage in the fleet's document {recorded:?} after the first notice"
    );
    let after = fleet.read().await.expect("read");
    let running: Vec<_> = after.workers.keys().collect();
    assert!(
        running.is_empty(),
        "evicted workers still running: {running:?}"
    );
    assert!(!after.history.is_there(), "{:?}", after.history);
    assert!(!after.there(SystemTime::now(), FRESH_FOR));
}
