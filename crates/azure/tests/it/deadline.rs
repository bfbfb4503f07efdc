//! Every storage call has a total deadline: against an endpoint that accepts
//! connections and never answers (a blackholed connection), receive, renew,
//! delete, send, checkpoint read/write/load and result calls all fail within
//! seconds with a transient error, instead of waiting for the SDK
//! transport's 60 s read timeout.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_storage::{
    CheckpointStore, JobCheckpoint, MessageId, MessageQueue, PopReceipt, ResultStore, StorageError,
    WritePrecondition,
};
use spot_worker_testkit::{ACCOUNT_KEY, ACCOUNT_NAME};
use tokio::net::TcpListener;

/// Accepts every connection on 127.0.0.1 and holds it open without reading
/// or answering, until the test ends.
async fn blackhole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    port
}

fn assert_fails_in_time(
    what: &str,
    result: Result<(), StorageError>,
    took: Duration,
    limit: Duration,
) {
    let err = result.expect_err(what);
    assert!(err.is_transient(), "{what}: {err:?}");
    assert!(
        matches!(err, StorageError::Unavailable { .. }),
        "{what}: {err:?}"
    );
    assert!(took < limit, "{what} took {took:?}, limit {limit:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains(ACCOUNT_KEY), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("sig=") || text.contains("sig=REDACTED"),
        "{text}"
    );
}

async fn timed<T>(
    call: impl Future<Output = Result<T, StorageError>>,
) -> (Result<(), StorageError>, Duration) {
    let started = Instant::now();
    let result = call.await.map(drop);
    (result, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_blackholed_endpoint_fail_within_their_deadline() {
    common::init_logs();
    let port = blackhole().await;
    let endpoint = format!("http://127.0.0.1:{port}/{ACCOUNT_NAME}");
    let mut config = StorageConfig::from_connection_string(&format!(
        "DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint};QueueEndpoint={endpoint}"
    ))
    .unwrap();
    config.retry = common::short_retries();
    let deadline = config.retry.call_deadline();
    assert!(deadline <= Duration::from_secs(6), "{deadline:?}");
    // Slack for scheduling on a loaded machine; still far below the 60 s the
    // transport alone would wait.
    let limit = deadline + Duration::from_secs(3);
    let storage = AzureStorage::new(config).unwrap();
    let queue = storage.queue("jobs").unwrap();
    let checkpoints = storage.checkpoint_store("checkpoints").unwrap();
    let results = storage.result_store("results").unwrap();
    let store: Arc<dyn CheckpointStore> = Arc::new(checkpoints.clone());
    let id = MessageId::new("00000000-0000-0000-0000-000000000000");
    let receipt = PopReceipt::new("AgAAAAMAAAAAAAAA");
    let progress = spot_worker_storage::Checkpoint::InProgress { progress: json!(1) };

    // All at once, so the test takes one deadline, not ten.
    let started = Instant::now();
    let (receive, renew, delete, send, prepare, read, write, load, put, get) = tokio::join!(
        timed(queue.receive(1, Duration::from_secs(30))),
        timed(queue.update_visibility(&id, &receipt, Duration::from_secs(30))),
        timed(queue.delete(&id, &receipt)),
        timed(queue.send("x", Duration::ZERO)),
        timed(queue.prepare()),
        timed(checkpoints.read("job")),
        timed(checkpoints.write("job", &progress, WritePrecondition::Create, None)),
        timed(JobCheckpoint::load(store.clone(), "job")),
        timed(results.put_new("r.json", b"{}")),
        timed(results.get("r.json")),
    );
    for (what, (result, took)) in [
        ("receive", receive),
        ("update_visibility", renew),
        ("delete", delete),
        ("send", send),
        ("queue prepare", prepare),
        ("checkpoint read", read),
        ("checkpoint write", write),
        ("JobCheckpoint::load", load),
        ("result put_new", put),
        ("result get", get),
    ] {
        assert_fails_in_time(what, result, took, limit);
    }
    assert!(started.elapsed() < limit, "{:?}", started.elapsed());
}
