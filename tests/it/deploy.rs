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
//! - `APPLICATIONINSIGHTS_CONNECTION_STRING` is dropped (no export off Azure);
//! - `SPOT_WORKER_SCALE_IN_PROTECTION` is off: its calls go to Azure Resource
//!   Manager (`crates/azure/tests/it/scale_in_protection.rs` runs them against a
//!   stand-in).
//!
//! Queue, containers, drain budget, release margin, gate timeout and log
//! settings are the VM's. The worker must become ready, process a job
//! (result correct), and on a Preempt drain a running job and exit 0 within
//! the drain budget.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::runtime::{EXIT_MARGIN, STOP_TIMEOUT, WorkerConfig};
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_imds_emulator::EventSpec;
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::Azurite;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{enqueue_primes, start_worker};
use crate::rendered::{
    LocalVm, local_vm, render, sample_deployment_values, seconds, worker_binary,
};

/// The scale set VM the emulator serves (Flexible scale sets name VMs
/// `{scale set}_{suffix}`).
const VM: &str = "spotvmss_0";
/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(120);

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
    let rendered = render(&sample_deployment_values());
    let unit = &rendered.unit;
    let env = &rendered.env;

    // The unit as the issue asks for it, and consistent with the environment.
    assert_eq!(unit["ExecStart"], "/opt/spot-worker/bin/worker");
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
    let vars = env.clone();
    let config = WorkerConfig::from_lookup(move |name| vars.get(name).cloned())
        .expect("worker.env is a configuration the worker accepts");
    assert_eq!(Duration::from_secs(stop_timeout), STOP_TIMEOUT);
    assert!(config.drain.longest_drain() + EXIT_MARGIN <= STOP_TIMEOUT);
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

    // The swap, and nothing else (see the module docs).
    let LocalVm {
        emulator,
        health_port,
        env: child_env,
    } = local_vm(env, &azurite, VM).await;

    let output = Output::default();
    let mut child = start_worker(
        Command::new(worker_binary()).env_clear().envs(&child_env),
        Stdio::piped(),
    );
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
    let small = enqueue_primes(&queue, "small", 2_000_000).await;
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
    let checkpoint = checkpoints.read("big").await.unwrap().unwrap().checkpoint;
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

/// A mistyped account URL in the environment file stops the worker at
/// start-up, before anything is requested, with an error that names the
/// variable and says why (plain http would carry the bearer token in clear).
#[tokio::test]
async fn a_bad_account_url_stops_the_worker_naming_the_variable() {
    let rendered = render(&sample_deployment_values());
    for (url, why) in [
        (
            "http://spotworkerabc123.blob.core.windows.net/",
            "plain http is refused",
        ),
        ("https://spotworkerabc123.example.com/", "expected https://"),
        (
            "https://Spot_Worker.blob.core.windows.net/",
            "not a storage account name",
        ),
    ] {
        let mut env = rendered.env.clone();
        env.insert("SPOT_WORKER_STORAGE_ACCOUNT_URL".into(), url.into());
        env.remove("APPLICATIONINSIGHTS_CONNECTION_STRING");
        let output = tokio::time::timeout(
            PATIENCE,
            Command::new(worker_binary())
                .env_clear()
                .envs(&env)
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the worker exits at once")
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{url}: {stderr}");
        assert!(
            stderr.contains("SPOT_WORKER_STORAGE_ACCOUNT_URL") && stderr.contains(why),
            "{url}: {stderr}"
        );
    }
}
