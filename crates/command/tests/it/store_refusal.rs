//! A checkpoint the store refuses for good (a chunk's size or path it
//! rejects: HTTP 413 here) fails its delivery at the save, with the
//! store's reason, as a checkpoint directory over its limits does: the
//! attempt record that `spot-worker status` lists under `failing` names
//! the job and the refusal. It is not retried in silence while the
//! program runs on unsaved.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use spot_worker_command::CommandHandler;
use spot_worker_storage::{ATTEMPT_RECORD_PREFIX, CheckpointStore, FailingJob};
use spot_worker_testkit::store_layer::{Action, Call, Layered, StoreCall};
use spot_worker_testkit::worker::{Env, within};

/// The real store (Azurite), except that it rejects every chunk written
/// (the store layer's `Reject`), as a store rejects a body too large for
/// it: HTTP 413.
fn refusing_chunks(call: &Call<'_>) -> Action {
    if call.kind == StoreCall::ChunkPut {
        Action::Reject(413)
    } else {
        Action::Pass
    }
}

/// The failing job the message's attempt record describes, once it
/// records a failure (polled: the store has no notifications).
async fn failing(store: &dyn CheckpointStore, message_id: &str) -> FailingJob {
    let key = format!("{ATTEMPT_RECORD_PREFIX}{message_id}");
    loop {
        if let Ok(Some(stored)) = store.read(&key).await
            && let Some(job) = FailingJob::from_attempt_record(&stored.checkpoint)
        {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_the_store_refuses_fails_the_delivery_and_shows_in_status() {
    let env = Env::start().await;
    let id = env.queue.send("job", Duration::ZERO).await.unwrap();
    let store = Arc::new(Layered::wrap(env.checkpoints.clone(), refusing_chunks));
    // Three tries: the first failure leaves an attempt record, read as
    // `status` reads it, and the message is tried again.
    let consumer = consumer(&env, 3).with_checkpoints(store.clone());
    // 256 KiB of checkpoint: over what a manifest keeps whole, so chunks
    // are sent; then the program waits a minute, unsaved.
    let handler = CommandHandler::new(
        sh("head -c 262144 /dev/zero > \"$SPOT_WORKER_CHECKPOINT\" && exec sleep 60"),
        env.results.clone(),
    );
    let running = Running::start(consumer, handler);
    let job = within(
        "the attempt record of a failure",
        failing(store.as_ref(), id.as_str()),
    )
    .await;
    running.stop().await;
    assert!(job.failures >= 1, "{job:?}");
    assert_eq!(job.job.as_deref(), Some(id.as_str()), "{job:?}");
    assert!(
        job.last_error.contains("the store refused the checkpoint")
            && job.last_error.contains("413"),
        "{}",
        job.last_error
    );
}
