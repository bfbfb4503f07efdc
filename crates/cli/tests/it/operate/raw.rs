//! `spot-worker enqueue --queue NAME --raw` and `spot-worker results get`:
//! a body that is not JSON goes through the queue to a program's stdin
//! exactly, and its result comes back byte for byte.

use std::time::Duration;

use spot_worker_storage::{MessageEncoding, MessageQueue as _};

use super::common::*;

/// Text that JSON Lines could not carry, and that a careless path would
/// change: several lines, CRLF, tabs, markup, non-ASCII, trailing blanks,
/// no final line break.
const TEXT: &str = "first line\r\n\tindented <b>&amp;</b> \"quoted\" 'single'\n\nh\u{e9}llo w\u{f6}rld \u{1f680}   \nlast line, no newline";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_text_reaches_the_programs_stdin_exactly_and_its_result_reads_back() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let (_dir, path) = input_file(TEXT);
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    // enqueue never creates a queue, --raw neither.
    let missing = run(cli()
        .args(["enqueue", "--queue", "texts", "--raw"])
        .arg(&path))
    .await;
    missing.assert_refused("queue \"texts\" does not exist");
    storage
        .queue("texts")
        .unwrap()
        .create_if_missing()
        .await
        .unwrap();

    // To another queue than SPOT_WORKER_QUEUE (`jobs`).
    let sent = run(cli()
        .args(["enqueue", "--queue", "texts", "--raw"])
        .arg(&path))
    .await;
    sent.assert_success();
    sent.assert_stdout_has(&format!(
        "sent 1 message of {} byte(s) to queue texts (text)",
        TEXT.len()
    ));
    let id = sent.message_id();
    assert!(
        peek_texts(&storage, QUEUE).await.is_empty(),
        "nothing on jobs"
    );

    // A program that stores its stdin as its result, run by the worker.
    let mut worker = start_worker(cli().args(["run", "--queue", "texts", "--"]).args([
        "sh",
        "-c",
        "cat > \"$SPOT_WORKER_RESULT\"",
    ]));
    let result = poll_until("the program's result", || async {
        let got = run(cli().args(["results", "get", &id])).await;
        (got.code == Some(0)).then_some(got.stdout)
    })
    .await;
    let status = stop_with_sigterm(&mut worker).await;
    assert_eq!(status.code(), Some(0));
    assert_eq!(result, TEXT, "the body went through the queue unchanged");

    let missing = run(cli().args(["results", "get", "no-such-job"])).await;
    missing.assert_refused("no result \"no-such-job\" in container results");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_bytes_need_a_base64_queue_and_then_arrive_exactly() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("body.bin");
    std::fs::write(&path, &bytes).unwrap();

    let refused = enqueue_file(&azurite, &["--raw"], &path).await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("not UTF-8") && refused.stderr.contains("base64"),
        "{}",
        refused.stderr
    );
    assert!(peek_texts(&storage, QUEUE).await.is_empty(), "nothing sent");

    // From stdin, to a base64 queue.
    let sent = run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Base64).args(["enqueue", "--raw", "-"]),
        Some(&bytes),
    )
    .await;
    sent.assert_success();
    let queue = storage.queue(QUEUE).unwrap();
    let messages = queue.receive(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(
        MessageEncoding::Base64.decode(&messages[0].body).unwrap(),
        bytes
    );

    let empty = run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Text).args(["enqueue", "--raw"]),
        Some(b""),
    )
    .await;
    empty.assert_refused("empty");
}
