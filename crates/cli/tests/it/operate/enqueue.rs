//! `spot-worker enqueue`.

use spot_worker_storage::{
    Checkpoint, CheckpointStore as _, MessageEncoding, ResultStore as _, WritePrecondition,
};

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_sends_every_good_line_and_names_the_bad_ones() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let (_dir, path) = input_file(concat!(
        "{\"job_id\":\"a\",\"n\":1}\n",
        "\n",
        "{\"job_id\": \"b\", \"text\": \"h\u{e9}llo <&>\"}\r\n",
        "{not json\n",
        "{\"job_id\":\"c\"}", // no final line break
    ));

    let output = enqueue_file(&azurite, &[], &path).await;

    assert_eq!(output.code, Some(1), "bad lines fail the run at the end");
    output.assert_stderr_has("line 4: not JSON");
    output.assert_stdout_has("3 sent to queue jobs (text)");
    output.assert_stdout_has("1 bad");
    // Every good line, the one after the bad line too, exactly as written.
    assert_eq!(
        peek_texts(&storage, QUEUE).await,
        vec![
            "{\"job_id\": \"b\", \"text\": \"h\u{e9}llo <&>\"}".to_owned(),
            "{\"job_id\":\"a\",\"n\":1}".to_owned(),
            "{\"job_id\":\"c\"}".to_owned(),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_never_creates_the_queue_and_stops_when_it_is_missing() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let lines: String = (0..50)
        .map(|i| format!("{{\"job_id\":\"{i}\"}}\n"))
        .collect();
    let (_dir, path) = input_file(&lines);

    let output = enqueue_file(&azurite, &[], &path).await;

    output.assert_refused("queue \"jobs\" does not exist; enqueue never creates it");
    output.assert_stderr_has("check SPOT_WORKER_QUEUE");
    output.assert_stdout_has("0 sent");
    // Stopped early: not one failed send per line.
    let failed = output.stderr.matches("not sent").count();
    assert!(failed < 50, "{failed} sends tried: {}", output.stderr);
    // Still missing: nothing created it.
    let err = storage.queue(QUEUE).unwrap().peek(1).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_skip_existing_sends_only_unfinished_jobs_base64_encoded() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let checkpoints = prepared_checkpoints(&storage).await;
    let done = Checkpoint::Completed {
        result: serde_json::json!(42),
    };
    let started = Checkpoint::InProgress {
        progress: serde_json::json!({"next": 7}),
    };
    checkpoints
        .write("done", &done, WritePrecondition::Create, None)
        .await
        .unwrap();
    checkpoints
        .write("started", &started, WritePrecondition::Create, None)
        .await
        .unwrap();
    let results = storage.result_store("results").unwrap();
    results.prepare().await.unwrap();
    results.put_new("has-result.json", b"{}").await.unwrap();
    let input = concat!(
        "{\"job_id\":\"done\"}\n",
        "{\"job_id\":\"started\"}\n",
        "{\"job_id\":\"has-result\"}\n",
        "{\"job_id\":\"new\",\"text\":\"\u{e9}\"}\n",
    );

    let output = run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Base64).args([
            "enqueue",
            "--skip-existing",
            "--results",
            "results",
            "-",
        ]),
        Some(input.as_bytes()),
    )
    .await;

    output.assert_success();
    assert!(
        output
            .stdout
            .starts_with("2 sent to queue jobs (base64), 2 skipped as already done"),
        "{}",
        output.stdout
    );
    let sent: Vec<String> = peek_texts(&storage, QUEUE)
        .await
        .iter()
        .map(|text| String::from_utf8(MessageEncoding::Base64.decode(text).unwrap()).unwrap())
        .collect();
    let mut expected = vec![
        "{\"job_id\":\"new\",\"text\":\"\u{e9}\"}".to_owned(),
        "{\"job_id\":\"started\"}".to_owned(),
    ];
    expected.sort();
    let mut sent = sent;
    sent.sort();
    assert_eq!(sent, expected);

    // A line without a job id cannot be checked, so it is refused.
    let output = run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Base64).args(["enqueue", "--skip-existing"]),
        Some(b"{\"id\":1}\n"),
    )
    .await;
    assert_eq!(output.code, Some(1));
    assert!(
        output
            .stderr
            .contains("line 1: no non-empty string `job_id`")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_names_a_missing_file_and_a_missing_environment() {
    let azurite = start_azurite();
    let output =
        run(spot_worker(&azurite, MessageEncoding::Text)
            .args(["enqueue", "/nonexistent/jobs.jsonl"]))
        .await;
    output.assert_refused("opening /nonexistent/jobs.jsonl");

    // Input that fails to read: said so, with the line it stopped at.
    let dir = tempfile::tempdir().unwrap();
    let output = enqueue_file(&azurite, &[], dir.path()).await;
    output.assert_refused("reading line 1: ");
    assert!(output.stdout.starts_with("0 sent"), "{}", output.stdout);

    let output = run(spot_worker(&azurite, MessageEncoding::Text)
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .args(["enqueue", "-"]))
    .await;
    output.assert_refused("AZURE_STORAGE_CONNECTION_STRING");
    assert!(!output.stderr.contains("panicked"));
}

/// What a worker reads as its own is refused before anything is sent: a
/// probe's or an envelope's body (`--raw`, with or without a deadline),
/// a `job_id` under `.spot-worker/`; every other line still goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_refuses_reserved_words_and_sends_nothing_for_them() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    for body in ["spot-worker-probe/1", "spot-worker-job/1 {}\n{}"] {
        let (_dir, path) = input_file(body);
        let output = enqueue_file(&azurite, &["--raw"], &path).await;
        assert_eq!(output.code, Some(1), "{body:?}: {}", output.stderr);
        assert!(
            output.stderr.contains("is reserved for"),
            "{body:?}: {}",
            output.stderr
        );
    }
    let (_dir, path) = input_file(concat!(
        "{\"job_id\":\".spot-worker/lanes/j1\"}\n",
        "{\"job_id\":\"j2\"}\n",
    ));
    let output = enqueue_file(&azurite, &[], &path).await;
    output.assert_refused("line 1: the job key \".spot-worker/lanes/j1\"");
    assert_eq!(
        peek_texts(&storage, QUEUE).await,
        vec!["{\"job_id\":\"j2\"}".to_owned()]
    );
}
