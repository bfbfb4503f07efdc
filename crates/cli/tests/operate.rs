//! The operator's commands (`enqueue`, `poison`, `checkpoints`, `status`)
//! as the unmodified binary runs them, against a real Azurite per test,
//! configured only through the worker's environment contract.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_azurite_harness::Azurite;
use spot_worker_storage::{
    CancellationToken, Checkpoint, CheckpointStore as _, Consumer, ConsumerConfig, HandlerError,
    Job, MessageEncoding, PoisonRecord, ResultStore as _, WritePrecondition, handler_fn,
};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

const QUEUE: &str = "jobs";
/// Bound on any one command: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(60);
/// Bound on any wait for a condition.
const WAIT_LIMIT: Duration = Duration::from_secs(90);

fn start_azurite() -> Azurite {
    Azurite::start().expect("azurite starts (run `npm ci --prefix tools/azurite`)")
}

/// The test's own client, for preparing and checking what the command did.
fn storage(azurite: &Azurite) -> AzureStorage {
    let config = StorageConfig::from_connection_string(&azurite.connection_string())
        .expect("valid connection string");
    AzureStorage::new(config).expect("storage client")
}

/// The binary with the worker's environment contract for `azurite`.
fn spot_worker(azurite: &Azurite, encoding: MessageEncoding) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
    command
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .env("SPOT_WORKER_QUEUE", QUEUE)
        .env(
            "SPOT_WORKER_MESSAGE_ENCODING",
            match encoding {
                MessageEncoding::Text => "text",
                MessageEncoding::Base64 => "base64",
            },
        )
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("RUST_LOG")
        .env_remove("SPOT_WORKER_CONFIG")
        .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Output {
    fn assert_success(&self) -> &Self {
        assert_eq!(self.code, Some(0), "stderr: {}", self.stderr);
        self
    }
}

async fn run(command: &mut Command) -> Output {
    run_with_stdin(command, None).await
}

