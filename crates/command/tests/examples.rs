//! The shell example of examples/command does what its comment says, on a
//! real Azurite.

mod common;

use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_storage::CancellationToken;
use spot_worker_testkit::worker::{Env, within};
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
    let consumer = consumer(&env, 1);
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let (handler, stop) = (handler.clone(), stop.clone());
        async move { consumer.run(handler, stop).await }
    });
    handler.finished(1).await;
    stop.cancel();
    let stats = within("the consumer", running).await.unwrap();
    assert_eq!(stats.succeeded, 1);
    let count = env.results.get("count").await.unwrap().unwrap();
    assert_eq!(String::from_utf8(count).unwrap().trim(), "6");
}
