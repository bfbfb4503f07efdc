//! The progress a program reports (`SPOT_WORKER_PROGRESS`) is the job's
//! progress where the lane rule reads it: the save the runner makes at a
//! notice stamps the progress file as it is then, so a job with a deadline
//! it can meet is not moved to the regular lane at its release. Real
//! programs, a real Azurite, both lanes' queues.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_consumer::DrainSignals;
use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource};
use spot_worker_decisions::goodput::stamp_progress;
use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, Deadline, Lane, LanePolicy};
use spot_worker_lanes::{Enqueued, FleetSpotCapacity, Lanes, SpotCapacity, SwitchCost};
use spot_worker_storage::{MessageEncoding, MessageQueue};
use spot_worker_testkit::worker::{Env, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_half_done_by_its_progress_file_stays_on_spot_at_its_release() {
    let captured = Captured::install_from(tracing::Level::DEBUG);
    let env = Env::start().await;
    let regular: Arc<dyn MessageQueue> = Arc::new(
        env.storage
            .queue(&format!("{}-regular", env.queue_name))
            .unwrap(),
    );
    regular.prepare().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (step, written) = (dir.path().join("step"), dir.path().join("written"));
    // Progress 0 with its first version; then, told to, half the job with
    // its second one; then it runs until its stop signal.
    let program = two_step_program(
        "0",
        &step,
        "0.5",
        &format!(
            "put({written:?}, \"\")\ntime.sleep(120)\nsys.exit(3)",
            written = written.display().to_string()
        ),
    );
    // 200 s of work due 600 s after its start, 200 s ago: the line is at
    // a third of it (67 s). Half done (100 s) it is ahead of the line with
    // 300 s of slack; with nothing done, or the second of useful time the
    // runner measured, it is behind it.
    let start = SystemTime::now() - Duration::from_secs(200);
    let deadline = Deadline {
        start,
        due: start + Duration::from_secs(600),
        work: Duration::from_secs(200),
    };
    let (d, recheck) = (Duration::from_secs(2), Duration::from_secs(1));
    let enqueued =
        Enqueued::new(b"job", Some(deadline), MessageEncoding::Text, d, recheck).unwrap();
    assert_eq!(enqueued.lane, Lane::Spot);
    let id = env
        .queue
        .send(&enqueued.text, Duration::ZERO)
        .await
        .unwrap();
    let lanes = Lanes {
        lane: Lane::Spot,
        spot: env.queue.clone(),
        regular: regular.clone(),
        recheck,
        switch_cost: Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED.scaled_to(d))),
        spot_capacity: Arc::new(SpotCapacity::new(
            FleetSpotCapacity::new(env.checkpoints.clone()),
            recheck,
        )),
        policy: LanePolicy::UniformProgress,
        price_ratio: 3.0,
    };
    // No save between the first and the one at the stop.
    let cadence = Arc::new(CheckpointCadence::new(IntervalSource::Explicit(
        Duration::from_secs(600),
    )));
    let consumer = consumer(&env, 1)
        .with_cadence(cadence.clone())
        .with_lanes(lanes);
    let handler = CommandHandler::new(
        CommandConfig::new("python3", ["-c", program.as_str()]),
        env.results.clone(),
    );
    let signals = DrainSignals::new();
    let running = tokio::spawn({
        let signals = signals.clone();
        async move { consumer.run_until(handler, signals).await }
    });
    within("the first save", async {
        while cadence.view().cost.saves < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    std::fs::write(&step, b"").unwrap();
    within("the second version", async {
        while !written.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The worker drains, as at a notice: the program is stopped, its
    // second version saved, the job released to the lane the rule picks.
    signals.stop_receiving();
    signals.wind_down(Some(tokio::time::Instant::now() + Duration::from_secs(20)));
    let stats = within("the drain", running).await.unwrap();
    assert_eq!(stats.succeeded, 0, "{stats:?}");
    let key = id.to_string();
    let stored = env.checkpoints.read(&key).await.unwrap().unwrap();
    let stamped = stored.stamp.as_deref().and_then(stamp_progress);
    let log = captured.lines().join("\n");
    assert_eq!(
        stamped,
        Some(0.5),
        "the save at the stop stamps the file's progress; {:?}\n{log}",
        stored.stamp
    );
    // Released, not moved: its message is back in the Spot lane's queue
    // (visible again at once or after a short hold), and none was sent to
    // the regular one.
    let moved = regular.receive(1, Duration::from_secs(30)).await.unwrap();
    assert!(
        moved.is_empty(),
        "a job ahead of its line was moved to the regular lane:\n{log}"
    );
    let back = within("the job back in the Spot lane", async {
        loop {
            let back = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
            if !back.is_empty() {
                break back;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(back[0].id, id);
}
