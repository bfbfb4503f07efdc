//! Nothing logged at any level, by this crate or the SDK underneath, shows
//! a SAS signature or the account key: every log line of a session of real
//! calls (successes and failures) is captured and checked.
//!
//! Its own test binary, because it installs a process-wide subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{storage, unique};
use spot_worker_storage::{Checkpoint, CheckpointStore, MessageQueue, WritePrecondition};
use spot_worker_testkit::{ACCOUNT_KEY, Azurite};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_of_successful_and_failing_calls_contain_no_secrets() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let mut azurite = Azurite::start().expect("azurite starts");
    let storage = storage(&azurite);
    let queue = storage.queue(&unique("jobs")).unwrap();
    queue.create_if_missing().await.unwrap();
    queue.send("hello", Duration::ZERO).await.unwrap();
    let message = queue
        .receive(1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    let receipt = queue
        .update_visibility(&message.id, &message.pop_receipt, Duration::from_secs(30))
        .await
        .unwrap();
    queue.delete(&message.id, &receipt).await.unwrap();
    let _ = queue.delete(&message.id, &receipt).await.unwrap_err();
    let store = storage.checkpoint_store(&unique("ckpt")).unwrap();
    store.create_container_if_missing().await.unwrap();
    let checkpoint = Checkpoint::InProgress {
        progress: serde_json::json!(1),
    };
    store
        .write("job", &checkpoint, WritePrecondition::Create, None)
        .await
        .unwrap();
    let _ = store
        .write("job", &checkpoint, WritePrecondition::Create, None)
        .await
        .unwrap_err();
    store.read("job").await.unwrap();
    tokio::task::block_in_place(|| azurite.stop()).unwrap();
    let error = queue.receive(1, Duration::from_secs(30)).await.unwrap_err();
    tracing::warn!(%error, ?error, "logged by the application");

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("sig=REDACTED"),
        "request URLs are logged, redacted:\n{logs}"
    );
    let lower = logs.to_ascii_lowercase();
    for (at, _) in lower.match_indices("sig=") {
        assert!(
            logs[at + 4..].starts_with("REDACTED"),
            "signature leaked near: {}",
            &logs[at.saturating_sub(100)..at + 60]
        );
    }
    assert!(
        !logs.contains(ACCOUNT_KEY) && !logs.contains("Eby8vdM02"),
        "account key leaked"
    );
}
