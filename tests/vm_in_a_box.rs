//! A VM in a box: the deployed worker, unmodified, on the path a real
//! deployment takes. Inside network, mount and PID namespaces made by this
//! test (see `in_the_box::namespace`):
//!
//! - `169.254.169.254:80` is the IMDS emulator, serving Scheduled Events and
//!   the managed-identity token endpoint for the scale set's user-assigned
//!   identity;
//! - Azurite serves the storage account named from `bicep/main.bicepparam`
//!   over HTTPS with OAuth (`--oauth basic`), blob on `127.0.0.2:443` and
//!   queue on `127.0.0.3:443`, reached as
//!   `https://<account>.blob.core.windows.net` through the box's
//!   `/etc/hosts`, its certificate trusted through the box's CA bundle;
//! - `bicep/cloud-init/install-worker.sh`, as rendered, fetches a token from
//!   IMDS, downloads the worker from the artifacts container with it, checks
//!   its SHA-256 and installs it (into a scratch root);
//! - the installed worker runs with exactly the environment file the
//!   templates render: account URL, `AZURE_CLIENT_ID`, queue, containers,
//!   health address, drain settings. Its token comes from IMDS, its requests
//!   are authorised by bearer token, its jobs are done, and a Preempt at the
//!   real IMDS address is drained and approved, exit 0.
//!
//! The only value not as Azure would render it is
//! `APPLICATIONINSIGHTS_CONNECTION_STRING`, rendered empty: the box has no
//! Application Insights, and the template allows it (the telemetry crate
//! treats an empty value as "no export"), so no export to an unreachable
//! ingestion host clutters the run.
//!
//! Then what goes wrong on real VMs, each with a clear error and nothing
//! taken from the queue: a client id IMDS does not know, tokens storage
//! refuses (wrong issuer), a certificate the VM does not trust, proxy
//! variables pointing at a dead proxy (the token is still fetched: IMDS is
//! never reached through a proxy); and short-lived tokens, refreshed while
//! the worker keeps working past their expiry.
//!
//! `SPOT_WORKER_VM_IN_A_BOX=0` skips it explicitly; without namespaces
//! (not root, no user namespaces) it fails saying so. Run with
//! `--nocapture` to see the transcript.

mod in_the_box;
mod rendered;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use in_the_box::namespace::{inside, opted_out, run_inside};
use in_the_box::network::{self, Hosts, IMDS_IP};
use in_the_box::pki;
use in_the_box::run;
use in_the_box::vm::{PATIENCE, Vm};
use rendered::{render, repo, seconds, worker_binary};
use spot_worker::azure::{AzureQueue, AzureStorage, DEVELOPMENT_ACCOUNT_KEY, StorageConfig};
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_azurite_harness::{Azurite, HttpsOptions};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, IdentityConfig};
use spot_worker_primes::{PrimesJob, expected_result};

/// The scale set's user-assigned identity (its client id).
const CLIENT_ID: &str = "5b1d4e3c-7a2f-4c11-9e0d-2f6a8b9c0d1e";
/// Instance 0 of the scale set `<namePrefix>-vmss`.
const VM_SUFFIX: &str = "-vmss_0";
/// Stands in for `uniqueString(resourceGroup().id)` (13 characters).
const UNIQUE_STRING: &str = "q7k2m9x4b1c8d";
/// What a whole inner run may take.
const BOX_LIMIT: Duration = Duration::from_secs(900);

#[test]
fn the_deployed_worker_runs_in_a_vm_in_a_box() {
    if inside() {
        return; // The inner run only runs `inside_the_box`.
    }
    if opted_out() {
        eprintln!("SKIPPED: the VM-in-a-box rehearsal (SPOT_WORKER_VM_IN_A_BOX=0)");
        return;
    }
    // Built by `cargo test` (examples are), checked before entering the box.
    worker_binary();
    let run = run_inside("inside_the_box", BOX_LIMIT);
    println!("{}", run.stdout);
    assert!(
        run.status.success() && run.stdout.contains("test result: ok. 1 passed"),
        "the rehearsal failed ({}):\n{}\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
}

/// Runs only as the inner run, inside the namespaces; elsewhere it returns
/// at once (the outer test is the one that counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_box() {
    if !inside() {
        return;
    }
    // Proxy settings of the machine running the tests do not exist on the
    // VM (and no proxy is reachable in the box); the dedicated case sets
    // its own for the worker.
    for name in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        // SAFETY: the only test of this (inner) process, before any client
        // or child process reads the environment.
        unsafe { std::env::remove_var(name) };
    }
    let the_box = TheBox::set_up().await;
    the_box.rehearse().await;
}

