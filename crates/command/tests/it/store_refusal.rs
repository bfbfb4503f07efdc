//! A checkpoint the store refuses for good (a chunk's size or path it
//! rejects: HTTP 413 here) fails its delivery at the save, with the
//! store's reason, as a checkpoint directory over its limits does: the
//! attempt record that `spot-worker status` lists under `failing` names
//! the job and the refusal. It is not retried in silence while the
//! program runs on unsaved.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use spot_worker_command::CommandHandler;
use spot_worker_storage::files::ChunkStore;
use spot_worker_storage::{
    ATTEMPT_RECORD_PREFIX, Checkpoint, CheckpointStore, ETag, FailingJob, StorageError,
    StoredCheckpoint, WritePrecondition, async_trait,
};
use spot_worker_testkit::worker::{Env, within};

/// The real store (Azurite), except that it rejects every chunk written,
/// as a store rejects a body too large for it.
struct RefusingChunks {
    inner: Arc<dyn CheckpointStore>,
    chunks: Arc<Refused>,
}

struct Refused(Arc<dyn ChunkStore>);

#[async_trait]
impl ChunkStore for Refused {
    async fn put(&self, _name: &str, _chunk: Bytes) -> Result<(), StorageError> {
        Err(StorageError::Rejected {
            status: 413,
            message: "RequestBodyTooLarge".to_owned(),
        })
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        self.0.get(name, len).await
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        self.0.touch(name).await
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        self.0.delete(name).await
    }
}

#[async_trait]
impl CheckpointStore for RefusingChunks {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.inner.read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.inner.write(key, checkpoint, precondition, stamp).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        Some(self.chunks.clone())
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
    let store = Arc::new(RefusingChunks {
        inner: env.checkpoints.clone(),
        chunks: Arc::new(Refused(env.checkpoints.chunks().unwrap())),
    });
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
