//! Bad bytes from operators and programs stay harmless: a text the queue
//! cannot carry is refused before it is sent (one such message made every
//! receive of the queue fail on Azurite), and what programs wrote is shown
//! escaped on a terminal, exactly when piped.

use std::time::Duration;

use spot_worker_consumer::PoisonRecord;
use spot_worker_storage::{
    Checkpoint, CheckpointStore as _, MessageEncoding, MessageQueue as _, WritePrecondition,
};

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_text_the_queue_cannot_carry_is_refused_and_the_queue_keeps_working() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("body.txt");
    std::fs::write(&path, b"job one\x01 with a control character").unwrap();

    let refused = enqueue_file(&azurite, &["--raw"], &path).await;
    assert_eq!(refused.code, Some(1), "{}", refused.stdout);
    assert!(
        refused.stderr.contains("U+0001 at byte 7")
            && refused.stderr.contains("cannot carry")
            && refused
                .stderr
                .contains("SPOT_WORKER_MESSAGE_ENCODING=base64"),
        "{}",
        refused.stderr
    );
    // A JSON line with U+FFFF as it is: refused by its number, the rest sent.
    let (_lines, lines) = input_file(
        "{\"job_id\":\"a\"}\n{\"job_id\":\"b\",\"x\":\"\u{ffff}\"}\n{\"job_id\":\"c\"}\n",
    );
    let sent = enqueue_file(&azurite, &[], &lines).await;
    sent.assert_refused("line 2: not sendable: U+FFFF");

    // The queue still works: what was sent is received, and so is what is
    // sent next.
    let good = run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Text).args(["enqueue", "--raw"]),
        Some(b"after"),
    )
    .await;
    good.assert_success();
    let queue = storage.queue(QUEUE).unwrap();
    let mut bodies: Vec<String> = queue
        .receive(32, Duration::from_secs(30))
        .await
        .expect("receiving from the queue works")
        .into_iter()
        .map(|message| message.body)
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["after", "{\"job_id\":\"a\"}", "{\"job_id\":\"c\"}"]
    );

    // The bytes themselves go through a base64 queue.
    let base64 = run(spot_worker(&azurite, MessageEncoding::Base64)
        .args(["enqueue", "--raw"])
        .arg(&path))
    .await;
    base64.assert_success();
}

/// What a terminal would act on, written by a program: a window title, a
/// screen clear, a colour, a carriage return that hides what precedes it.
const HOSTILE: &str = "cursor=7\x1b]0;owned\x07\x1b[2J\x1b[31m\rfake line";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_show_escapes_a_programs_control_characters_on_a_terminal_only() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = prepared_checkpoints(&storage).await;
    let checkpoint = Checkpoint::InProgress {
        progress: spot_worker_command::to_progress(HOSTILE.as_bytes()),
    };
    store
        .write("hostile", &checkpoint, WritePrecondition::Create, None)
        .await
        .unwrap();

    let shown = run_on_a_terminal(
        &azurite,
        MessageEncoding::Text,
        &["checkpoints", "show", "hostile"],
    )
    .await;
    shown.assert_success();
    assert!(
        shown
            .stdout
            .contains("cursor=7\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{1b}[31m\\u{d}fake line"),
        "{:?}",
        shown.stdout
    );
    assert!(!shown.stdout.contains('\x1b'), "{:?}", shown.stdout);
    let listed = run_on_a_terminal(&azurite, MessageEncoding::Text, &["checkpoints", "list"]).await;
    listed.assert_success();
    assert!(!listed.stdout.contains('\x1b'), "{:?}", listed.stdout);

    // Piped, the bytes are the program's, exactly.
    let piped =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["checkpoints", "show", "hostile"]))
            .await;
    piped.assert_success();
    assert!(piped.stdout.contains(HOSTILE), "{:?}", piped.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_show_escapes_a_programs_stderr_and_the_body_on_a_terminal_only() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    // As a worker writes it: the program's stderr in the reason, and a body
    // with a C1 control (a CSI to some terminals) and a right-to-left
    // override, both characters a queue message may carry.
    let body = "job \u{9b}31m \u{202e}txt.exe";
    let record = PoisonRecord {
        queue: QUEUE.to_owned(),
        original_id: "m1".to_owned(),
        dequeue_count: 5,
        failures: 5,
        inserted_at: None,
        poisoned_at: time::OffsetDateTime::now_utc(),
        last_error: format!("job m1: exited with status 1; stderr ends with:\n{HOSTILE}"),
        last_error_truncated: false,
        encoding: MessageEncoding::Text,
        body: Some(body.to_owned()),
        body_blob: None,
    };
    let text = record.to_message_text().unwrap().unwrap();
    let poison = storage.queue(&format!("{QUEUE}-poison")).unwrap();
    let id = poison.send(&text, Duration::ZERO).await.unwrap();

    for args in [
        &["poison", "show", id.as_str()][..],
        &["poison", "show", "--raw", id.as_str()],
        &["poison", "list"],
        &["poison", "list", "--json"],
    ] {
        let shown = run_on_a_terminal(&azurite, MessageEncoding::Text, args).await;
        shown.assert_success();
        for raw in ['\x1b', '\x07', '\u{9b}', '\u{202e}'] {
            assert!(
                !shown.stdout.contains(raw),
                "{args:?} wrote {raw:?} to the terminal: {:?}",
                shown.stdout
            );
        }
    }
    let shown = run_on_a_terminal(
        &azurite,
        MessageEncoding::Text,
        &["poison", "show", id.as_str()],
    )
    .await;
    assert!(
        shown.stdout.contains("\\u{1b}]0;owned")
            && shown.stdout.contains("job \\u{9b}31m \\u{202e}txt.exe"),
        "{:?}",
        shown.stdout
    );

    // Piped, `--raw` gives the body exactly.
    let piped = run(spot_worker(&azurite, MessageEncoding::Text).args([
        "poison",
        "show",
        "--raw",
        id.as_str(),
    ]))
    .await;
    piped.assert_success();
    assert_eq!(piped.stdout, body);
}