/// Everything in the box.
struct TheBox {
    dir: PathBuf,
    account: String,
    hosts: Hosts,
    untrusted: pki::ServerCert,
    azurite: Azurite,
    emulator: spot_worker_imds_emulator::RunningEmulator,
    /// The operator's view of the account (key-signed SAS over HTTPS).
    operator: AzureStorage,
    rendered: rendered::Rendered,
    binary_sha256: String,
}

/// Prints a line of the transcript.
fn note(text: impl AsRef<str>) {
    println!("[vm-in-a-box] {}", text.as_ref());
}

impl TheBox {
    async fn set_up() -> TheBox {
        network::bring_up();
        let dir = std::env::temp_dir().join(format!("vm-in-a-box-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let account = account_name();
        let blob_host = format!("{account}.blob.core.windows.net");
        let queue_host = format!("{account}.queue.core.windows.net");

        let ca = pki::new_ca(&dir, "vm-in-a-box-ca");
        let names = ["*.blob.core.windows.net", "*.queue.core.windows.net"];
        let server = ca.issue(&dir, "storage", &names);
        let rogue = pki::new_ca(&dir, "untrusted-ca");
        let untrusted = rogue.issue(&dir, "untrusted-storage", &names);
        network::trust(&dir, &ca.cert);
        let hosts = Hosts::mount(
            &dir,
            &[("127.0.0.2", &blob_host), ("127.0.0.3", &queue_host)],
        );
        note(format!(
            "box: lo up with {IMDS_IP}; {blob_host} -> 127.0.0.2:443, {queue_host} -> 127.0.0.3:443; test CA in {}",
            network::CA_BUNDLE
        ));

        let azurite = start_azurite(&account, &server, ["127.0.0.2", "127.0.0.3"]);
        let emulator = start_imds(&account).await;

        let operator = AzureStorage::new(
            StorageConfig::from_connection_string(&format!(
                "DefaultEndpointsProtocol=https;AccountName={account};AccountKey={DEVELOPMENT_ACCOUNT_KEY};EndpointSuffix=core.windows.net"
            ))
            .unwrap(),
        )
        .unwrap();
        let binary_sha256 = sha256(&worker_binary());
        let rendered = render(&deployment_values(&account, &binary_sha256));
        TheBox {
            dir,
            account,
            hosts,
            untrusted,
            azurite,
            emulator,
            operator,
            rendered,
            binary_sha256,
        }
    }

    async fn rehearse(&self) {
        let env = self.vm_env();
        self.check_the_environment(&env);
        let installed = self.install().await;
        let queue = self.operator.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
        queue.prepare().await.unwrap();
        let sentinel = PrimesJob::new("sentinel", 0, 100_000).unwrap();
        queue
            .send(&sentinel.to_message(), Duration::ZERO)
            .await
            .unwrap();

        self.wrong_client_id(&installed, &env, &queue).await;
        self.token_storage_refuses(&installed, &env, &queue).await;
        self.untrusted_certificate(&installed, &env, &queue).await;
        self.dead_proxy(&installed, &env, &queue).await;
        self.the_deployment_works(&installed, &env, &queue, &sentinel)
            .await;
        self.short_lived_tokens_are_refreshed(&installed, &env)
            .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The environment file as the VM gets it.
    fn vm_env(&self) -> BTreeMap<String, String> {
        self.rendered.env.clone()
    }

    fn check_the_environment(&self, env: &BTreeMap<String, String>) {
        assert_eq!(
            env["SPOT_WORKER_STORAGE_ACCOUNT_URL"],
            format!("https://{}.blob.core.windows.net/", self.account)
        );
        assert_eq!(env["AZURE_CLIENT_ID"], CLIENT_ID);
        assert_eq!(env["SPOT_WORKER_HEALTH_ADDR"], "127.0.0.1:8080");
        for overriding in [
            "AZURE_STORAGE_CONNECTION_STRING",
            "SPOT_WORKER_IMDS_ENDPOINT",
            "SSL_CERT_FILE",
            "HTTPS_PROXY",
        ] {
            assert!(
                !env.contains_key(overriding),
                "{overriding} is not set on a VM"
            );
        }
        note(format!(
            "environment file (rendered from bicep/cloud-init/worker.env): {}",
            env.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    }

    /// Uploads the worker as `scripts/deploy.sh` does, then runs the
    /// rendered install script for real into a scratch root.
    async fn install(&self) -> PathBuf {
        let binary = std::fs::read(worker_binary()).unwrap();
        let artifacts = self.operator.result_store("artifacts").unwrap();
        artifacts.prepare().await.unwrap();
        artifacts
            .put_new("spot-worker-primes", &binary)
            .await
            .unwrap();
        let script = self.dir.join("install-worker.sh");
        std::fs::write(&script, &self.rendered.install_script).unwrap();
        let root = self.dir.join("root");
        let tokens_before = self.emulator.tokens().len();
        let output = tokio::time::timeout(
            PATIENCE,
            tokio::process::Command::new("bash")
                .arg(&script)
                // As cloud-init runs it: a plain environment, no proxies.
                .env_clear()
                .env("PATH", in_the_box::vm::SYSTEMD_PATH)
                .env("SPOT_WORKER_INSTALL_ROOT", &root)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("install-worker.sh finishes in time")
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "install-worker.sh failed: {stderr}"
        );
        let installed = root.join("opt/spot-worker/bin/spot-worker-primes");
        assert_eq!(sha256(&installed), self.binary_sha256);
        assert!(
            self.emulator.tokens().len() > tokens_before,
            "the script took a token from IMDS"
        );
        note(format!("install-worker.sh: {}", stderr.trim()));
        installed
    }

    async fn wrong_client_id(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        let wrong = "11111111-2222-3333-4444-555555555555";
        let mut env = env.clone();
        env.insert("AZURE_CLIENT_ID".into(), wrong.into());
        let mut vm = Vm::start(binary, &env);
        let error = vm.until_gate_fails_with("storage", wrong).await;
        assert!(
            error.contains("AZURE_CLIENT_ID") && error.contains("IMDS refused the client id"),
            "{error}"
        );
        assert!(vm.stop().await.success());
        assert_untouched(queue).await;
        note(format!(
            "wrong client id: not ready, /readyz storage: {error}"
        ));
    }

    async fn token_storage_refuses(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        self.identity(serde_json::json!({"issuer": "https://issuer.invalid/"}))
            .await;
        let mut vm = Vm::start(binary, env);
        let error = vm.until_gate_fails_with("storage", "403").await;
        assert!(error.contains("AuthenticationFailed"), "{error}");
        assert!(vm.stop().await.success());
        self.identity(serde_json::json!({"issuer": null})).await;
        assert_untouched(queue).await;
        note(format!(
            "token with a wrong issuer: not ready, /readyz storage: {error}"
        ));
    }

    async fn untrusted_certificate(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        // The same names, served by a certificate from a CA the VM does not
        // trust (on other loopback addresses).
        let rogue = start_azurite(&self.account, &self.untrusted, ["127.0.0.5", "127.0.0.6"]);
        self.point_storage_at(["127.0.0.5", "127.0.0.6"]);
        let mut vm = Vm::start(binary, env);
        let error = vm.until_gate_fails_with("storage", "certificate").await;
        assert!(vm.stop().await.success());
        self.point_storage_at(["127.0.0.2", "127.0.0.3"]);
        drop(rogue);
        assert_untouched(queue).await;
        note(format!(
            "untrusted certificate: not ready, /readyz storage: {error}"
        ));
    }

    async fn dead_proxy(&self, binary: &Path, env: &BTreeMap<String, String>, queue: &AzureQueue) {
        // Storage would go through the proxy (it may, in real life); here the
        // proxy is dead, so only the token can succeed, and must.
        let mut env = env.clone();
        for name in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "https_proxy",
            "http_proxy",
            "ALL_PROXY",
        ] {
            env.insert(name.into(), "http://127.0.0.9:9".into());
        }
        let tokens_before = self.emulator.tokens().len();
        let mut vm = Vm::start(binary, &env);
        let error = vm.until_gate_fails_with("storage", "tunnel error").await;
        assert!(vm.stop().await.success());
        let fetched = self.emulator.tokens().len() - tokens_before;
        assert!(
            fetched > 0,
            "the token request went around the proxy to IMDS; /readyz storage: {error}"
        );
        assert_untouched(queue).await;
        note(format!(
            "HTTP(S)_PROXY set to a dead proxy: {fetched} token(s) still fetched from IMDS directly; storage through the proxy fails: {error}"
        ));
    }

    async fn the_deployment_works(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
        sentinel: &PrimesJob,
    ) {
        let started = Instant::now();
        let bearer_before = bearer_validations(&self.azurite);
        let mut vm = Vm::start(binary, env);
        vm.until_ready().await;
        note(format!(
            "worker ready after {:?} (warmup gate open)",
            started.elapsed()
        ));
        let results = self
            .operator
            .result_store(&env["SPOT_WORKER_RESULTS_CONTAINER"])
            .unwrap();
        let checkpoints = self
            .operator
            .checkpoint_store(&env["SPOT_WORKER_CHECKPOINT_CONTAINER"])
            .unwrap();
        let small = PrimesJob::new("small", 0, 2_000_000).unwrap();
        queue
            .send(&small.to_message(), Duration::ZERO)
            .await
            .unwrap();
        for job in [sentinel, &small] {
            let name = format!("{}.json", job.job_id);
            let bytes = wait_for(&vm, &format!("result {name}"), || async {
                results.get(&name).await.unwrap()
            })
            .await;
            let result: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(result, expected_result(job));
            note(format!("job {}: result {result}", job.job_id));
        }

        let big = PrimesJob::new("big", 0, 200_000_000_000).unwrap();
        queue.send(&big.to_message(), Duration::ZERO).await.unwrap();
        wait_for(&vm, "the long job's first checkpoint", || async {
            checkpoints.read("big").await.unwrap()
        })
        .await;
        let preempt = self.emulator.schedule(EventSpec::preempt()).unwrap();
        let notice = Instant::now();
        let drain_budget = seconds(&env["SPOT_WORKER_DRAIN_BUDGET"]);
        let status = vm.exit_within(Duration::from_secs(drain_budget + 5)).await;
        assert!(status.success(), "exit {status}; log:\n{}", vm.log());
        note(format!(
            "Preempt {} at {IMDS_IP}: exit 0 after {:?}",
            preempt.id,
            notice.elapsed()
        ));
        let approval = self
            .emulator
            .approvals()
            .into_iter()
            .find(|a| a.event_id == preempt.id)
            .unwrap_or_else(|| panic!("the Preempt was not approved; log:\n{}", vm.log()));
        note(format!(
            "IMDS saw the approval POST for {}",
            approval.event_id
        ));
        // Azure evicts the VM now; the next VM in the box starts clean.
        self.emulator.complete_event(&preempt.id).unwrap();
        let back = queue.receive(1, Duration::from_secs(30)).await.unwrap();
        assert_eq!(back.len(), 1, "the long job's message is back at once");
        assert_eq!(
            PrimesJob::parse(back[0].body.as_bytes()).unwrap().job_id,
            "big"
        );
        queue
            .delete(&back[0].id, &back[0].pop_receipt)
            .await
            .unwrap();

        let tokens: Vec<_> = self
            .emulator
            .tokens()
            .into_iter()
            .filter(|t| t.client_id == CLIENT_ID)
            .collect();
        assert!(!tokens.is_empty());
        let bearer = bearer_validations(&self.azurite) - bearer_before;
        assert!(bearer > 0, "Azurite authorised requests by bearer token");
        note(format!(
            "IMDS issued {} token(s) to {CLIENT_ID} (resource {}); Azurite authorised {bearer} request(s) by bearer token",
            tokens.len(),
            tokens[0].resource
        ));
        for line in vm.transcript(&[
            "managed identity token acquired",
            "warmup gate",
            "Preempt",
            "approv",
            "drain",
            "released",
            "stopped",
        ]) {
            note(format!("  worker: {line}"));
        }
    }

    async fn short_lived_tokens_are_refreshed(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
    ) {
        const LIFETIME_SECS: u64 = 8;
        self.identity(serde_json::json!({"token_lifetime_secs": LIFETIME_SECS}))
            .await;
        let first_token_at = self.emulator.tokens().len();
        let queue = self.operator.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
        let results = self
            .operator
            .result_store(&env["SPOT_WORKER_RESULTS_CONTAINER"])
            .unwrap();
        let mut vm = Vm::start(binary, env);
        vm.until_ready().await;
        let first = self.emulator.tokens()[first_token_at].clone();
        let expired_at = SystemTime::UNIX_EPOCH + Duration::from_secs(first.expires_on);
        // Wait (bounded) until the first token has expired, then give work.
        wait_for(&vm, "the first token to expire", || async {
            (SystemTime::now() > expired_at + Duration::from_secs(1)).then_some(())
        })
        .await;
        let late = PrimesJob::new("after-expiry", 0, 1_000_000).unwrap();
        queue
            .send(&late.to_message(), Duration::ZERO)
            .await
            .unwrap();
        let bytes = wait_for(&vm, "the job given after expiry", || async {
            results.get("after-expiry.json").await.unwrap()
        })
        .await;
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            expected_result(&late)
        );
        assert!(vm.stop().await.success());
        let newer = self
            .emulator
            .tokens()
            .iter()
            .filter(|t| t.expires_on > first.expires_on)
            .count();
        assert!(
            newer > 0,
            "fresh tokens were fetched after the first expired"
        );
        self.identity(serde_json::json!({"token_lifetime_secs": 86_400}))
            .await;
        note(format!(
            "{LIFETIME_SECS} s tokens: the worker kept working past the first token's expiry ({newer} newer token(s) fetched)"
        ));
    }

    /// Changes the identity settings through the emulator's control API.
    async fn identity(&self, change: serde_json::Value) {
        let response = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("http://{IMDS_IP}/emulator/identity"))
            .json(&change)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{change}: {}",
            response.status()
        );
    }

    fn point_storage_at(&self, [blob, queue]: [&str; 2]) {
        let blob_host = format!("{}.blob.core.windows.net", self.account);
        let queue_host = format!("{}.queue.core.windows.net", self.account);
        self.hosts.set(&[(blob, &blob_host), (queue, &queue_host)]);
    }
}

/// The storage account `main.bicep` names: the first 11 characters of
/// `namePrefix` (from `main.bicepparam`), lower-cased without hyphens, and
/// `uniqueString(resourceGroup().id)`.
fn account_name() -> String {
    let params = std::fs::read_to_string(repo().join("bicep/main.bicepparam")).unwrap();
    let prefix = params
        .lines()
        .find_map(|line| line.trim().strip_prefix("param namePrefix = '"))
        .and_then(|rest| rest.strip_suffix('\''))
        .expect("main.bicepparam sets namePrefix");
    let prefix: String = prefix
        .replace('-', "")
        .to_lowercase()
        .chars()
        .take(11)
        .collect();
    format!("{prefix}{UNIQUE_STRING}")
}

/// What `main.bicep` passes to `modules/compute.bicep` for this account.
fn deployment_values(account: &str, sha256: &str) -> BTreeMap<&'static str, String> {
    let blob = format!("https://{account}.blob.core.windows.net/");
    BTreeMap::from([
        ("storageBlobEndpoint", blob.clone()),
        ("identityClientId", CLIENT_ID.to_owned()),
        ("queueName", "jobs".to_owned()),
        ("checkpointContainer", "checkpoints".to_owned()),
        ("resultsContainer", "results".to_owned()),
        // See the module docs.
        ("appInsightsConnectionString", String::new()),
        (
            "workerBinaryUrl",
            format!("{blob}artifacts/spot-worker-primes"),
        ),
        ("workerBinarySha256", sha256.to_owned()),
    ])
}

