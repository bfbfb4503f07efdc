//! The shell example of examples/command does what its comment says, on a
//! real Azurite.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_testkit::worker::Env;
use spot_worker_testkit::workspace_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_example_counts_words() {
    let env = Env::start().await;
    env.queue
        .send("one two\nthree four five\nsix\n", Duration::ZERO)
        .await
        .unwrap();
    let script = workspace_root().join("examples/command/word-count.sh");
    let config =
        CommandConfig::new("sh", [script.to_string_lossy().into_owned()]).with_result_name("count");
    let handler = Observed::new(CommandHandler::new(config, env.results.clone()));
    let running = Running::start(consumer(&env, 1), handler.clone());
    handler.finished(1).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1);
    let count = env.results.get("count").await.unwrap().unwrap();
    assert_eq!(String::from_utf8(count).unwrap().trim(), "6");
}