async fn run_with_stdin(command: &mut Command, stdin: Option<&[u8]>) -> Output {
    let run = async {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("the binary runs");
        if let Some(bytes) = stdin {
            let mut pipe = child.stdin.take().expect("stdin is piped");
            pipe.write_all(bytes).await.expect("stdin written");
            drop(pipe);
        }
        child.wait_with_output().await.expect("the binary ran")
    };
    let output = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the command finishes in time");
    Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Every message text in `queue`, without receiving any (at most 32).
async fn peek_texts(storage: &AzureStorage, queue: &str) -> Vec<String> {
    let mut texts: Vec<String> = storage
        .queue(queue)
        .unwrap()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    texts.sort();
    texts
}

/// A file in a fresh temporary directory, removed with the returned guard.
fn input_file(lines: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.jsonl");
    std::fs::write(&path, lines).unwrap();
    (dir, path)
}

/// Polls `check` every 100 ms until it yields `Some`, for at most
/// [`WAIT_LIMIT`].
async fn poll_until<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A real consumer of the work queue (poison queue, checkpoints and
/// poison bodies as a worker has them) whose handler fails the first
/// delivery of every message text with `fail: <text>` and succeeds from
/// then on. Runs until `handled` messages succeeded and `poisoned` were
/// poisoned; returns the texts it handled.
struct FlakyWorker {
    storage: AzureStorage,
    encoding: MessageEncoding,
    failed_once: Arc<Mutex<HashSet<String>>>,
}

impl FlakyWorker {
    async fn new(storage: &AzureStorage, encoding: MessageEncoding) -> Self {
        storage
            .checkpoint_store("checkpoints")
            .unwrap()
            .prepare()
            .await
            .unwrap();
        storage
            .result_store("poison")
            .unwrap()
            .prepare()
            .await
            .unwrap();
        FlakyWorker {
            storage: storage.clone(),
            encoding,
            failed_once: Arc::default(),
        }
    }

    async fn run_until(&self, succeeded: u64, poisoned: u64) -> Vec<String> {
        let queue = self.storage.queue(QUEUE).unwrap();
        let poison = self.storage.poison_queue(QUEUE).unwrap();
        let config = ConsumerConfig {
            encoding: self.encoding,
            max_failures: 1,
            visibility_timeout: Duration::from_secs(10),
            idle_backoff_floor: Duration::from_millis(50),
            idle_backoff_max: Duration::from_millis(300),
            ..ConsumerConfig::default()
        };
        let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config)
            .unwrap()
            .with_checkpoints(Arc::new(
                self.storage.checkpoint_store("checkpoints").unwrap(),
            ))
            .with_poison_bodies(Arc::new(self.storage.result_store("poison").unwrap()));
        let handled = Arc::new(Mutex::new(Vec::new()));
        let handler = handler_fn({
            let (handled, failed_once) = (handled.clone(), self.failed_once.clone());
            move |job: Job| {
                let (handled, failed_once) = (handled.clone(), failed_once.clone());
                async move {
                    let text = job.text()?.to_owned();
                    if failed_once.lock().unwrap().insert(text.clone()) {
                        let head: String = text.chars().take(40).collect();
                        return Err::<(), HandlerError>(format!("fail: {head}").into());
                    }
                    handled.lock().unwrap().push(text);
                    Ok(())
                }
            }
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
            async move { consumer.run(handler, shutdown).await }
        });
        poll_until("the consumer to settle every message", || {
            let stats = consumer.stats();
            async move {
                (stats.succeeded >= succeeded && stats.poisoned >= poisoned).then_some(())
            }
        })
        .await;
        shutdown.cancel();
        task.await.unwrap();
        let stats = consumer.stats();
        assert_eq!((stats.succeeded, stats.poisoned), (succeeded, poisoned));
        let mut handled = handled.lock().unwrap().clone();
        handled.sort();
        handled
    }
}

/// The records in the poison queue, by peeking.
async fn poison_records(storage: &AzureStorage) -> Vec<(String, PoisonRecord)> {
    storage
        .poison_queue(QUEUE)
        .unwrap()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let record = PoisonRecord::from_message_text(&m.body).unwrap();
            (m.id.as_str().to_owned(), record)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_sends_every_good_line_and_names_the_bad_ones() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let (_dir, path) = input_file(concat!(
        "{\"job_id\":\"a\",\"n\":1}\n",
        "\n",
        "{\"job_id\": \"b\", \"text\": \"h\u{e9}llo <&>\"}\r\n",
        "{not json\n",
        "{\"job_id\":\"c\"}", // no final line break
    ));

    let output = run(spot_worker(&azurite, MessageEncoding::Text)
        .arg("enqueue")
        .arg(&path))
    .await;

    assert_eq!(output.code, Some(1), "bad lines fail the run at the end");
    assert!(
        output.stderr.contains("line 4: not JSON"),
        "{}",
        output.stderr
    );
    assert!(
        output.stdout.contains("3 sent to queue jobs (text)"),
        "{}",
        output.stdout
    );
    assert!(output.stdout.contains("1 bad"), "{}", output.stdout);
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
async fn enqueue_skip_existing_sends_only_unfinished_jobs_base64_encoded() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let checkpoints = storage.checkpoint_store("checkpoints").unwrap();
    checkpoints.prepare().await.unwrap();
    let done = Checkpoint::Completed {
        result: serde_json::json!(42),
    };
    let started = Checkpoint::InProgress {
        progress: serde_json::json!({"next": 7}),
    };
    checkpoints
        .write("done", &done, WritePrecondition::Create)
        .await
        .unwrap();
    checkpoints
        .write("started", &started, WritePrecondition::Create)
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
    assert_eq!(output.code, Some(1));
    assert!(
        output.stderr.contains("opening /nonexistent/jobs.jsonl"),
        "{}",
        output.stderr
    );

    // Input that fails to read: said so, with the line it stopped at.
    let dir = tempfile::tempdir().unwrap();
    let output = run(spot_worker(&azurite, MessageEncoding::Text)
        .arg("enqueue")
        .arg(dir.path()))
    .await;
    assert_eq!(output.code, Some(1));
    assert!(
        output.stderr.contains("reading line 1: "),
        "{}",
        output.stderr
    );
    assert!(output.stdout.starts_with("0 sent"), "{}", output.stdout);

    let output = run(spot_worker(&azurite, MessageEncoding::Text)
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .args(["enqueue", "-"]))
    .await;
    assert_eq!(output.code, Some(1));
    assert!(
        output.stderr.contains("AZURE_STORAGE_CONNECTION_STRING"),
        "{}",
        output.stderr
    );
    assert!(!output.stderr.contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_poison_message_goes_back_byte_for_byte_and_then_succeeds() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    // One small job, and one whose original is too big for its poison
    // record, so it is kept as a claim-check blob.
    let small = "{\"job_id\":\"small\",\"text\":\"h\u{e9}llo <&>\"}".to_owned();
    let big = format!("{{\"job_id\":\"big\",\"data\":\"{}\"}}", "x".repeat(64_960));
    let (_dir, path) = input_file(&format!("{small}\n{big}\n"));
    run(spot_worker(&azurite, MessageEncoding::Text)
        .arg("enqueue")
        .arg(&path))
    .await
    .assert_success();
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
    assert!(list.stdout.contains("2 record(s)"), "{}", list.stdout);
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
    assert!(all.stdout.contains(big_id.as_str()), "{}", all.stdout);
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
    assert!(show.stdout.contains("sha256 "), "{}", show.stdout);
    assert!(show.stdout.contains("verified"), "{}", show.stdout);

    let requeue =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "requeue", "--all"]))
            .await;
    requeue.assert_success();
    assert!(
        requeue
            .stdout
            .contains("2 requeued, 0 left in place, 0 failed"),
        "{}",
        requeue.stdout
    );
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
    let storage = storage(&azurite);
    run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Text).args(["enqueue", "-"]),
        Some(b"{\"job_id\":\"alpha\"}\n{\"job_id\":\"beta\"}\n"),
    )
    .await
    .assert_success();
    FlakyWorker::new(&storage, MessageEncoding::Text)
        .await
        .run_until(0, 2)
        .await;

    // No terminal and no --yes: refused, nothing deleted.
    let refused =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "purge", "--all"])).await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("refusing without --yes"),
        "{}",
        refused.stderr
    );
    assert_eq!(poison_records(&storage).await.len(), 2);

    // Neither ids nor a filter: clap names what is missing.
    let usage = run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "purge"])).await;
    assert_eq!(usage.code, Some(2));
    assert!(
        usage.stderr.contains("--reason-contains"),
        "{}",
        usage.stderr
    );

    let purged = run(spot_worker(&azurite, MessageEncoding::Text).args([
        "poison",
        "purge",
        "--reason-contains",
        "alpha",
        "--yes",
    ]))
    .await;
    purged.assert_success();
    assert!(
        purged.stdout.contains("1 purged, 1 left in place"),
        "{}",
        purged.stdout
    );
    let left = poison_records(&storage).await;
    assert_eq!(left.len(), 1);
    assert!(left[0].1.last_error.contains("beta"), "{:?}", left[0].1);

    let unknown =
        run(spot_worker(&azurite, MessageEncoding::Text).args(["poison", "show", "no-such-id"]))
            .await;
    assert_eq!(unknown.code, Some(1));
    assert!(
        unknown.stderr.contains("no record \"no-such-id\""),
        "{}",
        unknown.stderr
    );
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
/// as crates/azure/tests/python_interop.rs does.
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
    let storage = storage(&azurite);
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
    assert!(
        requeue.stdout.contains("1 requeued, 1 left in place"),
        "{}",
        requeue.stdout
    );
    let received = python(&azurite, &["receive-base64", QUEUE]).await;
    let received = received.as_array().expect("a list");
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0]["content"], texts[0]);
    assert_eq!(poison_records(&storage).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_listed_shown_and_deleted_but_never_the_workers_records() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = storage.checkpoint_store("checkpoints").unwrap();
    store.prepare().await.unwrap();
    let checkpoints = [
        (
            "job-a",
            Checkpoint::InProgress {
                progress: serde_json::json!({"next": 7}),
            },
        ),
        (
            "job-b",
            Checkpoint::Completed {
                result: serde_json::json!(42),
            },
        ),
        // Where the consumer keeps an attempt record: not a job.
        (
            ".spot-worker/attempts/m1",
            Checkpoint::InProgress {
                progress: serde_json::json!({"failures": 1}),
            },
        ),
    ];
    for (key, checkpoint) in &checkpoints {
        store
            .write(key, checkpoint, WritePrecondition::Create)
            .await
            .unwrap();
    }
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    let list = run(cli().args(["checkpoints", "list"])).await;
    list.assert_success();
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", list.stdout);
    assert!(lines[1].starts_with("job-a "), "{}", lines[1]);
    assert!(lines[1].contains("in_progress"), "{}", lines[1]);
    assert!(lines[1].ends_with("{\"next\":7}"), "{}", lines[1]);
    assert!(lines[2].starts_with("job-b "), "{}", lines[2]);
    assert!(lines[2].contains("completed"), "{}", lines[2]);
    assert!(lines[2].contains(" ago "), "{}", lines[2]);
    assert_eq!(lines[3], "2 job checkpoint(s) in container checkpoints");

    let json = run(cli().args(["checkpoints", "list", "--in-progress", "--json"])).await;
    json.assert_success();
    let documents: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(documents.as_array().unwrap().len(), 1, "{documents}");
    assert_eq!(documents[0]["job"], "job-a");
    assert_eq!(documents[0]["status"], "in_progress");
    assert_eq!(documents[0]["progress"]["next"], 7);
    assert!(documents[0]["last_write"].is_string(), "{documents}");

    let show = run(cli().args(["checkpoints", "show", "job-a"])).await;
    show.assert_success();
    assert!(
        show.stdout.contains("status:      in_progress"),
        "{}",
        show.stdout
    );
    assert!(show.stdout.contains("\"next\": 7"), "{}", show.stdout);
    let missing = run(cli().args(["checkpoints", "show", "nope"])).await;
    assert_eq!(missing.code, Some(1));
    assert!(
        missing.stderr.contains("no checkpoint for job \"nope\""),
        "{}",
        missing.stderr
    );

    let refused = run(cli().args(["checkpoints", "delete", "job-b"])).await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("refusing without --yes"),
        "{}",
        refused.stderr
    );
    let records =
        run(cli().args(["checkpoints", "delete", ".spot-worker/attempts/m1", "--yes"])).await;
    assert_eq!(records.code, Some(1));
    assert!(
        records.stderr.contains("the worker's own records"),
        "{}",
        records.stderr
    );
    let deleted = run(cli().args(["checkpoints", "delete", "job-b", "--yes"])).await;
    deleted.assert_success();
    assert!(store.read("job-b").await.unwrap().is_none());
    assert!(store.read("job-a").await.unwrap().is_some());
    assert!(
        store
            .read(".spot-worker/attempts/m1")
            .await
            .unwrap()
            .is_some()
    );
}