fn start_azurite(account: &str, cert: &pki::ServerCert, [blob, queue]: [&str; 2]) -> Azurite {
    let address = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 443);
    Azurite::start_https(HttpsOptions {
        blob: address(blob),
        queue: address(queue),
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        account_name: account.to_owned(),
        account_key: DEVELOPMENT_ACCOUNT_KEY.to_owned(),
    })
    .expect("azurite starts over HTTPS (run `npm ci --prefix tools/azurite`)")
}

async fn start_imds(account: &str) -> spot_worker_imds_emulator::RunningEmulator {
    let prefix = account.trim_end_matches(UNIQUE_STRING);
    let listener = tokio::net::TcpListener::bind((IMDS_IP, 80))
        .await
        .expect("binding IMDS's address in the box");
    let config = EmulatorConfig {
        identity: IdentityConfig::user_assigned(CLIENT_ID),
        ..EmulatorConfig::for_vm(format!("{prefix}{VM_SUFFIX}"))
    };
    let emulator = Emulator::new(config).spawn(listener);
    note(format!(
        "IMDS emulator on {IMDS_IP}:80 for VM {}, identity {CLIENT_ID}",
        emulator.config().vm_name
    ));
    emulator
}

fn sha256(file: &Path) -> String {
    let out = run("sha256sum", &[file.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().to_owned()
}

/// How many bearer tokens Azurite has validated (its debug log records each).
fn bearer_validations(azurite: &Azurite) -> usize {
    azurite
        .debug_log()
        .matches("Validation against token authentication successfully")
        .count()
}

/// The sentinel job was never taken: still there, never dequeued.
async fn assert_untouched(queue: &AzureQueue) {
    let peeked = queue.peek(32).await.unwrap();
    let sentinel = peeked
        .iter()
        .find(|m| m.body.contains("sentinel"))
        .expect("the sentinel job is still in the queue");
    assert_eq!(
        sentinel.dequeue_count, 0,
        "nothing was taken from the queue"
    );
}

/// Polls `check` every 200 ms until it yields `Some`, for at most PATIENCE.
async fn wait_for<T, F, Fut>(vm: &Vm, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}; worker log:\n{}",
            vm.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
