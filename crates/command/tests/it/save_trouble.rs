//! Saves that keep failing for a reason that may clear reach `spot-worker
//! status`: the runner records the trouble under
//! `.spot-worker/save-trouble/<job key>` (read here as `status` reads it,
//! `SaveTrouble::from_checkpoint`), and the next good save deletes it. On
//! a real Azurite: once with the store failing every chunk as unavailable
//! (then answering again), once with a directory the program never lets
//! hold still (then lets).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use spot_worker_storage::{CheckpointStore, SaveTrouble, SaveTroubleKind};
use spot_worker_testkit::store_layer::{Action, Call, Layered, Policy, StoreCall};
use spot_worker_testkit::worker::{Env, within};

/// The real store (Azurite), except that while `down` every chunk written
/// fails as the store unavailable (the store layer's `FailBefore`).
struct ChunksDown {
    down: AtomicBool,
}

impl Policy for ChunksDown {
    fn decide(&self, call: &Call<'_>) -> Action {
        if call.kind == StoreCall::ChunkPut && self.down.load(Ordering::SeqCst) {
            Action::FailBefore
        } else {
            Action::Pass
        }
    }
}

/// The job's save-trouble record as `status` reads it, if there is one.
async fn record(store: &dyn CheckpointStore, job: &str) -> Option<SaveTrouble> {
    match store.read(&SaveTrouble::key(job)).await {
        Ok(Some(stored)) => SaveTrouble::from_checkpoint(&stored.checkpoint),
        _ => None,
    }
}

/// Waits (bounded) until the job's record is of `kind`.
async fn recorded(store: &dyn CheckpointStore, job: &str, kind: SaveTroubleKind) -> SaveTrouble {
    within("the save-trouble record", async {
        loop {
            if let Some(trouble) = record(store, job).await
                && trouble.kind == kind
            {
                return trouble;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Waits (bounded) until the job's record is gone.
async fn cleared(store: &dyn CheckpointStore, job: &str) {
    within("the save-trouble record's deletion", async {
        while record(store, job).await.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_keeps_failing_saves_is_recorded_for_status_and_cleared_by_the_next_save() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let id = env.queue.send("job", Duration::ZERO).await.unwrap();
    let store = Arc::new(Layered::wrap(
        env.checkpoints.clone(),
        ChunksDown {
            down: AtomicBool::new(true),
        },
    ));
    let consumer = consumer(&env, 3).with_checkpoints(store.clone());
    // 256 KiB of checkpoint: over what a manifest keeps whole, so chunks
    // are sent (and fail while the store is down).
    let script = format!(
        "head -c 262144 /dev/urandom > \"$SPOT_WORKER_CHECKPOINT.tmp\" && \
         mv \"$SPOT_WORKER_CHECKPOINT.tmp\" \"$SPOT_WORKER_CHECKPOINT\" && \
         i=0; while [ ! -e {done} ] && [ $i -lt 1200 ]; do i=$((i + 1)); sleep 0.05; done",
        done = quoted(&done)
    );
    let running = Running::start(consumer, shell(&env, &script));
    let trouble = recorded(
        store.as_ref(),
        id.as_str(),
        SaveTroubleKind::StoreUnavailable,
    )
    .await;
    assert_eq!(trouble.job, id.as_str());
    assert!(trouble.looks >= 2, "{trouble:?}");
    assert!(
        trouble.last_error.contains("simulated fault: ChunkPut"),
        "{trouble:?}"
    );
    assert_eq!(trouble.last_saved, None, "nothing was saved: {trouble:?}");
    // The store answers again: the next look saves, and the record goes.
    store.policy().down.store(false, Ordering::SeqCst);
    cleared(store.as_ref(), id.as_str()).await;
    std::fs::write(&done, b"").unwrap();
    let stats = running.stop_when(|stats| stats.succeeded >= 1).await;
    assert_eq!((stats.retried, stats.poisoned), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_never_holds_still_is_recorded_for_status_and_cleared_by_the_next_save() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (still, done) = (dir.path().join("still"), dir.path().join("done"));
    let id = env.queue.send("job", Duration::ZERO).await.unwrap();
    // As in unsettled.rs: the directory never holds still until `still`;
    // then the program holds still, and waits.
    let script = format!(
        "{restless}i=0\nwhile [ ! -e {done} ] && [ $i -lt 1200 ]; do i=$((i + 1)); sleep 0.05; done\n",
        restless = restless_script(&still),
        done = quoted(&done)
    );
    let running = Running::start(consumer(&env, 3), shell(&env, &script));
    let store = env.checkpoints.as_ref();
    let trouble = recorded(store, id.as_str(), SaveTroubleKind::NeverHeldStill).await;
    assert!(
        trouble.looks >= spot_worker_command::REPORT_AFTER,
        "{trouble:?}"
    );
    std::fs::write(&still, b"").unwrap();
    cleared(store, id.as_str()).await;
    std::fs::write(&done, b"").unwrap();
    let stats = running.stop_when(|stats| stats.succeeded >= 1).await;
    assert_eq!((stats.retried, stats.poisoned), (0, 0), "{stats:?}");
}
