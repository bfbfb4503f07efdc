//! A whole Spot pool evicted at once: what noting it costs the fleet's
//! shared documents as the fleet grows (issue 37, item 7).
//!
//! `cargo bench --bench mass_eviction [-- --runs N --fleets 100,1000,5000 --layouts sharded,flat]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a smoke
//! version (one run of a fleet of 100) so it cannot rot unnoticed.
//!
//! Each run: a fleet of N Spot workers, each heard from within the last
//! minute, all get their eviction notice within one second; each notes it
//! against the in-memory checkpoint store answering every call after
//! 20 ms (a listing: 20 ms a page of 5,000 names). Simulated time (tokio's
//! paused clock), so the times are those of the model, exact and the same
//! on any machine; the figures are medians of `--runs` runs (the backoff's
//! jitter differs from run to run).
//!
//! - **baseline**, the layout before issue 37: one ETag-fenced document,
//!   each note a read and rewrite that forgets the worker, 8 attempts with
//!   no wait between them, within the 1 s the worker gave it; the outage
//!   only when no other worker is fresh;
//! - **sharded**, the layout before the flat one (kept here to compare):
//!   each note a read and ETag-fenced rewrite of one of 16 shards picked by
//!   the worker's name, jittered backoff (16 attempts, 20 ms doubling to
//!   2 s), then the 17 documents read and the outage written to the
//!   fleet's document once the evictions say so; within 20 s;
//! - **flat**: [`FleetSpotCapacity`] as it is now: each note a
//!   create-only record of the worker's own, then the prefix listed and
//!   the fleet's document read, the outage written once; within 20 s.
//!
//! Reported: the share of the notes that landed, the store's writes
//! (deletes included) and reads (listing pages included) per worker, and
//! the simulated time from the first notice until the outage is in the
//! fleet's document and until the last note landed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Result, ensure};
use futures_util::future::try_join_all;
use spot_worker::decisions::lanes::unix_secs;
use spot_worker::storage::lanes::{FleetSpotCapacity, NOTES_PREFIX, SpotSightings};
use spot_worker::storage::memory::{DelayedCheckpointStore, InMemoryCheckpointStore};
use spot_worker::storage::{Checkpoint, CheckpointStore, StorageError, WritePrecondition};
use spot_worker_testkit::bench::{self, BenchArgs, median};
use tokio::time::Instant;