/// A port on loopback nobody listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_queues_the_jobs_in_progress_and_the_workers_readiness() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    run_with_stdin(
        spot_worker(&azurite, MessageEncoding::Text).args(["enqueue", "-"]),
        Some(b"{\"job_id\":\"a\"}\n{\"job_id\":\"b\"}\n"),
    )
    .await
    .assert_success();
    let store = storage.checkpoint_store("checkpoints").unwrap();
    store.prepare().await.unwrap();
    let running = Checkpoint::InProgress {
        progress: serde_json::json!({"done": 3, "of": 10}),
    };
    store
        .write("a", &running, WritePrecondition::Create)
        .await
        .unwrap();
    let done = Checkpoint::Completed {
        result: serde_json::json!(1),
    };
    store
        .write("b", &done, WritePrecondition::Create)
        .await
        .unwrap();
    let nobody = format!("http://127.0.0.1:{}", closed_port());
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    let screen = run(cli().args(["status", "--health", &nobody])).await;
    screen.assert_success();
    let text = &screen.stdout;
    assert!(text.contains("queue   jobs"), "{text}");
    assert!(
        text.contains("~2 message(s), oldest visible waiting"),
        "{text}"
    );
    assert!(text.contains("poison  jobs-poison"), "{text}");
    assert!(text.contains("~0 message(s)"), "{text}");
    assert!(
        text.contains("jobs    1 in progress, 1 completed"),
        "{text}"
    );
    assert!(text.contains("{\"done\":3,\"of\":10}"), "{text}");
    assert!(text.contains(&format!("{nobody}/readyz")), "{text}");
    assert!(text.contains("NOT READY (unreachable)"), "{text}");

    // A real worker on the same storage: ready once its gate opened.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = format!("http://{}", listener.local_addr().unwrap());
    let mut config = spot_worker::WorkerConfig {
        queue: QUEUE.to_owned(),
        ..spot_worker::WorkerConfig::default()
    };
    config.imds.enabled = false; // not an Azure VM
    config.shutdown.handle_signals = false;
    config.shutdown.watchdog = false;
    let worker = spot_worker::Worker::new(
        config,
        Arc::new(storage.queue(QUEUE).unwrap()),
        Arc::new(storage.poison_queue(QUEUE).unwrap()),
    )
    .with_checkpoints(Arc::new(store))
    .with_health_listener(listener);
    let stop = worker.shutdown_token();
    let mut readiness = worker.readiness();
    let handler = handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) });
    let task = tokio::spawn(worker.run(handler));
    tokio::time::timeout(WAIT_LIMIT, readiness.wait_for(|r| r.is_ready()))
        .await
        .expect("the worker gets ready in time")
        .unwrap();

    let json = run(cli().args([
        "status",
        "--json",
        "--watch",
        "--interval",
        "100ms",
        "--count",
        "2",
        "--health",
        &health,
    ]))
    .await;
    json.assert_success();
    let screens: Vec<serde_json::Value> = json
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(screens.len(), 2, "{}", json.stdout);
    let last = &screens[1];
    assert_eq!(last["workers"][0]["ready"], true, "{last}");
    assert_eq!(last["workers"][0]["detail"], "200 OK", "{last}");
    assert_eq!(last["poison"]["name"], "jobs-poison");
    assert_eq!(last["jobs_in_progress"][0]["job"], "a");
    assert_eq!(last["jobs_in_progress"][0]["progress"]["done"], 3);
    assert_eq!(last["completed_jobs"], 1);
    assert!(last["queue"]["approximate_depth"].is_u64(), "{last}");

    stop.cancel();
    tokio::time::timeout(WAIT_LIMIT, task)
        .await
        .expect("the worker stops in time")
        .unwrap()
        .unwrap();

    let bad = run(cli().args(["status", "--health", "10.0.0.4:8080"])).await;
    assert_eq!(bad.code, Some(1));
    assert!(bad.stderr.contains("is not a URL"), "{}", bad.stderr);
}
