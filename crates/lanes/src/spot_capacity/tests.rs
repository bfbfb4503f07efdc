//! The fleet's Spot sightings: the decisions on the document, and the
//! document under concurrent workers.

use super::*;
use std::collections::BTreeMap;
use std::sync::Arc;

use spot_worker_decisions::lanes::unix_secs;

use spot_worker_storage::CheckpointStore;
use spot_worker_storage::memory::InMemoryCheckpointStore;

const MINUTE: Duration = Duration::from_secs(60);

fn at(secs: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs)
}

/// The fleet's sightings after `records` were written, merged at `now`.
fn seen(records: &[SpotSightings], now: f64) -> SpotSightings {
    SpotSightings::merge(records.iter().cloned()).seen_at(now, 180.0)
}

/// A shard in which `workers` said they run at `at`.
fn running(workers: &[&str], at: f64) -> SpotSightings {
    workers
        .iter()
        .fold(SpotSightings::default(), |shard, worker| {
            shard
                .heard_in_shard(worker, at, MINUTE)
                .expect("a new word is written")
        })
}

#[test]
fn spot_is_there_while_a_worker_was_heard_from_lately() {
    let t = 1_800_000_000.0;
    assert!(!SpotSightings::default().there(at(t), 3 * MINUTE));
    let shard = running(&["a"], t);
    let fleet = seen(std::slice::from_ref(&shard), t);
    assert!(fleet.there(at(t + 120.0), 3 * MINUTE));
    assert!(
        !fleet.there(at(t + 181.0), 3 * MINUTE),
        "stale after three rechecks"
    );
    // Said again within half a recheck: nothing to write.
    assert_eq!(shard.heard_in_shard("a", t + 20.0, MINUTE), None);
    let again = shard
        .heard_in_shard("a", t + 40.0, MINUTE)
        .expect("half a recheck on");
    assert_eq!(again.heard_at, Some(t + 40.0));
}

#[test]
fn the_last_worker_evicted_is_an_outage_one_of_many_is_not() {
    let t = 1_800_000_000.0;
    // Two of a pool of ten evicted: VMs taken back, not an outage.
    let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let pool = running(&names, t);
    let two = pool
        .evicted_in_shard("w0", t + 10.0)
        .and_then(|s| s.evicted_in_shard("w1", t + 11.0))
        .expect("written");
    assert_eq!(two.evicted_in_shard("w1", t + 11.0), None, "noted already");
    let fleet = seen(&[two], t + 12.0);
    assert!(fleet.history.is_there(), "{:?}", fleet.history);
    assert_eq!(fleet.workers.len(), 8);
    // The last one of a pool evicted: gone since its notice.
    let alone = running(&["a"], t);
    let fleet = seen(
        &[alone.evicted_in_shard("a", t + 50.0).expect("written")],
        t + 51.0,
    );
    assert!(!fleet.there(at(t + 51.0), 3 * MINUTE));
    assert_eq!(fleet.history.outage_age(t + 110.0), 60.0);
}

#[test]
fn a_mass_eviction_is_an_outage_at_once_from_its_first_notice() {
    let t = 1_800_000_000.0;
    let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    let shards: Vec<SpotSightings> = names
        .iter()
        .map(|name| running(&[name.as_str()], t))
        .collect();
    let mut document = SpotSightings::default();
    document.history.see(true, t - 3600.0);
    // Six of ten evicted within two seconds, each in its own shard; four
    // still heard from a moment ago.
    let mut records = vec![document];
    for (i, shard) in shards.iter().enumerate() {
        records.push(match i {
            0..6 => shard
                .evicted_in_shard(&names[i], t + 30.0 + i as f64 * 0.3)
                .expect("written"),
            _ => shard.clone(),
        });
    }
    let fleet = seen(&records, t + 32.0);
    assert!(!fleet.history.is_there(), "{:?}", fleet.history);
    assert_eq!(fleet.history.outage_age(t + 40.0), 10.0, "since the first");
    // Four of ten: under half, not an outage.
    records[5] = shards[4].clone();
    records[6] = shards[5].clone();
    let fleet = seen(&records, t + 32.0);
    assert!(fleet.history.is_there(), "{:?}", fleet.history);
    // Any order, any record read twice: the same view.
    let mut shuffled = records.clone();
    shuffled.reverse();
    shuffled.push(records[3].clone());
    assert_eq!(seen(&shuffled, t + 32.0), seen(&records, t + 32.0));
}

