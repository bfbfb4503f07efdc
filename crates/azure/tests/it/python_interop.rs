//! Interop with another SDK: the Python `azure-storage-queue` (pinned in
//! tools/python/requirements.txt, installed into tools/python/.venv by
//! scripts/test.sh) enqueues base64 messages the Rust consumer must read, and
//! reads back the poison record the Rust consumer wrote.
//!
//! Skipped only when `SPOT_WORKER_PYTHON_INTEROP` is `0`, `false` or
//! `disabled`; otherwise a missing venv is a failure, not a skip.

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use spot_worker_consumer::{
    Consumer, ConsumerConfig, HandlerError, Job, PoisonRecord, handler_fn, poison_queue_name,
};
use spot_worker_storage::MessageEncoding;
use spot_worker_testkit::Azurite;

const SWITCH: &str = "SPOT_WORKER_PYTHON_INTEROP";
const PYTHON_TIMEOUT: Duration = Duration::from_secs(60);

fn interop_disabled() -> bool {
    std::env::var(SWITCH).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "disabled"
        )
    })
}

fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/python")
}

/// Runs tools/python/interop.py and parses its JSON output.
async fn python(azurite: &Azurite, args: &[&str]) -> serde_json::Value {
    let interpreter = std::env::var_os("SPOT_WORKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| python_dir().join(".venv/bin/python"));
    assert!(
        interpreter.exists(),
        "{} is missing: run scripts/test.sh (or set {SWITCH}=0 to skip interop tests)",
        interpreter.display()
    );
    let mut command = tokio::process::Command::new(&interpreter);
    command
        .arg(python_dir().join("interop.py"))
        .args(args)
        // Passed by environment so it is not visible in process listings.
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true);
    let output = tokio::time::timeout(PYTHON_TIMEOUT, command.output())
        .await
        .expect("python finished in time")
        .expect("python ran");
    assert!(
        output.status.success(),
        "interop.py {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("interop.py prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_enqueues_base64_rust_consumes_and_python_reads_the_poison_record() {
    if interop_disabled() {
        eprintln!("skipping: {SWITCH} disables Python interop tests");
        return;
    }
    let (azurite, storage) = azurite_and_storage();
    let name = unique("interop");
    let poison_name = poison_queue_name(&name);

    // 1. Python sends two base64 messages (and creates the queue).
    let ids = python(
        &azurite,
        &[
            "send-base64",
            &name,
            "héllo from python",
            "fail: please poison me",
        ],
    )
    .await;
    let ids: Vec<String> = serde_json::from_value(ids).unwrap();
    assert_eq!(ids.len(), 2);

    // 2. The Rust consumer decodes both; one fails and is poisoned at once.
    let queue = storage.queue(&name).unwrap();
    let poison = storage.queue(&poison_name).unwrap();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let handler = handler_fn({
        let handled = handled.clone();
        move |job: Job| {
            let handled = handled.clone();
            async move {
                let text = job.text()?.to_owned();
                if text.starts_with("fail:") {
                    return Err::<(), HandlerError>(format!("refused {text:?}").into());
                }
                handled.lock().unwrap().push(text);
                Ok(())
            }
        }
    });
    let config = ConsumerConfig {
        encoding: MessageEncoding::Base64,
        max_failures: 1,
        visibility_timeout: Duration::from_secs(5),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(500),
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config).unwrap();
    let (shutdown, task) = run_in_background(&consumer, handler);
    poll_until("both settled", WAIT_LIMIT, || {
        let stats = consumer.stats();
        async move { (stats.succeeded == 1 && stats.poisoned == 1).then_some(()) }
    })
    .await;
    shutdown.cancel();
    task.await.unwrap();
    assert_eq!(
        *handled.lock().unwrap(),
        vec!["héllo from python".to_owned()]
    );

    // 3. Python reads the poison queue as the plain JSON text it is: the
    // original inside stays base64, encoded once.
    let poisoned = python(&azurite, &["receive-text", &poison_name]).await;
    let poisoned = poisoned.as_array().expect("a list");
    assert_eq!(poisoned.len(), 1, "{poisoned:?}");
    let content = poisoned[0]["content"].as_str().expect("text content");
    let record = PoisonRecord::from_message_text(content).expect("a poison record");
    assert_eq!(record.original_id, ids[1]);
    assert_eq!(record.queue, name);
    assert_eq!(record.dequeue_count, 1);
    assert_eq!(
        record.last_error,
        "the handler failed 1 time (max_failures 1); last error: refused \"fail: please poison me\""
    );
    assert_eq!(record.encoding, MessageEncoding::Base64);
    assert_eq!(
        MessageEncoding::Base64
            .decode(record.body.as_deref().unwrap())
            .unwrap(),
        b"fail: please poison me",
        "the original (still encoded) body is kept"
    );
    assert!(record.inserted_at.is_some());
}
