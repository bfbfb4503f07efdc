//! Blob leases on a real Azurite: one holder of a name at a time, renewed
//! by its id only, free again once given up or run out; and the trait's
//! `peek` of a real queue, which the lane keeper looks through.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_storage::{CheckpointStore as _, LeaseStore, MessageQueue};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_and_the_lease_is_free_again_once_given_up() {
    let (_azurite, storage) = azurite_and_storage();
    let store = storage.checkpoint_store(&unique("leases")).unwrap();
    store.prepare().await.unwrap();
    let name = ".spot-worker/lanes-keeper";
    let lease = Duration::from_secs(15);

    let mine = store
        .acquire(name, lease)
        .await
        .unwrap()
        .expect("free at first");
    assert_eq!(store.acquire(name, lease).await.unwrap(), None, "held");
    assert!(store.renew(name, &mine).await.unwrap());
    let stranger = spot_worker_storage::LeaseId::new(uuid::Uuid::new_v4().to_string());
    assert!(
        !store.renew(name, &stranger).await.unwrap(),
        "only its id renews it"
    );
    // Giving up a lease one does not hold changes nothing.
    store.release(name, &stranger).await.unwrap();
    assert_eq!(store.acquire(name, lease).await.unwrap(), None);
    store.release(name, &mine).await.unwrap();
    let theirs = store
        .acquire(name, lease)
        .await
        .unwrap()
        .expect("free once given up");
    assert!(
        !store.renew(name, &mine).await.unwrap(),
        "the old holder's is gone"
    );
    store.release(name, &theirs).await.unwrap();
    // Durations outside 15 to 60 s are refused before any request.
    assert!(store.acquire(name, Duration::from_secs(5)).await.is_err());
    // The lease blob is not a job: it stays under `.spot-worker/`.
    assert!(store.read(name).await.is_err(), "not a checkpoint document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_is_peeked_through_the_trait_without_receiving() {
    let (_azurite, storage) = azurite_and_storage();
    let queue = storage.queue(&unique("peek")).unwrap();
    queue.prepare().await.unwrap();
    for text in ["a", "b"] {
        queue.send(text, Duration::ZERO).await.unwrap();
    }
    let seen = MessageQueue::peek(&queue, 32).await.unwrap();
    let texts: Vec<&str> = seen.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(texts, ["a", "b"]);
    assert!(
        seen.iter()
            .all(|m| m.dequeue_count == 0 && m.inserted_at.is_some())
    );
    // Nothing was received: both can still be.
    assert_eq!(
        queue
            .receive(32, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(
        MessageQueue::peek(&queue, 32).await.unwrap().is_empty(),
        "hidden now"
    );
}
