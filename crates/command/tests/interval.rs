//! The checkpoint interval in the program's contract: the program sees
//! `SPOT_WORKER_CHECKPOINT_INTERVAL`, the runner's own saves follow it, and
//! `--checkpoint-every` wins over the worker's interval. Real programs, a
//! real Azurite.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_storage::{CheckpointCadence, IntervalSource};
use spot_worker_testkit::worker::Env;

/// Runs one message through `config` on a consumer following `cadence`
/// (`None`: the consumer's own, adaptive) and returns what the program saw
/// as its interval.
async fn interval_seen(
    config: impl Fn(&str) -> CommandConfig,
    cadence: Option<Duration>,
) -> String {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("interval");
    let script = format!(
        "echo \"$SPOT_WORKER_CHECKPOINT_INTERVAL\" >> {}",
        quoted(&log)
    );
    env.queue.send("job", Duration::ZERO).await.unwrap();
    let mut consumer = consumer(&env, 1);
    if let Some(every) = cadence {
        consumer = consumer.with_cadence(Arc::new(CheckpointCadence::new(
            IntervalSource::Explicit(every),
        )));
    }
    let handler = CommandHandler::new(config(&script), env.results.clone());
    let stats = Running::start(consumer, handler)
        .stop_when(|s| s.succeeded == 1)
        .await;
    assert_eq!(stats.succeeded, 1, "{stats:?}");
    lines(&log).join(",")
}

fn plain(script: &str) -> CommandConfig {
    CommandConfig::new("sh", ["-c", script])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_sees_the_workers_interval_unless_checkpoint_every_fixes_it() {
    // The worker's interval, in whole seconds.
    assert_eq!(
        interval_seen(plain, Some(Duration::from_secs(7))).await,
        "7"
    );
    // Rounded up, so the program never saves more often than the runner looks.
    assert_eq!(
        interval_seen(plain, Some(Duration::from_millis(7200))).await,
        "8"
    );
    // The adaptive interval before any save was measured: the least, 10 s.
    assert_eq!(interval_seen(plain, None).await, "10");
    // --checkpoint-every wins over the worker's interval.
    let fixed = |script: &str| plain(script).with_checkpoint_every(Duration::from_secs(3));
    assert_eq!(
        interval_seen(fixed, Some(Duration::from_secs(7))).await,
        "3"
    );
}