/// Every store call's latency.
const LATENCY: Duration = Duration::from_millis(20);
/// How long a word stays fresh (three rechecks of a minute).
const FRESH_FOR: Duration = Duration::from_secs(180);
/// How long the watch for the outage lasts, simulated.
const WATCH_FOR: Duration = Duration::from_secs(30);
/// How often the watch looks.
const WATCH_EVERY: Duration = Duration::from_millis(50);

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut runs = if args.benchmarking() { 5 } else { 1 };
    let mut layouts = vec![Layout::Baseline, Layout::Sharded, Layout::Flat];
    let mut fleets = if args.benchmarking() {
        vec![100, 1000, 5000]
    } else {
        vec![100]
    };
    args.each_flag(|flag, value| {
        match flag {
            "--runs" => runs = value.parse()?,
            // The baseline's cost to simulate grows with the square of
            // the fleet: leave it out of the largest.
            "--layouts" => {
                layouts = value
                    .text()?
                    .split(',')
                    .map(Layout::parse)
                    .collect::<Result<_>>()?
            }
            "--fleets" => {
                fleets = value
                    .text()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            _ => {}
        }
        Ok(())
    })?;
    ensure!(runs >= 1 && !fleets.is_empty());
    println!(
        "mass eviction benchmark on {} ({runs} runs, simulated time, {} ms a call)",
        bench::machine(),
        LATENCY.as_millis()
    );
    println!(
        "| workers | layout | notes landed | writes / worker | reads / worker | outage recorded after | last note after |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &workers in &fleets {
        for &layout in &layouts {
            let outcomes = (0..runs)
                .map(|_| simulate(layout, workers))
                .collect::<Result<Vec<_>>>()?;
            report(layout, workers, &outcomes);
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Baseline,
    Sharded,
    Flat,
}

impl Layout {
    fn parse(name: &str) -> Result<Layout> {
        Ok(match name {
            "baseline" => Layout::Baseline,
            "sharded" => Layout::Sharded,
            "flat" => Layout::Flat,
            other => anyhow::bail!("no layout {other:?}: baseline, sharded or flat"),
        })
    }
}

/// One run's figures.
struct Outcome {
    landed: usize,
    writes: u64,
    reads: u64,
    recorded: Option<Duration>,
    last_note: Duration,
}

fn report(layout: Layout, workers: usize, outcomes: &[Outcome]) {
    let mid = |figures: Vec<f64>| {
        let mut figures = figures;
        figures.sort_by(f64::total_cmp);
        figures[figures.len() / 2]
    };
    let per_worker = |count: &dyn Fn(&Outcome) -> u64| {
        mid(outcomes
            .iter()
            .map(|o| count(o) as f64 / workers as f64)
            .collect())
    };
    let landed = mid(outcomes.iter().map(|o| o.landed as f64).collect());
    let recorded: Vec<Duration> = outcomes.iter().filter_map(|o| o.recorded).collect();
    let recorded = if recorded.len() * 2 > outcomes.len() {
        format!("{:.2} s", median(&recorded).as_secs_f64())
    } else {
        format!("never (watched {} s)", WATCH_FOR.as_secs())
    };
    let last: Vec<Duration> = outcomes.iter().map(|o| o.last_note).collect();
    println!(
        "| {workers} | {layout:?} | {landed:.0} of {workers} | {:.2} | {:.2} | {recorded} | {:.2} s |",
        per_worker(&|o| o.writes),
        per_worker(&|o| o.reads),
        median(&last).as_secs_f64()
    );
}

/// One mass eviction of `workers` in `layout`, on a paused clock.
fn simulate(layout: Layout, workers: usize) -> Result<Outcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(async move {
        let memory = Arc::new(InMemoryCheckpointStore::new());
        let names: Vec<String> = (0..workers).map(|i| format!("spot-{i:05}")).collect();
        let now = SystemTime::now();
        seed_running(layout, &memory, &names, now).await?;
        let store = Arc::new(DelayedCheckpointStore::new(
            Arc::clone(&memory) as Arc<dyn CheckpointStore>,
            LATENCY,
        ));
        let first_notice = Instant::now();
        let mut notes = tokio::task::JoinSet::new();
        for (i, name) in names.iter().enumerate() {
            let store = Arc::clone(&store) as Arc<dyn CheckpointStore>;
            let name = name.clone();
            let offset = Duration::from_secs(1).mul_f64(i as f64 / workers as f64);
            notes.spawn(async move {
                tokio::time::sleep(offset).await;
                let at = SystemTime::now();
                let noted = match layout {
                    Layout::Baseline => tokio::time::timeout(
                        Duration::from_secs(1),
                        baseline_lost(&store, &name, at),
                    )
                    .await
                    .unwrap_or(Err(StorageError::Unavailable {
                        message: "no answer within 1 s".into(),
                    })),
                    Layout::Sharded => tokio::time::timeout(
                        Duration::from_secs(20),
                        sharded_lost(&store, &name, at),
                    )
                    .await
                    .unwrap_or(Err(StorageError::Unavailable {
                        message: "no answer within 20 s".into(),
                    })),
                    Layout::Flat => tokio::time::timeout(
                        Duration::from_secs(20),
                        FleetSpotCapacity::new(store).lost(Some(&name), at, FRESH_FOR),
                    )
                    .await
                    .map_or_else(
                        |_| {
                            Err(StorageError::Unavailable {
                                message: "no answer within 20 s".into(),
                            })
                        },
                        |noted| noted.map(|_| ()),
                    ),
                };
                (noted.is_ok(), first_notice.elapsed())
            });
        }
        let watcher = tokio::spawn({
            let memory = Arc::clone(&memory);
            async move {
                while first_notice.elapsed() < WATCH_FOR {
                    if stored(&memory).history.current().is_some_and(|c| !c.there) {
                        return Some(first_notice.elapsed());
                    }
                    tokio::time::sleep(WATCH_EVERY).await;
                }
                None
            }
        });
        let (mut landed, mut last_note) = (0, Duration::ZERO);
        while let Some(note) = notes.join_next().await {
            let (ok, after) = note?;
            if ok {
                landed += 1;
                last_note = last_note.max(after);
            }
        }
        Ok(Outcome {
            landed,
            writes: store.writes() + store.deletes(),
            reads: store.reads() + store.lists(),
            recorded: watcher.await?,
            last_note,
        })
    })
}

/// The fleet's document as stored.
fn stored(memory: &InMemoryCheckpointStore) -> SpotSightings {
    match memory.get(FleetSpotCapacity::KEY) {
        Some(Checkpoint::InProgress { progress }) => {
            serde_json::from_value(progress).unwrap_or_default()
        }
        _ => SpotSightings::default(),
    }
}

/// Every worker heard from within the last minute, Spot there for an
/// hour: written without latency (the set-up, not measured), in the
/// fleet's document (baseline), each worker's shard (sharded) or each
/// worker's own note (flat).
async fn seed_running(
    layout: Layout,
    memory: &Arc<InMemoryCheckpointStore>,
    names: &[String],
    now: SystemTime,
) -> Result<()> {
    let store = Arc::clone(memory) as Arc<dyn CheckpointStore>;
    let heard = |i: usize| now - Duration::from_secs(60).mul_f64(i as f64 / names.len() as f64);
    let mut document = SpotSightings::default();
    document
        .history
        .see(true, unix_secs(now - Duration::from_secs(3600)));
    document.heard_at = Some(unix_secs(now));
    let mut shards = std::collections::BTreeMap::<&str, SpotSightings>::new();
    for (i, name) in names.iter().enumerate() {
        let record = match layout {
            Layout::Baseline => &mut document,
            Layout::Sharded => shards
                .entry(FleetSpotCapacity::shard_key_of(name))
                .or_default(),
            Layout::Flat => {
                // The worker's own word, named as `FleetSpotCapacity::heard`
                // names it (the shape its unit tests pin).
                let us = (unix_secs(heard(i)) * 1_000_000.0).floor() as u64;
                let key = format!("{NOTES_PREFIX}{name}/heard-{us:016}");
                let progress = serde_json::json!({});
                store
                    .write(
                        &key,
                        &Checkpoint::InProgress { progress },
                        WritePrecondition::Create,
                        None,
                    )
                    .await?;
                continue;
            }
        };
        record.workers.insert(name.clone(), unix_secs(heard(i)));
        record.heard_at = Some(unix_secs(now));
    }
    for (key, record) in std::iter::once((FleetSpotCapacity::KEY, document)).chain(shards) {
        let progress = serde_json::to_value(&record)?;
        store
            .write(
                key,
                &Checkpoint::InProgress { progress },
                WritePrecondition::Create,
                None,
            )
            .await?;
    }
    Ok(())
}

/// The note of an eviction before issue 37: one document, read and
/// rewritten without the worker, 8 attempts with no wait; the outage only
/// when no other worker is fresh.
async fn baseline_lost(
    store: &Arc<dyn CheckpointStore>,
    worker: &str,
    at: SystemTime,
) -> Result<(), StorageError> {
    let at = unix_secs(at);
    for _ in 0..8 {
        let stored = store.read(FleetSpotCapacity::KEY).await?;
        let (mut sightings, precondition) = match &stored {
            Some(stored) => match &stored.checkpoint {
                Checkpoint::InProgress { progress } => (
                    serde_json::from_value::<SpotSightings>(progress.clone()).unwrap_or_default(),
                    WritePrecondition::IfMatch(stored.etag.clone()),
                ),
                Checkpoint::Completed { .. } => {
                    return Err(StorageError::InvalidArgument("not sightings".into()));
                }
            },
            None => (SpotSightings::default(), WritePrecondition::Create),
        };
        let forgot = sightings.workers.remove(worker).is_some();
        let others_run = sightings
            .workers
            .values()
            .any(|heard| *heard > at || at - heard <= FRESH_FOR.as_secs_f64());
        if others_run {
            if !forgot {
                return Ok(());
            }
        } else {
            sightings.history.see(false, at);
        }
        let progress = serde_json::to_value(&sightings)
            .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
        match store
            .write(
                FleetSpotCapacity::KEY,
                &Checkpoint::InProgress { progress },
                precondition,
                None,
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(StorageError::Conflict { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Err(StorageError::Conflict {
        key: FleetSpotCapacity::KEY.to_owned(),
    })
}

/// The note of an eviction in the sharded layout (before the flat one):
/// the worker's shard read and rewritten (the worker moved from the
/// running to the evicted), then all 17 documents read, and the outage
/// written to the fleet's document when the evictions say so.
async fn sharded_lost(
    store: &Arc<dyn CheckpointStore>,
    worker: &str,
    at: SystemTime,
) -> Result<(), StorageError> {
    let at = unix_secs(at);
    fenced_update(store, FleetSpotCapacity::shard_key_of(worker), |shard| {
        let known = shard.evicted.get(worker).is_some_and(|noted| *noted >= at);
        if known && !shard.workers.contains_key(worker) {
            return None;
        }
        let mut next = shard.clone();
        next.workers.remove(worker);
        let noted = next.evicted.entry(worker.to_owned()).or_insert(at);
        *noted = noted.max(at);
        Some(next)
    })
    .await?;
    let keys = std::iter::once(FleetSpotCapacity::KEY)
        .chain(FleetSpotCapacity::shard_keys().iter().copied());
    let records = try_join_all(keys.map(|key| read_sightings(store, key))).await?;
    let document = records.first().map(|(s, _)| s.clone()).unwrap_or_default();
    let now = unix_secs(SystemTime::now());
    let window = FRESH_FOR.as_secs_f64();
    let view = SpotSightings::merge(records.into_iter().map(|(s, _)| s)).seen_at(now, window);
    let Some(start) = view.history.current().filter(|c| !c.there).map(|c| c.since) else {
        return Ok(());
    };
    let outage = |s: &SpotSightings| {
        let mut next = s.clone();
        next.history.see(false, start);
        (next.history != s.history).then_some(next)
    };
    if outage(&document).is_some() {
        fenced_update(store, FleetSpotCapacity::KEY, outage).await?;
    }
    Ok(())
}

/// A document's sightings and the precondition of its next write.
async fn read_sightings(
    store: &Arc<dyn CheckpointStore>,
    key: &str,
) -> Result<(SpotSightings, WritePrecondition), StorageError> {
    Ok(match store.read(key).await? {
        Some(stored) => match &stored.checkpoint {
            Checkpoint::InProgress { progress } => (
                serde_json::from_value(progress.clone()).unwrap_or_default(),
                WritePrecondition::IfMatch(stored.etag.clone()),
            ),
            Checkpoint::Completed { .. } => {
                return Err(StorageError::InvalidArgument("not sightings".into()));
            }
        },
        None => (SpotSightings::default(), WritePrecondition::Create),
    })
}

/// The sharded layout's read and ETag-fenced rewrite: 16 attempts, a
/// jittered wait from 20 ms doubling to 2 s after each race lost.
async fn fenced_update(
    store: &Arc<dyn CheckpointStore>,
    key: &str,
    change: impl Fn(&SpotSightings) -> Option<SpotSightings>,
) -> Result<(), StorageError> {
    for attempt in 0..16u32 {
        if attempt > 0 {
            let wait = (Duration::from_millis(20) * (1 << (attempt - 1).min(10)))
                .min(Duration::from_secs(2));
            tokio::time::sleep(wait.mul_f64(0.5 + rand::random::<f64>() / 2.0)).await;
        }
        let (current, precondition) = read_sightings(store, key).await?;
        let Some(next) = change(&current) else {
            return Ok(());
        };
        let progress = serde_json::to_value(&next)
            .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
        match store
            .write(
                key,
                &Checkpoint::InProgress { progress },
                precondition,
                None,
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(StorageError::Conflict { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Err(StorageError::Conflict {
        key: key.to_owned(),
    })
}
