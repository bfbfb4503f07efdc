//! Which storage operations the operator's commands and the deployed worker
//! really issue, so the role assignments in `bicep/` can be checked against
//! them (`tools/infra/permissions.py`, docs/deploying.md "What each
//! identity may do").
//!
//! Against one Azurite with its debug log on, the deployment's queues and
//! containers are created as `bicep/modules/storage.bicep` creates them;
//! then every operator command of docs/operating.md runs as the unmodified
//! `spot-worker` binary (`enqueue`, `status`, `poison list/show/requeue/
//! purge`, `checkpoints list/show/delete`, `enqueue --skip-existing`,
//! `results get`, `enqueue --raw`, `enqueue --deadline --work` to either
//! lane), and the deployed worker (`examples/primes`, with the environment
//! file the templates render, only its credentials and IMDS swapped as in
//! `tests/it/deploy.rs`) takes jobs: one succeeds, two are poisoned (one
//! inline, one kept as a claim-check blob), one with a deadline it can no
//! longer make on Spot moves to the regular lane, one is drained by
//! SIGTERM; then the regular lane's worker (the same files, rendered for
//! the regular scale set) runs the jobs in the regular lane, taking its
//! turn at the lane keeper as every worker does (docs/deploying.md, "The two lanes"). The
//! operations Azurite logged for each (by a marker request between them)
//! are written as `tools/infra/storage-operations-used.json`: this test
//! fails if they differ from the file committed, so a command that starts
//! issuing a new operation cannot go unnoticed
//! (`SPOT_WORKER_UPDATE_OPERATIONS=1` rewrites it; then the permission
//! check says whether the roles still cover it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use crate::permissions::{Operation, Recorder, by_command};
use crate::rendered::{LocalVm, local_vm, render, repo, sample_deployment_values, worker_binary};
use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::decisions::lanes::Deadline;
use spot_worker::storage::lanes::Enqueued;
use spot_worker::storage::{MessageEncoding, MessageQueue, PoisonRecord};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::Azurite;
use tokio::process::Command;

