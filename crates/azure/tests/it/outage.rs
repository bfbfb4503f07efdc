//! Storage outages against a real Azurite: errors surface in seconds with
//! no secret in them, and a consumer recovers after Azurite restarts without
//! losing a message.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use common::*;
use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_consumer::{Consumer, ConsumerConfig, HandlerError, Job, handler_fn};
use spot_worker_storage::{CheckpointStore, MessageQueue, StorageError};
use spot_worker_testkit::ACCOUNT_KEY;

/// Every `sig=` in `text` must be followed by the redaction marker.
fn assert_no_secrets(text: &str) {
    assert!(!text.contains(ACCOUNT_KEY), "account key leaked: {text}");
    let lower = text.to_ascii_lowercase();
    for (at, _) in lower.match_indices("sig=") {
        assert!(
            text[at + 4..].starts_with("REDACTED"),
            "signature leaked: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_surface_in_seconds_and_never_show_a_key_or_signature() {
    let mut azurite = start_azurite();
    let storage = storage(&azurite);
    let queue = storage.queue(&unique("jobs")).unwrap();
    queue.create_if_missing().await.unwrap();
    let store = storage.checkpoint_store(&unique("ckpt")).unwrap();
    tokio::task::block_in_place(|| azurite.stop()).unwrap();

    let started = Instant::now();
    let err = queue.receive(1, Duration::from_secs(5)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.is_transient(), "{err:?}");
    let ckpt_err = store.read("job").await.unwrap_err();
    for text in [
        err.to_string(),
        format!("{err:?}"),
        ckpt_err.to_string(),
        format!("{ckpt_err:?}"),
    ] {
        assert_no_secrets(&text);
    }
    // The error names the request URL, with its signature redacted.
    assert!(err.to_string().contains("sig=REDACTED"), "{err}");

    // Configuration and clients never show the key either.
    let config = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
    for text in [
        format!("{config:?}"),
        format!("{storage:?}"),
        format!("{queue:?}"),
        format!("{store:?}"),
    ] {
        assert_no_secrets(&text);
        assert!(!text.contains("Eby8vdM02"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_signature_is_a_clear_non_transient_error() {
    let azurite = start_azurite();
    // The right account, the wrong key.
    let wrong_key = "d3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXkgd3Jvbmcga2V5IHdyb25nIGtleQ==";
    let text = azurite.connection_string().replace(ACCOUNT_KEY, wrong_key);
    let mut config = StorageConfig::from_connection_string(&text).unwrap();
    config.retry = common::short_retries();
    let queue = AzureStorage::new(config)
        .unwrap()
        .queue(&unique("jobs"))
        .unwrap();
    let err = queue.create_if_missing().await.unwrap_err();
    assert!(
        matches!(err, StorageError::Refused { status: 403, .. }),
        "{err:?}"
    );
    assert_no_secrets(&format!("{err} {err:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_recovers_after_azurite_restarts_and_loses_nothing() {
    let mut azurite = start_azurite();
    let storage = storage(&azurite);
    let (queue, poison) = queues(&storage).await;
    let expected: BTreeSet<String> = (0..20).map(|i| format!("m{i:02}")).collect();
    for body in &expected {
        queue.send(body, Duration::ZERO).await.unwrap();
    }

    // Four handlers may finish before the outage; every later one waits for
    // permits the test adds only once Azurite has stopped. So what succeeds
    // before and during the outage does not depend on how fast handlers run
    // compared with how long Azurite takes to stop.
    const BEFORE_OUTAGE: usize = 4;
    let gate = Arc::new(Semaphore::new(BEFORE_OUTAGE));
    let handled = Arc::new(Mutex::new(BTreeSet::new()));
    let handler = handler_fn({
        let (handled, gate) = (handled.clone(), gate.clone());
        move |job: Job| {
            let (handled, gate) = (handled.clone(), gate.clone());
            async move {
                gate.acquire().await?.forget();
                handled.lock().unwrap().insert(job.text()?.to_owned());
                Ok::<(), HandlerError>(())
            }
        }
    });
    let config = ConsumerConfig {
        batch_size: 2,
        max_in_flight: 2,
        visibility_timeout: Duration::from_secs(6),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        settle_timeout: Duration::from_secs(5),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(queue.clone()), Arc::new(poison), config).unwrap();
    let (shutdown, task) = run_in_background(&consumer, handler);
    let stats_reach =
        |what: &'static str, done: fn(spot_worker_consumer::ConsumerStats) -> bool| {
            let consumer = consumer.clone();
            poll_until(what, WAIT_LIMIT, move || {
                let ok = done(consumer.stats());
                async move { ok.then_some(()) }
            })
        };
    stats_reach("some progress", |s| s.succeeded == BEFORE_OUTAGE as u64).await;

    tokio::task::block_in_place(|| azurite.stop()).unwrap();
    // Handlers blocked at the gate (at most `max_in_flight`) may now finish;
    // their deletes fail while Azurite is down.
    gate.add_permits(expected.len() * 4);
    stats_reach("errors during the outage", |s| s.receive_errors >= 2).await;
    let during = consumer.stats();
    assert_eq!(
        during.succeeded, BEFORE_OUTAGE as u64,
        "nothing can be deleted during the outage: {during:?}"
    );

    tokio::task::block_in_place(|| azurite.start_again()).unwrap();
    poll_until(
        "every message handled after the restart",
        WAIT_LIMIT,
        || {
            let done = handled.lock().unwrap().len() == expected.len();
            async move { done.then_some(()) }
        },
    )
    .await;
    // Messages whose delete failed during the outage come back once their
    // lease expires and are handled (again) and deleted.
    poll_until("the queue to empty", WAIT_LIMIT, || async {
        (queue.approximate_message_count().await.ok() == Some(0)).then_some(())
    })
    .await;
    shutdown.cancel();
    let stats = task.await.unwrap();
    assert_eq!(*handled.lock().unwrap(), expected, "nothing lost");
    assert!(stats.receive_errors >= 2);
    assert_eq!(stats.poisoned, 0);
}
