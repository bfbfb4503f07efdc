//! The deployment, rehearsed locally: the cloud-init document is rendered the
//! way `bicep/modules/compute.bicep` renders it for the scale set (its
//! `var x = replace(...)` chain is evaluated literally), the systemd unit and
//! the environment file are taken out of the rendered document, and the REAL
//! worker binary (`examples/primes`, built by `cargo test`) is started with
//! that environment, against Azurite and the IMDS emulator.
//!
//! Only what cannot exist off Azure is swapped, and nothing else:
//! - the credential source: `SPOT_WORKER_STORAGE_ACCOUNT_URL` +
//!   `AZURE_CLIENT_ID` (managed identity) become Azurite's
//!   `AZURE_STORAGE_CONNECTION_STRING`;
//! - `SPOT_WORKER_IMDS_ENDPOINT`: the emulator instead of 169.254.169.254;
//! - `SPOT_WORKER_HEALTH_ADDR`: a free port instead of 8080;
//! - `APPLICATIONINSIGHTS_CONNECTION_STRING` is dropped (no export off Azure).
//!
//! Queue, containers, drain budget, release margin, gate timeout and log
//! settings are the VM's. The worker must become ready, process a job
//! (result correct), and on a Preempt drain a running job and exit 0 within
//! the drain budget.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::runtime::{EXIT_MARGIN, STOP_TIMEOUT, WorkerConfig};
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_azurite_harness::Azurite;
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec};
use spot_worker_primes::PrimesJob;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The scale set VM the emulator serves (Flexible scale sets name VMs
/// `{scale set}_{suffix}`).
const VM: &str = "spotvmss_0";
/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(120);
/// Where cloud-init puts the files the unit refers to.
const ENV_FILE: &str = "/etc/spot-worker/worker.env";
const UNIT_FILE: &str = "/etc/systemd/system/spot-worker.service";

/// What `main.bicep` passes to `modules/compute.bicep` (sample account and
/// identity: they are swapped for Azurite below, as documented).
fn deployment_values() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (
            "storageBlobEndpoint",
            "https://spotworkerabc123.blob.core.windows.net/".to_owned(),
        ),
        (
            "identityClientId",
            "00000000-0000-0000-0000-000000000001".to_owned(),
        ),
        ("queueName", "jobs".to_owned()),
        ("checkpointContainer", "checkpoints".to_owned()),
        ("resultsContainer", "results".to_owned()),
        (
            "appInsightsConnectionString",
            "InstrumentationKey=00000000-0000-0000-0000-000000000002;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/".to_owned(),
        ),
        (
            "workerBinaryUrl",
            "https://spotworkerabc123.blob.core.windows.net/artifacts/spot-worker-primes".to_owned(),
        ),
        ("workerBinarySha256", "0".repeat(64)),
    ])
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/examples/primes`, next to this test's `deps/` folder.
fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("primes{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the worker binary {} does not exist: run `cargo test` (which builds examples) \
         or `cargo build --example primes` first",
        binary.display()
    );
    binary
}

/// Evaluates compute.bicep's `var` chain: `loadTextContent('…')`,
/// `replace(var, '{{token}}', expr)`, `base64(var)`, vars and parameters.
fn render_compute_vars() -> BTreeMap<String, String> {
    let compute = repo().join("bicep/modules/compute.bicep");
    let text = std::fs::read_to_string(&compute).unwrap();
    let params = deployment_values();
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("var ") else {
            continue;
        };
        let (name, expr) = rest.split_once(" = ").expect("var NAME = EXPR");
        let value = evaluate(expr.trim(), &vars, &params, compute.parent().unwrap());
        vars.insert(name.to_owned(), value);
    }
    vars
}

fn evaluate(
    expr: &str,
    vars: &BTreeMap<String, String>,
    params: &BTreeMap<&str, String>,
    dir: &Path,
) -> String {
    if let Some(path) = expr
        .strip_prefix("loadTextContent('")
        .and_then(|e| e.strip_suffix("')"))
    {
        return std::fs::read_to_string(dir.join(path)).unwrap();
    }
    if let Some(inner) = expr
        .strip_prefix("base64(")
        .and_then(|e| e.strip_suffix(')'))
    {
        return base64_encode(evaluate(inner, vars, params, dir).as_bytes());
    }
    if let Some(args) = expr
        .strip_prefix("replace(")
        .and_then(|e| e.strip_suffix(')'))
    {
        let (source, rest) = args.split_once(", '").expect("replace(var, 'token', expr)");
        let (token, with) = rest.split_once("', ").expect("replace(var, 'token', expr)");
        return evaluate(source, vars, params, dir)
            .replace(token, &evaluate(with, vars, params, dir));
    }
    if let Some(value) = vars.get(expr) {
        return value.clone();
    }
    if let Some(value) = params.get(expr) {
        return value.clone();
    }
    panic!("tests/deploy.rs cannot evaluate compute.bicep expression {expr:?}: extend evaluate()");
}

/// The `write_files` of the rendered cloud-config (`path` → decoded content).
/// The document is ours: each entry has `- path:` and a one-line base64
/// `content:`; `cloud-init schema` validates it in scripts/test.sh.
fn written_files(cloud_config: &str) -> BTreeMap<String, String> {
    assert!(cloud_config.starts_with("#cloud-config\n"));
    let mut files = BTreeMap::new();
    let mut path = None;
    for line in cloud_config.lines() {
        let line = line.trim();
        if let Some(p) = line.strip_prefix("- path: ") {
            path = Some(p.to_owned());
        } else if let Some(content) = line.strip_prefix("content: ") {
            let path = path.take().expect("content follows its path");
            let bytes = base64_decode(content);
            files.insert(path, String::from_utf8(bytes).expect("text files"));
        }
    }
    files
}

/// `KEY=VALUE` lines as systemd's `EnvironmentFile=` reads them (comments,
/// blank lines, optional double quotes).
fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_owned(), v.to_owned())
        })
        .collect()
}

/// `Key=value` settings of a unit file (last one wins, as in systemd).
fn unit_settings(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn seconds(text: &str) -> u64 {
    text.strip_suffix('s')
        .unwrap_or(text)
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a number of seconds"))
}

/// Whether `text` still has a `{{name}}` the rendering should have filled.
fn has_placeholder(text: &str) -> bool {
    text.split("{{").skip(1).any(|rest| {
        rest.split_once("}}").is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())
        })
    })
}

/// The rendered unit and environment, as systemd on the VM would use them.
struct Rendered {
    unit: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
}

fn render() -> Rendered {
    let vars = render_compute_vars();
    let files = written_files(&vars["cloudInit"]);
    let unit_text = files.get(UNIT_FILE).expect("cloud-init writes the unit");
    let unit = unit_settings(unit_text);
    assert_eq!(
        unit.get("EnvironmentFile").map(String::as_str),
        Some(ENV_FILE)
    );
    let env_text = files.get(ENV_FILE).expect("cloud-init writes the env file");
    for (path, text) in &files {
        assert!(
            !has_placeholder(text),
            "unfilled {{{{placeholder}}}} in {path}:\n{text}"
        );
    }
    let env = parse_env_file(env_text);
    // The unit may also set Environment= lines; they come after the file.
    let mut env = env;
    for line in unit_text.lines() {
        if let Some(assignment) = line.trim().strip_prefix("Environment=") {
            let (k, v) = assignment.split_once('=').unwrap();
            env.insert(k.to_owned(), v.trim_matches('"').to_owned());
        }
    }
    Rendered { unit, env }
}

/// The child's stdout and stderr, kept for the failure message.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<String>>);

impl Output {
    fn capture(&self, stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) {
        let out = self.0.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                out.lock().unwrap().push_str(&line);
                out.lock().unwrap().push('\n');
            }
        });
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

async fn within<T>(what: &str, output: &Output, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {PATIENCE:?} waiting for {what}; worker output:\n{}",
            output.text()
        ),
    }
}

/// Polls `/readyz` until it answers 200, failing at once if the worker exits.
async fn until_ready(child: &mut Child, url: &str, output: &Output) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the worker exited ({status}) before it was ready; output:\n{}",
                output.text()
            );
        }
        if let Ok(response) = client.get(url).send().await
            && response.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_vm_environment_runs_the_real_worker() {
    let rendered = render();
    let unit = &rendered.unit;
    let env = &rendered.env;

    // The unit as the issue asks for it, and consistent with the environment.
    assert_eq!(unit["ExecStart"], "/opt/spot-worker/bin/spot-worker-primes");
    assert_eq!(unit["Restart"], "always");
    assert_eq!(unit["KillSignal"], "SIGTERM");
    let stop_timeout = seconds(&unit["TimeoutStopSec"]);
    let drain_budget = seconds(&env["SPOT_WORKER_DRAIN_BUDGET"]);
    assert!(
        drain_budget < stop_timeout && stop_timeout < 30,
        "drain budget {drain_budget}s < TimeoutStopSec {stop_timeout}s < the 30 s Preempt notice"
    );
    // The worker itself refuses a drain that does not fit the stop timeout:
    // check that the pair on the VM is the pair it checks against.
    let config = WorkerConfig::from_lookup(|name| env.get(name).cloned())
        .expect("worker.env is a configuration the worker accepts");
    assert_eq!(Duration::from_secs(stop_timeout), STOP_TIMEOUT);
    assert!(config.shutdown.longest_drain() + EXIT_MARGIN <= STOP_TIMEOUT);
    // What the VM is given: managed identity, the health extension's address.
    assert_eq!(
        env["SPOT_WORKER_STORAGE_ACCOUNT_URL"],
        "https://spotworkerabc123.blob.core.windows.net/"
    );
    assert_eq!(
        env["AZURE_CLIENT_ID"],
        "00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(env["SPOT_WORKER_HEALTH_ADDR"], "127.0.0.1:8080");
    assert!(env["APPLICATIONINSIGHTS_CONNECTION_STRING"].starts_with("InstrumentationKey="));
    assert!(
        !env.contains_key("AZURE_STORAGE_CONNECTION_STRING"),
        "no keys on the VM"
    );

    let azurite = tokio::task::spawn_blocking(Azurite::start)
        .await
        .unwrap()
        .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
    let emulator = Emulator::start(EmulatorConfig::for_vm(VM))
        .await
        .expect("the emulator starts");
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // The swap, and nothing else (see the module docs).
    let mut child_env = env.clone();
    child_env.remove("SPOT_WORKER_STORAGE_ACCOUNT_URL");
    child_env.remove("AZURE_CLIENT_ID");
    child_env.remove("APPLICATIONINSIGHTS_CONNECTION_STRING");
    child_env.insert(
        "AZURE_STORAGE_CONNECTION_STRING".into(),
        azurite.connection_string(),
    );
    child_env.insert("SPOT_WORKER_IMDS_ENDPOINT".into(), emulator.url());
    child_env.insert(
        "SPOT_WORKER_HEALTH_ADDR".into(),
        format!("127.0.0.1:{health_port}"),
    );
    // systemd's default PATH for services; the worker runs nothing else.
    child_env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());

    let output = Output::default();
    let mut child = Command::new(worker_binary())
        .env_clear()
        .envs(&child_env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the worker starts");
    output.capture(child.stdout.take().unwrap());
    output.capture(child.stderr.take().unwrap());

    let ready_url = format!("http://127.0.0.1:{health_port}/readyz");
    within(
        "/readyz to answer 200",
        &output,
        until_ready(&mut child, &ready_url, &output),
    )
    .await;

    // The same storage the worker uses, by the names the VM was given.
    let storage = AzureStorage::new(
        StorageConfig::from_connection_string(&azurite.connection_string()).unwrap(),
    )
    .unwrap();
    let queue = storage.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
    let results = storage
        .result_store(&env["SPOT_WORKER_RESULTS_CONTAINER"])
        .unwrap();
    let checkpoints = storage
        .checkpoint_store(&env["SPOT_WORKER_CHECKPOINT_CONTAINER"])
        .unwrap();

    // A job, processed: its result blob appears and is right.
    let small = PrimesJob::new("small", 0, 2_000_000).unwrap();
    queue
        .send(&small.to_message(), Duration::ZERO)
        .await
        .unwrap();
    let result = within("the small job's result", &output, async {
        loop {
            if let Some(bytes) = results.get("small.json").await.unwrap() {
                return serde_json::from_slice::<serde_json::Value>(&bytes).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(result, spot_worker_primes::expected_result(&small));

    // A long job, running (it has checkpointed) when the eviction comes.
    let big = PrimesJob::new("big", 0, 200_000_000_000).unwrap();
    queue.send(&big.to_message(), Duration::ZERO).await.unwrap();
    within("the long job's first checkpoint", &output, async {
        while checkpoints.read("big").await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    let preempt = emulator.schedule(EventSpec::preempt()).unwrap();
    let notice = Instant::now();
    let status = match tokio::time::timeout(Duration::from_secs(drain_budget + 2), child.wait())
        .await
    {
        Ok(status) => status.unwrap(),
        Err(_) => panic!(
            "the worker did not exit within the {drain_budget} s drain budget (+2 s) after the Preempt; output:\n{}",
            output.text()
        ),
    };
    let notice_to_exit = notice.elapsed();
    eprintln!("Preempt to process exit: {notice_to_exit:?} (drain budget {drain_budget} s)");
    assert!(
        status.success(),
        "the worker exited with {status}; output:\n{}",
        output.text()
    );

    // It drained as designed: the event approved (so Azure may proceed), the
    // long job's progress saved and its message back in the queue at once.
    assert!(
        emulator
            .approvals()
            .iter()
            .any(|a| a.event_id == preempt.id),
        "the Preempt was not approved; output:\n{}",
        output.text()
    );
    let (checkpoint, _) = checkpoints.read("big").await.unwrap().unwrap();
    let saved = serde_json::to_value(&checkpoint).unwrap();
    assert!(
        saved.to_string().contains("cursor"),
        "progress saved: {saved}"
    );
    let back = queue.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        back.len(),
        1,
        "the long job's message is visible again at once"
    );
    assert_eq!(
        PrimesJob::parse(back[0].body.as_bytes()).unwrap().job_id,
        "big"
    );
    let log = output.text();
    assert!(
        log.contains("Preempt"),
        "the worker logged the notice:\n{log}"
    );
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what Bicep's `base64()` produces).
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut n = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET
            .iter()
            .position(|&a| a == c)
            .unwrap_or_else(|| panic!("not base64: {c:?}")) as u32;
        n = (n << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
        }
    }
    out
}

#[test]
fn base64_round_trips() {
    for text in ["", "a", "ab", "abc", "abcd", "[Unit]\nDescription=x\n"] {
        assert_eq!(
            base64_decode(&base64_encode(text.as_bytes())),
            text.as_bytes()
        );
    }
    assert_eq!(base64_encode(b"spot"), "c3BvdA==");
}