#[test]
fn spot_is_back_when_a_worker_runs_after_the_outage_and_its_evictions_aged() {
    let t = 1_800_000_000.0;
    let mut document = SpotSightings::default();
    document.history.see(true, t - 3600.0);
    document.history.see(false, t);
    // Three survivors of a mass eviction of seven, heard from after it.
    let evicted: Vec<SpotSightings> = (0..4)
        .map(|i| {
            let name = format!("e{i}");
            running(&[&name], t - 30.0)
                .evicted_in_shard(&name, t)
                .expect("written")
        })
        .collect();
    let survivors = running(&["s0", "s1", "s2"], t + 60.0);
    let mut records = vec![document.clone(), survivors];
    records.extend(evicted);
    // Within the window the mass eviction holds.
    assert!(!seen(&records, t + 61.0).history.is_there());
    // Once the evictions are older than a word stays fresh, the survivors
    // say Spot is back, since the first word after the outage.
    let later = running(&["s0", "s1", "s2"], t + 200.0);
    records[1] = later;
    let fleet = seen(&records, t + 201.0);
    assert!(fleet.history.is_there(), "{:?}", fleet.history);
    assert_eq!(fleet.history.outages(t + 201.0), vec![200.0]);
    // A document that says nothing of evictions is back at a new word.
    let back = seen(&[document, running(&["n"], t + 90.0)], t + 91.0);
    assert_eq!(back.history.outages(t + 91.0), vec![90.0]);
}

