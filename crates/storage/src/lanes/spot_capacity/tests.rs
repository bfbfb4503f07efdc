//! The fleet's Spot sightings: the decisions on the document, and the
//! document under concurrent workers.

use super::*;
use crate::memory::InMemoryCheckpointStore;

const MINUTE: Duration = Duration::from_secs(60);

fn at(secs: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs)
}

#[test]
fn spot_is_there_while_a_worker_was_heard_from_lately() {
    let t = 1_800_000_000.0;
    let none = SpotSightings::default();
    assert!(!none.there(at(t), 3 * MINUTE));
    let heard = none
        .heard("a", t, MINUTE)
        .expect("the first word is written");
    assert!(heard.there(at(t + 120.0), 3 * MINUTE));
    assert!(
        !heard.there(at(t + 181.0), 3 * MINUTE),
        "stale after three rechecks"
    );
    // Said again within half a recheck: nothing to write.
    assert_eq!(heard.heard("a", t + 20.0, MINUTE), None);
    let again = heard
        .heard("a", t + 40.0, MINUTE)
        .expect("half a recheck on");
    assert_eq!(again.heard_at, Some(t + 40.0));
    // Its eviction: gone, whatever the last word's age.
    let lost = again
        .lost(Some("a"), t + 50.0, 3 * MINUTE)
        .expect("an eviction is written");
    assert!(!lost.there(at(t + 51.0), 3 * MINUTE));
    assert_eq!(
        lost.lost(None, t + 60.0, 3 * MINUTE),
        None,
        "known gone already"
    );
    assert_eq!(lost.history.outage_age(t + 110.0), 60.0);
    // A word older than a worker heard since is stale.
    let back = lost.heard("b", t + 200.0, MINUTE).expect("back");
    assert_eq!(back.lost(None, t + 150.0, 3 * MINUTE), None);
    assert_eq!(back.history.outages(t + 200.0), vec![150.0]);
    // One VM of a pool evicted while another runs: not an outage, but the
    // evicted one is forgotten.
    let two = back.heard("c", t + 210.0, MINUTE).expect("c");
    let one = two
        .lost(Some("b"), t + 220.0, 3 * MINUTE)
        .expect("b forgotten");
    assert!(one.history.is_there());
    assert_eq!(one.workers.keys().collect::<Vec<_>>(), ["c"]);
    let none_left = one
        .lost(Some("c"), t + 230.0, 3 * MINUTE)
        .expect("c was the last");
    assert!(!none_left.history.is_there());
}

#[test]
fn one_probe_per_period() {
    let t = 1_800_000_000.0;
    let every = 5 * MINUTE;
    let sent = SpotSightings::default()
        .probe(t, every)
        .expect("none sent yet");
    // Waiting for a taker: not again until it may be lost (an hour).
    assert_eq!(sent.probe(t + 300.0, every), None);
    assert_eq!(sent.probe(t + 3599.0, every), None);
    assert!(sent.probe(t + 3600.0, every).is_some());
    // Taken at once: not again within the period, then again.
    let taken = sent.took_probe("a", t + 10.0);
    assert!(taken.there(at(t + 11.0), 3 * MINUTE));
    assert_eq!(taken.probe(t + 299.0, every), None);
    assert!(taken.probe(t + 300.0, every).is_some());
}

#[tokio::test]
async fn workers_share_the_sightings_and_one_claims_each_probe() {
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let fleet = FleetSpotCapacity::new(Arc::clone(&store));
    let view = SpotCapacity::new(fleet.clone(), MINUTE);
    assert!(!view.there());
    view.set(fleet.heard(view.worker(), MINUTE).await.unwrap());
    assert!(view.there());
    view.evicted(SystemTime::now()).await.unwrap();
    assert!(!view.there());
    // Five regular workers want a probe at once: one sends it.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let fleet = fleet.clone();
        tasks.spawn(async move { fleet.claim_probe(5 * MINUTE).await });
    }
    let mut claimed = 0;
    while let Some(claim) = tasks.join_next().await {
        claimed += usize::from(claim.unwrap().unwrap());
    }
    assert_eq!(claimed, 1);
    assert!(fleet.read().await.unwrap().probe_sent_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_spot_worker_says_it_runs_every_recheck() {
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let fleet = FleetSpotCapacity::new(store);
    let spot = Arc::new(SpotCapacity::new(fleet.clone(), MINUTE));
    let regular = Arc::new(SpotCapacity::new(fleet.clone(), MINUTE));
    let stop = CancellationToken::new();
    let tasks = [
        tokio::spawn({
            let (spot, stop) = (Arc::clone(&spot), stop.clone());
            async move { spot.keep(true, stop).await }
        }),
        tokio::spawn({
            let (regular, stop) = (Arc::clone(&regular), stop.clone());
            async move { regular.keep(false, stop).await }
        }),
    ];
    tokio::time::sleep(MINUTE + Duration::from_secs(1)).await;
    assert!(spot.there());
    assert!(
        regular.there(),
        "the regular worker read the Spot worker's word"
    );
    stop.cancel();
    for task in tasks {
        task.await.unwrap();
    }
}
