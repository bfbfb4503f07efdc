//! BlobCheckpointStore against a real Azurite: the contract every checkpoint
//! store meets (ETag-fenced create, update and conflict, resume, write
//! stamps, completed jobs, delete), a handle's own landed write recognised
//! after a real 412, completed jobs skipped by the consumer, and the
//! operator-side listing (which the worker's SAS scope may not do).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use serde_json::json;
use spot_worker_azure::BlobCheckpointStore;
use spot_worker_consumer::{Consumer, ConsumerConfig, HandlerError, handler_fn};
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, JobCheckpoint, MessageQueue, StorageError, StoredCheckpoint,
    WritePrecondition, async_trait,
};
use spot_worker_testkit::contract;

fn progress(n: u64) -> Checkpoint {
    Checkpoint::InProgress {
        progress: json!({"rows": n}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blob_checkpoint_store_meets_the_contract() {
    let (_azurite, storage) = azurite_and_storage();
    let store = checkpoint_store(&storage, "ckpt").await;
    store.create_container_if_missing().await.unwrap(); // idempotent
    contract::checkpoint_store(Arc::new(store)).await;
}

/// A blob store whose first stamped write lands and is then sent again, as
/// the SDK's retry policy does when the first response is lost: the resend
/// meets the new ETag and gets a real 412 from Azurite, which is what the
/// caller sees.
struct FirstResponseLost {
    inner: BlobCheckpointStore,
    lost: AtomicBool,
}

#[async_trait]
impl CheckpointStore for FirstResponseLost {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }
    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.inner.read(key).await
    }
    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        CheckpointStore::list(&self.inner, prefix).await
    }
    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        let etag = self
            .inner
            .write(key, checkpoint, precondition.clone(), stamp)
            .await?;
        if stamp.is_some() && self.lost.swap(false, Ordering::SeqCst) {
            return self.inner.write(key, checkpoint, precondition, stamp).await;
        }
        Ok(etag)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handles_own_landed_write_is_accepted_after_a_real_412() {
    let (_azurite, storage) = azurite_and_storage();
    let blobs = checkpoint_store(&storage, "ckpt").await;
    let store: Arc<dyn CheckpointStore> = Arc::new(blobs.clone());
    // Where the job stands when a worker resumes it. (That another
    // worker's equal write is fenced out is part of the contract.)
    blobs
        .write("job", &progress(6), WritePrecondition::Create, None)
        .await
        .unwrap();

    // A write whose first attempt landed and whose resend got 412 from the
    // service is recognised by its stamp: the handle carries on.
    let lossy: Arc<dyn CheckpointStore> = Arc::new(FirstResponseLost {
        inner: blobs.clone(),
        lost: AtomicBool::new(true),
    });
    let mut resumed = JobCheckpoint::load(lossy.clone(), "job").await.unwrap();
    assert_eq!(resumed.progress(), Some(&json!({"rows": 6})));
    resumed.save(progress(7)).await.unwrap();
    let stored = blobs.read("job").await.unwrap().unwrap();
    assert_eq!(
        (stored.checkpoint, Some(&stored.etag)),
        (progress(7), resumed.etag())
    );
    resumed.complete(json!({"total": 7})).await.unwrap();
    let reread = JobCheckpoint::load(store, "job").await.unwrap();
    assert!(reread.is_completed());
    assert_eq!(reread.result(), Some(&json!({"total": 7})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_whose_job_completed_is_deleted_without_redoing_it() {
    let (_azurite, storage) = azurite_and_storage();
    let (queue, poison) = queues(&storage).await;
    let store = checkpoint_store(&storage, "ckpt").await;

    let id = queue.send("already done", Duration::ZERO).await.unwrap();
    // An earlier delivery completed the job, and its delete was cut short:
    // the message is visible again, received once.
    let earlier = queue.receive(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(earlier.len(), 1);
    queue
        .update_visibility(&id, &earlier[0].pop_receipt, Duration::ZERO)
        .await
        .unwrap();
    store
        .write(
            id.as_str(),
            &Checkpoint::Completed {
                result: json!("ok"),
            },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    let handler =
        handler_fn(|_job| async { Err::<(), HandlerError>("the handler must not run".into()) });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(6),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(poison), config)
        .unwrap()
        .with_checkpoints(Arc::new(store));
    let (shutdown, task) = run_in_background(&consumer, handler);
    poll_until("skipped", WAIT_LIMIT, || {
        let stats = consumer.stats();
        async move { (stats.skipped_completed == 1).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let stats = task.await.unwrap();
    assert_eq!((stats.retried, stats.poisoned), (0, 0));
    assert_eq!(queue.approximate_message_count().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lists_every_blob_and_the_worker_a_prefix() {
    let azurite = start_azurite();
    let operator = operator_storage(&azurite);
    let name = unique("ckpt");
    let store = operator.checkpoint_store(&name).unwrap();
    // A container that does not exist yet lists nothing.
    assert_eq!(store.list().await.unwrap(), Vec::new());
    store.create_container_if_missing().await.unwrap();
    for key in ["b", "a", ".spot-worker/attempts/m1"] {
        store
            .write(key, &progress(1), WritePrecondition::Create, None)
            .await
            .unwrap();
    }

    let listed = store.list().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|blob| blob.name.as_str()).collect();
    assert_eq!(names, [".spot-worker/attempts/m1", "a", "b"]);
    let written = progress(1).to_json_bytes().unwrap().len() as u64;
    assert!(listed.iter().all(|blob| blob.len == written), "{listed:?}");
    assert!(listed.iter().all(|blob| blob.last_modified.is_some()));

    // The worker's SAS lists a prefix of its container (the fleet's Spot
    // sightings are found so), every page, in name order.
    let worker = storage(&azurite).checkpoint_store(&name).unwrap();
    let under = CheckpointStore::list(&worker, ".spot-worker/")
        .await
        .unwrap();
    assert_eq!(under, [".spot-worker/attempts/m1"]);
    assert_eq!(
        CheckpointStore::list(&worker, "").await.unwrap(),
        [".spot-worker/attempts/m1", "a", "b"]
    );
    assert!(
        CheckpointStore::list(&worker, "c")
            .await
            .unwrap()
            .is_empty(),
        "nothing under a prefix no blob has"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blob_chunk_store_meets_the_contract() {
    let (_azurite, storage) = azurite_and_storage();
    let store = checkpoint_store(&storage, "chunks").await;
    let chunks = store.chunks().expect("blob checkpoints keep files");
    contract::chunk_store(chunks.as_ref()).await;
}

/// The retention rule measures Last-Modified: touching a chunk (Set Blob
/// Metadata) must move it, or a reused chunk keeps its first upload's date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn touching_a_chunk_moves_its_last_modified_date() {
    let azurite = start_azurite();
    let operator = operator_storage(&azurite);
    let store = checkpoint_store(&operator, "touch").await;
    let chunks = store.chunks().expect("blob checkpoints keep files");
    let name = "0123abcd/chunk-00000001";
    chunks.put(name, b"abc".to_vec().into()).await.unwrap();
    let dated = |listed: Vec<spot_worker_azure::StoredBlob>| {
        listed
            .into_iter()
            .find(|blob| blob.name.ends_with(name))
            .and_then(|blob| blob.last_modified)
            .expect("the chunk is listed with its date")
    };
    let put_at = dated(store.list().await.unwrap());
    // Last-Modified has whole seconds: let the clock pass the next one.
    for _ in 0..100 {
        if time::OffsetDateTime::now_utc().unix_timestamp() > put_at.unix_timestamp() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(chunks.touch(name).await.unwrap());
    let touched_at = dated(store.list().await.unwrap());
    assert!(touched_at > put_at, "{put_at} then {touched_at}");
    assert_eq!(
        chunks.get(name, 3).await.unwrap().as_deref(),
        Some(&b"abc"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_checkpoint_files_meet_the_contract() {
    let (_azurite, storage) = azurite_and_storage();
    let store = checkpoint_store(&storage, "files").await;
    contract::checkpoint_files(Arc::new(store)).await;
}
