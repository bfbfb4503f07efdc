//! BlobCheckpointStore against a real Azurite: ETag-fenced create, update
//! and conflict, resume, idempotent writes, and completed jobs.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{WAIT_LIMIT, poll_until, start_azurite, storage, unique};
use serde_json::json;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, Consumer, ConsumerConfig, HandlerError, JobCheckpoint,
    MessageQueue, StorageError, WritePrecondition, handler_fn, poison_queue_name,
};
use tokio_util::sync::CancellationToken;

fn progress(n: u64) -> Checkpoint {
    Checkpoint::InProgress {
        progress: json!({"rows": n}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_update_conflict_and_resume_are_fenced_by_etags() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = storage.checkpoint_store(&unique("ckpt")).unwrap();
    store.create_container_if_missing().await.unwrap();
    store.create_container_if_missing().await.unwrap(); // idempotent

    assert_eq!(store.read("job-1").await.unwrap(), None);
    let created = store
        .write("job-1", &progress(1), WritePrecondition::Create)
        .await
        .unwrap();
    // If-None-Match: * refuses a second create.
    let again = store
        .write("job-1", &progress(9), WritePrecondition::Create)
        .await
        .unwrap_err();
    assert_eq!(
        again,
        StorageError::Conflict {
            key: "job-1".into()
        }
    );
    let updated = store
        .write(
            "job-1",
            &progress(2),
            WritePrecondition::IfMatch(created.clone()),
        )
        .await
        .unwrap();
    assert_ne!(updated, created);
    // A worker still holding the old ETag cannot overwrite newer progress.
    let stale = store
        .write("job-1", &progress(1), WritePrecondition::IfMatch(created))
        .await
        .unwrap_err();
    assert!(matches!(stale, StorageError::Conflict { .. }), "{stale:?}");
    // Resume: the latest progress and its ETag.
    assert_eq!(
        store.read("job-1").await.unwrap(),
        Some((progress(2), updated.clone()))
    );
    // If-Match on a checkpoint that does not exist conflicts too.
    let missing = store
        .write("job-2", &progress(1), WritePrecondition::IfMatch(updated))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, StorageError::Conflict { .. }),
        "{missing:?}"
    );
    // Keys may contain slashes (virtual directories).
    store
        .write("tenant/a/job-3", &progress(3), WritePrecondition::Create)
        .await
        .unwrap();
    assert_eq!(
        store.read("tenant/a/job-3").await.unwrap().unwrap().0,
        progress(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_checkpoints_are_idempotent_and_stop_a_worker_that_lost_the_race() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = storage.checkpoint_store(&unique("ckpt")).unwrap();
    store.create_container_if_missing().await.unwrap();
    let store: Arc<dyn CheckpointStore> = Arc::new(store);

    let mut first = JobCheckpoint::load(store.clone(), "job").await.unwrap();
    let mut second = JobCheckpoint::load(store.clone(), "job").await.unwrap();
    first.save(progress(5)).await.unwrap();
    // The same write again (a retry whose first attempt landed) leaves one result.
    second.save(progress(5)).await.unwrap();
    assert_eq!(second.etag(), first.etag());
    // Different progress from a stale view is a conflict: stop the job.
    first.save(progress(6)).await.unwrap();
    let err = second.save(progress(7)).await.unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");

    let resumed = JobCheckpoint::load(store.clone(), "job").await.unwrap();
    assert_eq!(resumed.progress(), Some(&json!({"rows": 6})));
    let mut resumed = resumed;
    resumed.complete(json!({"total": 6})).await.unwrap();
    let reread = JobCheckpoint::load(store, "job").await.unwrap();
    assert!(reread.is_completed());
    assert_eq!(reread.result(), Some(&json!({"total": 6})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_whose_job_completed_is_deleted_without_redoing_it() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let name = unique("jobs");
    let queue = storage.queue(&name).unwrap();
    queue.create_if_missing().await.unwrap();
    let poison = storage.queue(&poison_queue_name(&name)).unwrap();
    let store = storage.checkpoint_store(&unique("ckpt")).unwrap();
    store.create_container_if_missing().await.unwrap();

    let id = queue.send("already done", Duration::ZERO).await.unwrap();
    store
        .write(
            id.as_str(),
            &Checkpoint::Completed {
                result: json!("ok"),
            },
            WritePrecondition::Create,
        )
        .await
        .unwrap();
    let handler =
        handler_fn(|_job| async { Err::<(), HandlerError>("the handler must not run".into()) });
    let config = ConsumerConfig {
        visibility_timeout: Duration::from_secs(2),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(poison), config)
        .unwrap()
        .with_checkpoints(Arc::new(store));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
        async move { consumer.run(handler, shutdown).await }
    });
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
