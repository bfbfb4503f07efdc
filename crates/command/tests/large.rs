//! Large state with real programs on a real Azurite: a checkpoint saved
//! again unchanged sends no chunk, one with a region changed sends about
//! that region (counted at the store), and a 100 GB result is a counted
//! failure naming its size and the limit, with the runner going on to the
//! next job.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::{Checkpoint, CheckpointStore};
use spot_worker_testkit::counting::CountingStore;
use spot_worker_testkit::worker::{Env, within};

/// The inline content of `path` in the job's stored manifest.
async fn stored_inline(store: &dyn CheckpointStore, key: &str, path: &str) -> Option<Vec<u8>> {
    let stored = store.read(key).await.ok()??;
    let Checkpoint::InProgress { progress } = stored.checkpoint else {
        return None;
    };
    let manifest = Manifest::from_progress(&progress)?.ok()?;
    let Files::Listed(files) = manifest.files else {
        return None;
    };
    files
        .into_iter()
        .find(|file| file.path == path)
        .and_then(|file| match file.content {
            Content::Inline(bytes) => Some(bytes),
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_checkpoint_sends_nothing_and_a_changed_region_about_itself() {
    let env = Env::start().await;
    let go = tempfile::tempdir().unwrap();
    env.queue
        .send(r#"{"job_id":"model"}"#, Duration::ZERO)
        .await
        .unwrap();
    let program = r#"
import os, random, time
ck, d, go = os.environ["SPOT_WORKER_CHECKPOINT"], os.environ["SPOT_WORKER_CHECKPOINT_DIR"], os.environ["GO"]
size = 24 << 20
state = bytearray(random.Random(5).randbytes(size))
def put(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
def wait(name):
    while not os.path.exists(os.path.join(go, name)):
        time.sleep(0.02)
put(ck, state); put(d + "/step", b"1")
wait("1")
put(ck, state); put(d + "/step", b"2")
wait("2")
state[size // 2 : size // 2 + size // 100] = random.Random(6).randbytes(size // 100)
put(ck, state); put(d + "/step", b"3")
wait("3")
"#;
    let counting = Arc::new(CountingStore::new(env.checkpoints.clone()));
    let consumer = consumer(&env, 3);
    let consumer = consumer.with_checkpoints(counting.clone());
    let config = CommandConfig::new("python3", ["-c", program])
        .with_job_key("job_id")
        .with_checkpoint_every(Duration::from_millis(100))
        .with_pass_env(vec!["GO".to_owned()]);
    // The program finds its go-files through GO.
    unsafe_set_go(go.path());
    let handler = Observed::new(CommandHandler::new(config, env.results.clone()));
    let running = Running::start(consumer, handler.clone());
    let calls = Arc::clone(counting.calls());
    let step = |n: &'static str| {
        let counting = Arc::clone(&counting);
        async move {
            while stored_inline(counting.as_ref(), "model", "dir/step")
                .await
                .as_deref()
                != Some(n.as_bytes())
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    within("the first save", step("1")).await;
    let first = calls.chunk_bytes();
    assert!(
        first >= 24 << 20,
        "the first save sent the file: {first} bytes"
    );

    std::fs::write(go.path().join("1"), b"").unwrap();
    within("the save of the unchanged file", step("2")).await;
    let unchanged = calls.chunk_bytes() - first;
    assert_eq!(
        unchanged, 0,
        "an unchanged 24 MiB file sent {unchanged} bytes"
    );

    std::fs::write(go.path().join("2"), b"").unwrap();
    within("the save of the changed region", step("3")).await;
    let changed = calls.chunk_bytes() - first;
    let region = (24 << 20) / 100;
    assert!(
        changed >= region && changed <= region + 2 * 4 * 1024 * 1024,
        "a {region}-byte region sent {changed} bytes"
    );
    std::fs::write(go.path().join("3"), b"").unwrap();
    handler.finished(1).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;
    assert_eq!(stats.succeeded, 1);
    assert!(
        matches!(
            env.checkpoints
                .read("model")
                .await
                .unwrap()
                .map(|s| s.checkpoint),
            Some(Checkpoint::Completed { .. })
        ),
        "the job is completed"
    );
    // Its chunks are deleted with it.
    let deleted = async {
        while calls.chunk_deletes() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within("the completed job's chunks to be deleted", deleted).await;
}

/// Points the programs of this test binary at `dir` (`GO`).
fn unsafe_set_go(dir: &std::path::Path) {
    // SAFETY: set before any program of this test starts, and no other
    // test in this binary reads or writes the environment.
    unsafe { std::env::set_var("GO", dir) };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_gb_result_is_a_counted_failure_and_the_next_job_runs() {
    let env = Env::start().await;
    env.queue.send("huge", Duration::ZERO).await.unwrap();
    env.queue.send("small", Duration::ZERO).await.unwrap();
    let script = r#"if [ "$(cat)" = huge ]; then truncate -s 100G "$SPOT_WORKER_RESULT"; else echo fine > "$SPOT_WORKER_RESULT"; fi"#;
    let handler = Observed::new(CommandHandler::new(
        sh(script).with_result_name("{message_id}"),
        env.results.clone(),
    ));
    let running = Running::start(consumer(&env, 1), handler.clone());
    let record = poisoned(&env).await;
    let stats = running
        .stop_when(|stats| stats.succeeded == 1 && stats.poisoned == 1)
        .await;
    assert_eq!((stats.succeeded, stats.poisoned), (1, 1), "{stats:?}");
    assert_error_has(
        &record,
        "the result file is 107374182400 bytes, over the limit of 10737418240 bytes (SPOT_WORKER_RESULT_MAX_BYTES)",
    );
    assert_eq!(record.failures, 1, "a counted failure");
}