/// A worker of the previous version keeps everything in the fleet's
/// document: its words and the outage it saw are one more record.
#[test]
fn the_previous_versions_document_is_read_as_one_more_record() {
    let t = 1_800_000_000.0;
    let old: SpotSightings = serde_json::from_value(serde_json::json!({
        "history": {"first": t, "ended": [], "current": {"there": true, "since": t}},
        "heard_at": t + 100.0,
        "workers": {"old-worker": t + 100.0},
        "probe_sent_at": null
    }))
    .expect("the previous version's document parses");
    let fleet = seen(
        &[old.clone(), running(&["new-worker"], t + 90.0)],
        t + 101.0,
    );
    assert!(fleet.there(at(t + 101.0), 3 * MINUTE));
    assert_eq!(
        fleet.workers.keys().collect::<Vec<_>>(),
        ["new-worker", "old-worker"]
    );
    assert_eq!(fleet.heard_at, Some(t + 100.0));
    // The old worker forgets itself at its eviction; the new one's
    // eviction in its shard, both within the window: the last two gone.
    let mut forgot = old;
    forgot.workers.clear();
    let evicted = running(&["new-worker"], t + 90.0)
        .evicted_in_shard("new-worker", t + 120.0)
        .expect("written");
    let fleet = seen(&[forgot, evicted], t + 121.0);
    assert!(!fleet.history.is_there(), "{:?}", fleet.history);
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
    let taken = sent.took_probe(t + 10.0);
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

/// Writes `record` under `key` as a worker of the previous version did.
async fn write_record(store: &dyn CheckpointStore, key: &str, record: &SpotSightings) {
    let progress = serde_json::to_value(record).expect("sightings serialise");
    store
        .write(
            key,
            &spot_worker_storage::Checkpoint::InProgress { progress },
            spot_worker_storage::WritePrecondition::Create,
            None,
        )
        .await
        .expect("write");
}

/// Writes the shards workers of the previous version keep: each of
/// `words` heard at its time, and evicted at the second if any.
async fn write_shards(store: &dyn CheckpointStore, words: &[(&str, f64, Option<f64>)]) {
    let mut shards = BTreeMap::<&str, SpotSightings>::new();
    for (worker, heard, evicted) in words {
        let key = FleetSpotCapacity::shard_key_of(worker);
        let shard = shards.entry(key).or_default();
        let mut next = shard
            .heard_in_shard(worker, *heard, Duration::ZERO)
            .expect("a word");
        if let Some(at) = evicted {
            next = next.evicted_in_shard(worker, *at).expect("an eviction");
        }
        *shard = next;
    }
    for (key, shard) in shards {
        store.delete(key).await.expect("delete");
        write_record(store, key, &shard).await;
    }
}

/// A fleet mid-upgrade: old Spot workers write their words and evictions
/// to the shards, new ones to notes of their own. A new reader sees every
/// one of them; the outage judged from both is written for everyone.
#[tokio::test]
async fn a_fleet_mid_upgrade_loses_no_note_of_either_version() {
    let memory = InMemoryCheckpointStore::new();
    let store: Arc<dyn CheckpointStore> = Arc::new(memory.clone());
    let fleet = FleetSpotCapacity::new(Arc::clone(&store));
    let now = unix_secs(SystemTime::now());
    // Two old workers (shards), two new (notes), all running.
    write_shards(
        store.as_ref(),
        &[("old-a", now - 30.0, None), ("old-b", now - 20.0, None)],
    )
    .await;
    for new in ["new-a", "new-b"] {
        fleet.heard(new, MINUTE).await.expect("a word");
    }
    let seen = fleet.read().await.expect("read");
    assert_eq!(
        seen.workers.keys().collect::<Vec<_>>(),
        ["new-a", "new-b", "old-a", "old-b"]
    );
    assert!(seen.history.is_there(), "{:?}", seen.history);
    // The whole pool evicted: the old workers in their shards, the new in
    // their notes; every eviction read, the outage written once.
    let evicted = unix_secs(SystemTime::now());
    write_shards(
        store.as_ref(),
        &[
            ("old-a", now - 30.0, Some(evicted)),
            ("old-b", now - 20.0, Some(evicted)),
        ],
    )
    .await;
    fleet
        .lost(Some("new-a"), SystemTime::now(), 3 * MINUTE)
        .await
        .expect("noted");
    let after = fleet
        .lost(Some("new-b"), SystemTime::now(), 3 * MINUTE)
        .await
        .expect("noted");
    assert_eq!(
        after.evicted.keys().collect::<Vec<_>>(),
        ["new-a", "new-b", "old-a", "old-b"],
        "both versions' evictions"
    );
    assert!(!after.history.is_there(), "{:?}", after.history);
    let Some(spot_worker_storage::Checkpoint::InProgress { progress }) =
        memory.get(FleetSpotCapacity::KEY)
    else {
        panic!("the fleet's document is written");
    };
    let document: SpotSightings = serde_json::from_value(progress).expect("parses");
    assert!(
        !document.history.is_there(),
        "the outage is in the document"
    );
}

/// The records stay few: a word replaces the worker's earlier one, and
/// the first running worker deletes the notes and shards older than
/// [`FORGET_WORKERS_AFTER`], which no reader counts meanwhile.
#[tokio::test]
async fn stale_notes_and_shards_are_ignored_and_cleaned_by_one_worker() {
    let memory = InMemoryCheckpointStore::new();
    let store: Arc<dyn CheckpointStore> = Arc::new(memory.clone());
    let fleet = FleetSpotCapacity::new(Arc::clone(&store));
    let now = unix_secs(SystemTime::now());
    let old = now - FORGET_WORKERS_AFTER.as_secs_f64() - 10.0;
    let gone = [
        notes::Note::new("gone", notes::NoteKind::Heard, old - 60.0),
        notes::Note::new("gone", notes::NoteKind::Evicted, old),
    ];
    for note in &gone {
        write_record(store.as_ref(), &note.key(), &SpotSightings::default()).await;
    }
    let stale_shard = running(&["old-gone"], old);
    write_record(
        store.as_ref(),
        FleetSpotCapacity::shard_key_of("old-gone"),
        &stale_shard,
    )
    .await;
    let seen = fleet.read().await.expect("read");
    assert!(!seen.workers.contains_key("gone"), "stale notes: not read");
    assert!(!seen.evicted.contains_key("gone"), "stale notes: not read");
    assert!(!seen.there(SystemTime::now(), 3 * MINUTE), "{seen:?}");
    // "b" says it runs twice, a recheck apart: one word of its own left.
    fleet.heard("b", Duration::ZERO).await.expect("a word");
    fleet.heard("b", Duration::ZERO).await.expect("a word");
    let notes_of = |worker: &str| -> Vec<String> {
        memory
            .keys()
            .into_iter()
            .filter(|key| key.starts_with(&format!("{NOTES_PREFIX}{worker}/")))
            .collect()
    };
    assert_eq!(notes_of("b").len(), 1, "{:?}", notes_of("b"));
    // "b" is the first running worker: the stale notes and shard are gone.
    assert!(notes_of("gone").is_empty(), "{:?}", notes_of("gone"));
    assert!(
        memory
            .get(FleetSpotCapacity::shard_key_of("old-gone"))
            .is_none()
    );
    // "c" runs too, but is not first: it deletes nothing of others'.
    fleet.heard("c", Duration::ZERO).await.expect("a word");
    assert!(!notes_of("b").is_empty());
}