/// Where the recorded operations are kept (read by tools/infra/permissions.py).
const OPERATIONS_FILE: &str = "tools/infra/storage-operations-used.json";
/// Bound on each command and wait: generous for a slow machine.
const PATIENCE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_and_the_worker_issue_the_recorded_storage_operations() {
    let env = render(&sample_deployment_values()).env;
    let azurite = tokio::task::spawn_blocking(Azurite::start_recording)
        .await
        .unwrap()
        .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
    let storage = AzureStorage::new(
        StorageConfig::from_connection_string(&azurite.connection_string()).unwrap(),
    )
    .unwrap();
    let queue_name = env["SPOT_WORKER_QUEUE"].clone();
    let checkpoints = env["SPOT_WORKER_CHECKPOINT_CONTAINER"].clone();
    let results = env["SPOT_WORKER_RESULTS_CONTAINER"].clone();

    let regular_name = env["SPOT_WORKER_REGULAR_QUEUE"].clone();

    // The deployment (storage.bicep): the queues (both lanes', and their
    // one poison queue) and containers exist.
    for queue in [
        queue_name.clone(),
        format!("{queue_name}-poison"),
        regular_name.clone(),
    ] {
        storage
            .queue(&queue)
            .unwrap()
            .create_if_missing()
            .await
            .unwrap();
    }
    for container in [
        checkpoints.as_str(),
        results.as_str(),
        "poison",
        "artifacts",
    ] {
        storage
            .checkpoint_store(container)
            .unwrap()
            .create_container_if_missing()
            .await
            .unwrap();
    }
    let mut recorder = Recorder::new(&azurite, storage.clone());
    let mut operator: BTreeMap<String, Vec<Operation>> = BTreeMap::new();
    let cli = spot_worker_testkit::chaos::cli_binary().expect("the spot-worker command");
    let operator_env = operator_env(&azurite, &env);
    let dir = tempfile::tempdir().unwrap();

    // enqueue: a long job first (it is still running when the worker is
    // stopped), a job that succeeds, one the worker refuses (poisoned
    // inline) and one too big for its poison record (kept as a blob).
    let long = PrimesJob::new("long", 0, 200_000_000_000).unwrap();
    let small = PrimesJob::new("small", 0, 100_000).unwrap();
    let jobs = format!(
        "{}\n{}\n{}\n{}\n",
        long.to_message(),
        small.to_message(),
        r#"{"job_id":"bad","start":50,"end":10}"#,
        format_args!(r#"{{"job_id":"big","data":"{}"}}"#, "x".repeat(64_900)),
    );
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, &jobs).unwrap();
    let file = file.display().to_string();
    let mut run = Runner {
        recorder: &mut recorder,
        operator: &mut operator,
        cli: &cli,
        env: &operator_env,
    };
    run.record("enqueue", &["enqueue", &file]).await;

    // A job with a deadline it can no longer make on Spot, waiting in the
    // Spot lane (enqueued when it still could): the worker that claims it,
    // or the lane keeper before, moves it to the regular lane.
    let behind = PrimesJob::new("behind", 0, 100_000).unwrap();
    let now = SystemTime::now();
    let deadline = Deadline {
        start: now - Duration::from_secs(3600),
        due: now + Duration::from_secs(3600),
        work: Duration::from_secs(3500),
    };
    let text = Enqueued::new(
        behind.to_message().as_bytes(),
        Some(deadline),
        MessageEncoding::Text,
        Duration::from_secs(360),
        Duration::from_secs(60),
    )
    .unwrap()
    .text;
    storage
        .queue(&queue_name)
        .unwrap()
        .send(&text, Duration::ZERO)
        .await
        .unwrap();

    // The deployed worker.
    run.recorder.discard().await;
    run_worker(&azurite, &env, |log| {
        // The long job has counted a chunk, so its drain has progress to
        // save (stopped before its first chunk, it would have none).
        log.lines()
            .any(|line| line.contains("chunk counted") && line.contains("\"long\""))
            && log.matches("\"job completed\"").count() >= 1
            && log.matches("moved to the poison queue").count() >= 2
            && log.contains("moved to the regular lane")
    })
    .await;
    let worker = run.recorder.operations().await;

    // enqueue --deadline: one job with slack (the Spot lane), one without
    // (straight to the regular lane).
    let roomy = dir.path().join("roomy.jsonl");
    std::fs::write(
        &roomy,
        format!(
            "{}\n",
            PrimesJob::new("roomy", 0, 100_000).unwrap().to_message()
        ),
    )
    .unwrap();
    run.record(
        "enqueue --deadline --work (the Spot lane)",
        &[
            "enqueue",
            "--deadline",
            "52h",
            "--work",
            "48h",
            &roomy.display().to_string(),
        ],
    )
    .await;
    let urgent = dir.path().join("urgent.jsonl");
    std::fs::write(
        &urgent,
        format!(
            "{}\n",
            PrimesJob::new("urgent", 0, 100_000).unwrap().to_message()
        ),
    )
    .unwrap();
    run.record(
        "enqueue --deadline --work (the regular lane)",
        &[
            "enqueue",
            "--deadline",
            "2h",
            "--work",
            "119m",
            &urgent.display().to_string(),
        ],
    )
    .await;

    // The regular lane's worker: the moved job and the urgent one.
    let regular_env = render(&regular_deployment_values()).env;
    run.recorder.discard().await;
    run_worker(&azurite, &regular_env, |log| {
        log.matches("\"job completed\"").count() >= 2
    })
    .await;
    let regular_worker = run.recorder.operations().await;

    // The operator's view and the poison records.
    run.record("status", &["status", "--json"]).await;
    run.record("poison list", &["poison", "list"]).await;
    run.record("poison list --all", &["poison", "list", "--all"])
        .await;
    let records: Vec<(String, PoisonRecord)> = storage
        .poison_queue(&queue_name)
        .unwrap()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let record = PoisonRecord::from_message_text(&m.body).unwrap();
            (m.id.as_str().to_owned(), record)
        })
        .collect();
    assert_eq!(records.len(), 2, "two records: {records:?}");
    let (inline, _) = records
        .iter()
        .find(|(_, r)| r.body_blob.is_none())
        .expect("an inline record");
    let (claim_check, _) = records
        .iter()
        .find(|(_, r)| r.body_blob.is_some())
        .expect("a claim-check record");
    run.record("poison show", &["poison", "show", inline.as_str()])
        .await;
    run.record(
        "poison show (claim-check original)",
        &["poison", "show", "--raw", claim_check.as_str()],
    )
    .await;
    run.record("poison requeue", &["poison", "requeue", inline.as_str()])
        .await;
    run.record(
        "poison purge (claim-check original)",
        &["poison", "purge", "--yes", claim_check.as_str()],
    )
    .await;
    run.record("checkpoints list", &["checkpoints", "list"])
        .await;
    run.record("checkpoints show", &["checkpoints", "show", "long"])
        .await;
    run.record(
        "checkpoints delete",
        &["checkpoints", "delete", "--yes", "long"],
    )
    .await;
    run.record(
        "enqueue --skip-existing --results",
        &["enqueue", "--skip-existing", "--results", &results, &file],
    )
    .await;
    run.record("results get", &["results", "get", "small.json"])
        .await;
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "a body that is not JSON\n").unwrap();
    run.record(
        "enqueue --raw",
        &["enqueue", "--raw", &text.display().to_string()],
    )
    .await;

    let document = serde_json::json!({
        "_comment": "Written by tests/it/storage_permissions.rs (SPOT_WORKER_UPDATE_OPERATIONS=1): the storage operations each operator command and the deployed worker issued against Azurite, by queue or container. Read by tools/infra/permissions.py, which checks them against the role assignments in bicep/.",
        "principals": {
            "operator": by_command(&operator),
            "worker": by_command(&BTreeMap::from([
                (
                    "the worker (examples/primes, the deployed default)".to_owned(),
                    worker,
                ),
                (
                    "the regular lane's worker (examples/primes)".to_owned(),
                    regular_worker,
                ),
            ])),
        }
    });
    let text = format!("{}\n", serde_json::to_string_pretty(&document).unwrap());
    let path = repo().join(OPERATIONS_FILE);
    if std::env::var("SPOT_WORKER_UPDATE_OPERATIONS").as_deref() == Ok("1") {
        std::fs::write(&path, &text).unwrap();
        eprintln!("wrote {OPERATIONS_FILE}");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "the storage operations issued differ from {OPERATIONS_FILE}: a command or the worker \
         now issues other operations. Check them, rewrite the file with \
         SPOT_WORKER_UPDATE_OPERATIONS=1, then run tools/infra/permissions.py to see whether the \
         roles in bicep/ still cover them.\nnow:\n{text}"
    );
}

