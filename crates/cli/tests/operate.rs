//! The operator's commands (`enqueue`, `poison`, `checkpoints`, `status`)
//! as the unmodified binary runs them, against a real Azurite per test,
//! configured only through the worker's environment contract.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_azurite_harness::Azurite;
use spot_worker_storage::{
    Checkpoint, CheckpointStore as _, MessageEncoding, ResultStore as _, WritePrecondition,
};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

const QUEUE: &str = "jobs";
/// Bound on any one command: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(60);

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
