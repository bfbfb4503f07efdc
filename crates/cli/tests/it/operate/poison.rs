//! `spot-worker poison`: a requeue a consumer then handles, purge, and
//! base64 messages written by the Python SDK.

use std::path::PathBuf;

use spot_worker_storage::{MessageEncoding, ResultStore as _};
use spot_worker_testkit::Azurite;
use tokio::process::Command;

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_poison_message_goes_back_byte_for_byte_and_then_succeeds() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    // One small job, and one whose original is too big for its poison
    // record, so it is kept as a claim-check blob.
    let small = "{\"job_id\":\"small\",\"text\":\"h\u{e9}llo <&>\"}".to_owned();
    let big = format!("{{\"job_id\":\"big\",\"data\":\"{}\"}}", "x".repeat(64_960));
    let (_dir, path) = input_file(&format!("{small}\n{big}\n"));
    enqueue_file(&azurite, &[], &path).await.assert_success();
    let worker = FlakyWorker::new(&storage, MessageEncoding::Text).await;
    assert!(worker.run_until(0, 2).await.is_empty());
    let records = poison_records(&storage).await;
    let (big_id, big_record) = records
        .iter()
        .find(|(_, record)| record.body_blob.is_some())
        .expect("the big original is a claim check");
    let blob = big_record.body_blob.clone().unwrap();

    let list = run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "list"])).await;
    list.assert_success();
    list.assert_stdout_has("2 record(s)");
    let big_row = list
        .stdout
        .lines()
        .find(|line| line.starts_with(big_id.as_str()))
        .expect("a row for the big record");
    assert!(big_row.contains(" blob "), "{big_row}");
    assert!(big_row.contains(&big.len().to_string()), "{big_row}");
    assert!(big_row.contains("the handler failed 1 time"), "{big_row}");

    // --all receives every record and makes it visible again.
    let all =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "list", "--all"])).await;
    all.assert_success();
    all.assert_stdout_has(big_id.as_str());
    assert!(all.stdout.ends_with("2 record(s)\n"), "{}", all.stdout);
    assert_eq!(poison_records(&storage).await.len(), 2, "visible again");

    let show = run(spot_worker(&azurite, MessageEncoding::Text).args([
        "poison",
        "show",
        "--raw",
        big_id.as_str(),
    ]))
    .await;
    show.assert_success();
    assert_eq!(show.stdout, big, "the claim-check original, verified");
    let show = run(spot_worker(&azurite, MessageEncoding::Text).args([
        "poison",
        "show",
        &big_record.original_id,
    ]))
    .await;
    show.assert_success();
    show.assert_stdout_has("sha256 ");
    show.assert_stdout_has("verified");

    let requeue =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "requeue", "--all"]))
            .await;
    requeue.assert_success();
    requeue.assert_stdout_has("2 requeued, 0 left in place, 0 failed");
    assert!(poison_records(&storage).await.is_empty());
    let blobs = storage.result_store(&blob.container).unwrap();
    assert_eq!(blobs.get(&blob.name).await.unwrap(), None, "blob deleted");
    assert_eq!(
        peek_texts(&storage, QUEUE).await,
        {
            let mut expected = vec![small.clone(), big.clone()];
            expected.sort();
            expected
        },
        "the originals, byte for byte"
    );

    // New ids, fresh attempt records: the second delivery succeeds.
    let mut expected = vec![small, big];
    expected.sort();
    assert_eq!(worker.run_until(2, 0).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_asks_first_and_deletes_only_what_the_filter_selects() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    enqueue_lines(&azurite, b"{\"job_id\":\"alpha\"}\n{\"job_id\":\"beta\"}\n").await;
    FlakyWorker::new(&storage, MessageEncoding::Text)
        .await
        .run_until(0, 2)
        .await;

    // No terminal and no --yes: refused, nothing deleted.
    let refused =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "purge", "--all"])).await;
    refused.assert_refused("refusing without --yes");
    assert_eq!(poison_records(&storage).await.len(), 2);

    // Neither ids nor a filter: clap names what is missing.
    let usage = run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "purge"])).await;
    assert_eq!(usage.code, Some(2));
    usage.assert_stderr_has("--reason-contains");

    let purged = run(spot_worker(&azurite, MessageEncoding::Text).args([
        "poison",
        "purge",
        "--reason-contains",
        "alpha",
        "--yes",
    ]))
    .await;
    purged.assert_success();
    purged.assert_stdout_has("1 purged, 1 left in place");
    let left = poison_records(&storage).await;
    assert_eq!(left.len(), 1);
    assert!(left[0].1.last_error.contains("beta"), "{:?}", left[0].1);

    let unknown =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "show", "no-such-id"]))
            .await;
    unknown.assert_refused("no record \"no-such-id\"");
}

const PYTHON_SWITCH: &str = "SPOT_WORKER_PYTHON_INTEROP";

fn python_interop_disabled() -> bool {
    std::env::var(PYTHON_SWITCH).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "disabled"
        )
    })
}

/// Runs tools/python/interop.py (the Python SDK) and parses its JSON output,
/// as crates/azure/tests/it/python_interop.rs does.
async fn python(azurite: &Azurite, args: &[&str]) -> serde_json::Value {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/python");
    let interpreter = std::env::var_os("SPOT_WORKER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join(".venv/bin/python"));
    assert!(
        interpreter.exists(),
        "{} is missing: run scripts/test.sh (or set {PYTHON_SWITCH}=0 to skip interop tests)",
        interpreter.display()
    );
    let output = run(Command::new(&interpreter)
        .arg(dir.join("interop.py"))
        .args(args)
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true))
    .await;
    output.assert_success();
    serde_json::from_str(&output.stdout).expect("interop.py prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_base64_messages_are_poisoned_and_requeued_as_python_wrote_them() {
    if python_interop_disabled() {
        eprintln!("skipping: {PYTHON_SWITCH} disables Python interop tests");
        return;
    }
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let texts = ["h\u{e9}llo from python \u{1f980}", "second <job> & more"];
    let ids = python(&azurite, &["send-base64", QUEUE, texts[0], texts[1]]).await;
    let ids: Vec<String> = serde_json::from_value(ids).unwrap();
    let worker = FlakyWorker::new(&storage, MessageEncoding::Base64).await;
    worker.run_until(0, 2).await;

    // The record keeps the base64 text as Python sent it; `show --raw`
    // prints exactly that.
    let show =
        run(spot_worker(&azurite, MessageEncoding::Base64)
            .args(["poison", "show", "--raw", &ids[0]]))
        .await;
    show.assert_success();
    assert_eq!(
        MessageEncoding::Base64.decode(&show.stdout).unwrap(),
        texts[0].as_bytes()
    );

    // Requeue one by its original id; Python reads back what it wrote.
    let requeue =
        run(spot_worker(&azurite, MessageEncoding::Base64).args(["poison", "requeue", &ids[0]]))
            .await;
    requeue.assert_success();
    requeue.assert_stdout_has("1 requeued, 1 left in place");
    let received = python(&azurite, &["receive-base64", QUEUE]).await;
    let received = received.as_array().expect("a list");
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0]["content"], texts[0]);
    assert_eq!(poison_records(&storage).await.len(), 1);
}