/// The operator's environment: the workers' settings, with Azurite's
/// connection string instead of the account URL and a signed-in identity.
fn operator_env(azurite: &Azurite, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> = env
        .iter()
        .filter(|(key, _)| {
            key.starts_with("SPOT_WORKER_") && *key != "SPOT_WORKER_STORAGE_ACCOUNT_URL"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.insert(
        "AZURE_STORAGE_CONNECTION_STRING".into(),
        azurite.connection_string(),
    );
    vars.insert("NO_PROXY".into(), "127.0.0.1,localhost".into());
    vars.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    vars
}

/// Runs operator commands, keeping what each issued.
struct Runner<'r, 'a> {
    recorder: &'r mut Recorder<'a>,
    operator: &'r mut BTreeMap<String, Vec<Operation>>,
    cli: &'r Path,
    env: &'r BTreeMap<String, String>,
}

impl Runner<'_, '_> {
    /// Runs `spot-worker args` (it must succeed); its operations are kept
    /// under `name`.
    async fn record(&mut self, name: &str, args: &[&str]) {
        self.recorder.discard().await;
        let output = tokio::time::timeout(
            PATIENCE,
            Command::new(self.cli)
                .args(args)
                .env_clear()
                .envs(self.env)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the command finishes in time")
        .unwrap();
        assert!(
            output.status.success(),
            "spot-worker {}: {}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let ops = self.recorder.operations().await;
        assert!(!ops.is_empty(), "spot-worker {name} issued nothing");
        self.operator.insert(name.to_owned(), ops);
    }
}

/// What `main.bicep` passes to `modules/compute.bicep` for the regular
/// lane's scale set.
fn regular_deployment_values() -> BTreeMap<&'static str, String> {
    let mut values = sample_deployment_values();
    values.insert("lane", "regular".to_owned());
    values.insert("concurrency", "1".to_owned());
    values
}

/// The deployed worker with the rendered environment (credentials and IMDS
/// swapped, as in tests/it/deploy.rs) until its log says `settled`, then
/// stopped by SIGTERM: it drains and exits 0. The Spot lane's worker is
/// stopped with the long job running (released); the regular lane's with
/// nothing left.
async fn run_worker(
    azurite: &Azurite,
    env: &BTreeMap<String, String>,
    settled: impl Fn(&str) -> bool,
) {
    // The emulator lives as long as the worker it answers.
    let LocalVm {
        emulator: _emulator,
        health_port: _,
        env: child_env,
    } = local_vm(env, azurite, "spotvmss_0").await;
    // The job's per-chunk progress (a debug event) tells the test the long
    // job has something to save; nothing else about the worker changes.
    let mut child_env = child_env;
    let filter = child_env
        .get("RUST_LOG")
        .cloned()
        .unwrap_or_else(|| "info".into());
    child_env.insert(
        "RUST_LOG".into(),
        format!("{filter},spot_worker_primes=debug"),
    );
    let log_path = tempfile::NamedTempFile::new().unwrap();
    let log_file = std::fs::OpenOptions::new()
        .append(true)
        .open(log_path.path())
        .unwrap();
    let mut child = Command::new(worker_binary())
        .env_clear()
        .envs(&child_env)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .expect("the worker starts");
    let log = || std::fs::read_to_string(log_path.path()).unwrap_or_default();
    let started = Instant::now();
    loop {
        let text = log();
        if settled(&text) {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the worker exited ({status}); log:\n{text}");
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the worker did not settle its jobs; log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = child.id().expect("running") as libc::pid_t;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the worker drains and exits")
        .unwrap();
    assert!(status.success(), "exit {status}; log:\n{}", log());
    if env.get("SPOT_WORKER_LANE").map(String::as_str) != Some("regular") {
        assert!(
            log().contains("released on shutdown"),
            "the long job was running and released; log:\n{}",
            log()
        );
    }
}
