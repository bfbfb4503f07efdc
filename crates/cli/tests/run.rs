//! `spot-worker run -- PROGRAM`, the real binary on a real Azurite with the
//! IMDS emulator: a program does its job with the contract's environment
//! and no credential of the runner's, and SIGTERM drains the worker to
//! exit 0.

use std::process::Stdio;
use std::time::Duration;

use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig};
use spot_worker_storage::{MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;
use tokio::process::Command;

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_gets_its_job_but_never_the_runners_credentials() {
    let azurite = tokio::task::spawn_blocking(Azurite::start)
        .await
        .unwrap()
        .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
    let emulator = Emulator::start(EmulatorConfig::for_vm("spotvmss_0"))
        .await
        .unwrap();
    let connection_string = azurite.connection_string();
    let storage =
        AzureStorage::new(StorageConfig::from_connection_string(&connection_string).unwrap())
            .unwrap();
    let queue = storage.queue("jobs").unwrap();
    queue.prepare().await.unwrap();
    queue
        .send(r#"{"job_id":"s1"}"#, Duration::ZERO)
        .await
        .unwrap();
    // Everything the program can see of itself and of its parent, the
    // runner, becomes its result.
    let program = r#"{ env; echo ---; tr '\0' '\n' < /proc/$PPID/environ; echo "read=$?"; } > "$SPOT_WORKER_RESULT" 2>&1"#;
    // Root reads every process's memory whatever the runner does; the
    // promise is for a runner that is not root (the systemd unit and the
    // container image run it as a user of its own), so a root test runs the
    // worker as `nobody` (util-linux's setpriv).
    // SAFETY: geteuid has no arguments and cannot fail.
    let mut worker = if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        command.arg(env!("CARGO_BIN_EXE_spot-worker"));
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_spot-worker"))
    };
    let worker = worker
        .args([
            "run",
            "--job-key",
            "job_id",
            "--pass-env",
            "MY_API_TOKEN",
            "--",
            "sh",
            "-c",
            program,
        ])
        .env("AZURE_STORAGE_CONNECTION_STRING", &connection_string)
        .env("SPOT_WORKER_IMDS_ENDPOINT", emulator.url())
        .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
        .env("SPOT_WORKER_QUEUE", "jobs")
        .env("MY_API_TOKEN", "passed-on-purpose")
        .env("OTHER_TOKEN", "not-for-programs")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("RUST_LOG")
        .env_remove("SPOT_WORKER_CONFIG")
        .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let results = storage.result_store("results").unwrap();
    let mut result = None;
    let started = std::time::Instant::now();
    while started.elapsed() < PATIENCE {
        if let Some(bytes) = results.get("s1").await.unwrap_or(None) {
            result = Some(String::from_utf8(bytes).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = worker.id().unwrap() as i32;
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let output = tokio::time::timeout(PATIENCE, worker.wait_with_output())
        .await
        .expect("the worker exits after SIGTERM")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let result = result.unwrap_or_else(|| panic!("no result; the worker said: {stderr}"));

    assert!(result.contains("SPOT_WORKER_JOB_KEY=s1"), "{result}");
    assert!(
        result.contains("MY_API_TOKEN=passed-on-purpose"),
        "{result}"
    );
    let key = connection_string
        .split(';')
        .find_map(|part| part.strip_prefix("AccountKey="))
        .expect("Azurite's connection string has a key");
    for secret in [key, "AZURE_STORAGE_CONNECTION_STRING", "not-for-programs"] {
        assert!(
            !result.contains(secret),
            "the program saw {secret}:\n{result}"
        );
    }
    assert!(
        !result.contains("read=0"),
        "the runner's environment was readable:\n{result}"
    );
}
