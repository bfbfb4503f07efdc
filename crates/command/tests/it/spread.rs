//! A save spread over the rest of a job, really made by the runner: a
//! 25-second job whose interval is the 10 s least (frequent losses) is
//! saved at its start and half-way through, at 12.5 s, where Daly's
//! interval would save at 10 and 20 s, the last one just before the end.
//! The runner knows how much is left from the program's progress file, or,
//! without one, from the lengths of the jobs the fleet finished. Real
//! programs, a real Azurite.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_decisions::cadence::{CheckpointCadence, InterruptionCounts, IntervalSource};
use spot_worker_testkit::worker::Env;

/// How long the job takes.
const JOB: Duration = Duration::from_secs(25);

/// A program that works for [`JOB`] and writes its checkpoint file (and,
/// `with_progress`, its progress file) every 0.5 s, each a temporary
/// file renamed over it.
fn program(with_progress: bool) -> String {
    format!(
        r#"
import os, time
checkpoint, progress = os.environ["SPOT_WORKER_CHECKPOINT"], os.environ["SPOT_WORKER_PROGRESS"]
def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)
start = time.monotonic()
while True:
    done = min((time.monotonic() - start) / {job}, 1.0)
    if {with_progress}:
        put(progress, repr(done))
    put(checkpoint, repr(done))
    if done >= 1.0:
        break
    time.sleep(0.5)
"#,
        job = JOB.as_secs_f64(),
        with_progress = if with_progress { "True" } else { "False" },
    )
}

/// Runs the program once on a worker whose interval is the least (a
/// thousand evictions an hour), with `fleet` as the fleet's counts, and
/// returns when each of its saves happened, from the first; the last is
/// the job marked completed.
async fn saves(with_progress: bool, fleet: InterruptionCounts) -> Vec<Duration> {
    let env = Env::start().await;
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
        seed_evictions_per_hour: 1000.0,
    }));
    cadence.set_fleet(fleet);
    let consumer = consumer(&env, 1).with_cadence(cadence.clone());
    let source = program(with_progress);
    let handler = CommandHandler::new(
        CommandConfig::new("python3", ["-c", source.as_str()]),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    // Every save, as the cadence measures it.
    let times = Arc::new(Mutex::new(Vec::new()));
    let watch = tokio::spawn({
        let (cadence, times) = (cadence.clone(), times.clone());
        async move {
            let started = std::time::Instant::now();
            let mut seen = 0;
            loop {
                let saves = cadence.view().cost.saves;
                for _ in seen..saves {
                    times.lock().unwrap().push(started.elapsed());
                }
                seen = saves;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let stats = running.stop_when(|s| s.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    watch.abort();
    let times = times.lock().unwrap().clone();
    let first = times[0];
    times.iter().map(|t| *t - first).collect()
}

/// The saves of a 25 s job at a 10 s interval, spread: at its start, at
/// 12.5 s, and the completion at its end; not at 10 and 20 s.
fn assert_spread(saves: &[Duration]) {
    assert_eq!(saves.len(), 3, "{saves:?}");
    let half_way = saves[1].as_secs_f64();
    assert!(
        (11.5..13.5).contains(&half_way),
        "the spread save half-way through, at 12.5 s, not Daly's 10 s: {saves:?}"
    );
    assert!(
        saves[2] > JOB - Duration::from_secs(2),
        "the last is the completion: {saves:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_with_a_progress_file_is_saved_half_way_not_at_the_interval() {
    assert_spread(&saves(true, InterruptionCounts::default()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_without_one_is_spread_over_what_the_fleets_jobs_took() {
    // The fleet finished twenty-one jobs of this length, and up to 2 s
    // more: the interpreter's start, which is the job's time too, varies.
    let mut fleet = InterruptionCounts::default();
    for tenth in 0..=20 {
        fleet
            .job_lengths
            .add(JOB + Duration::from_millis(100 * tenth));
    }
    assert_spread(&saves(false, fleet).await);
    // Without that history: Daly's 10 s, so at 10 and 20 s.
    let plain = saves(false, InterruptionCounts::default()).await;
    assert!(plain.len() >= 4, "{plain:?}");
    let second = plain[1].as_secs_f64();
    assert!((9.5..11.0).contains(&second), "{plain:?}");
}
