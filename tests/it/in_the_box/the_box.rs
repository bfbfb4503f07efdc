//! The box itself: its network, trust store and host names, Azurite over
//! HTTPS with OAuth, the IMDS emulator at its real address, Azure Resource
//! Manager's stand-in at `management.azure.com` over HTTPS (the scale set's
//! instance protection, with the custom role), the operator's
//! view of the storage account, the rendered VM files, and the helpers the
//! cases share.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spot_worker::azure::{
    AzureQueue, AzureStorage, BlobCheckpointStore, BlobResultStore, DEVELOPMENT_ACCOUNT_KEY,
    StorageConfig,
};
use spot_worker::storage::{MessageQueue, ResultStore};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, EventSpec, IdentityConfig, PostedEvent};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::arm_stand_in::{Arm, Principal, custom_role_actions};
use spot_worker_testkit::tls_front::TlsFront;
use spot_worker_testkit::{Azurite, HttpsOptions};

use super::network::{self, Hosts, IMDS_IP};
use super::pki;
use super::run;
use super::vm::{PATIENCE, SYSTEMD_PATH, Vm};
use crate::rendered::{self, render, repo, worker_binary};

/// The scale set's user-assigned identity (its client id).
pub const CLIENT_ID: &str = "5b1d4e3c-7a2f-4c11-9e0d-2f6a8b9c0d1e";
/// Instance 0 of the scale set `<namePrefix>-vmss`.
const VM_SUFFIX: &str = "-vmss_0";
/// The scale set and this VM's instance id in it (from [`VM_SUFFIX`]).
const SET_SUFFIX: &str = "-vmss";
pub const INSTANCE_ID: &str = "0";
/// Azure Resource Manager's name, and where the box serves it.
const ARM_HOST: &str = "management.azure.com";
const ARM_IP: &str = "127.0.0.4";
/// Stands in for `uniqueString(resourceGroup().id)` (13 characters).
const UNIQUE_STRING: &str = "q7k2m9x4b1c8d";

/// Everything in the box.
pub struct TheBox {
    pub dir: PathBuf,
    pub account: String,
    pub hosts: Hosts,
    pub untrusted: pki::ServerCert,
    pub azurite: Azurite,
    pub emulator: spot_worker_imds_emulator::RunningEmulator,
    /// ARM's stand-in, and its HTTPS front at `management.azure.com:443`.
    pub arm: Arm,
    pub arm_front: TlsFront,
    /// The scale set this VM is an instance of.
    pub scale_set: String,
    /// The operator's view of the account (key-signed SAS over HTTPS).
    pub operator: AzureStorage,
    pub rendered: rendered::Rendered,
    pub binary_sha256: String,
}

/// Prints a line of the transcript.
pub fn note(text: impl AsRef<str>) {
    println!("[vm-in-a-box] {}", text.as_ref());
}

/// Takes the message of the job `job_id`, released by a drain and so
/// visible again at once, back off `queue`: the next case starts with an
/// empty queue.
pub async fn take_back_released(queue: &AzureQueue, job_id: &str) {
    let back = queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(back.len(), 1, "{job_id}'s message is back at once");
    assert_eq!(
        PrimesJob::parse(back[0].body.as_bytes()).unwrap().job_id,
        job_id
    );
    queue
        .delete(&back[0].id, &back[0].pop_receipt)
        .await
        .unwrap();
}

impl TheBox {
    /// Schedules a Preempt at the box's IMDS and waits for `vm` to exit 0
    /// within the drain budget of `env` (plus 5 s); notes `exited` (what
    /// exited how) and how long it took, and returns the event.
    pub async fn preempt_drains(
        &self,
        vm: &mut Vm,
        env: &BTreeMap<String, String>,
        exited: &str,
    ) -> PostedEvent {
        let preempt = self.emulator.schedule(EventSpec::preempt()).unwrap();
        let notice = Instant::now();
        let drain_budget = rendered::seconds(&env["SPOT_WORKER_DRAIN_BUDGET"]);
        let status = vm.exit_within(Duration::from_secs(drain_budget + 5)).await;
        assert!(status.success(), "exit {status}; log:\n{}", vm.log());
        note(format!(
            "Preempt {} at {IMDS_IP}: {exited} after {:?}",
            preempt.id,
            notice.elapsed()
        ));
        preempt
    }

    /// The result and checkpoint stores the worker of `env` writes to, as
    /// the operator reads them.
    pub fn worker_stores(
        &self,
        env: &BTreeMap<String, String>,
    ) -> (BlobResultStore, BlobCheckpointStore) {
        let results = self
            .operator
            .result_store(&env["SPOT_WORKER_RESULTS_CONTAINER"])
            .unwrap();
        let checkpoints = self
            .operator
            .checkpoint_store(&env["SPOT_WORKER_CHECKPOINT_CONTAINER"])
            .unwrap();
        (results, checkpoints)
    }

    pub async fn set_up() -> TheBox {
        network::bring_up();
        let dir = std::env::temp_dir().join(format!("vm-in-a-box-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let account = account_name();
        let blob_host = format!("{account}.blob.core.windows.net");
        let queue_host = format!("{account}.queue.core.windows.net");

        let ca = pki::new_ca(&dir, "vm-in-a-box-ca");
        let names = ["*.blob.core.windows.net", "*.queue.core.windows.net"];
        let server = ca.issue(&dir, "storage", &names);
        let arm_cert = ca.issue(&dir, "arm", &[ARM_HOST]);
        let rogue = pki::new_ca(&dir, "untrusted-ca");
        let untrusted = rogue.issue(&dir, "untrusted-storage", &names);
        network::trust(&dir, &ca.cert);
        network::own_runtime_dir(&dir);
        let hosts = Hosts::mount(
            &dir,
            &[
                ("127.0.0.2", &blob_host),
                ("127.0.0.3", &queue_host),
                (ARM_IP, ARM_HOST),
            ],
        );
        note(format!(
            "box: lo up with {IMDS_IP}; {blob_host} -> 127.0.0.2:443, {queue_host} -> 127.0.0.3:443, {ARM_HOST} -> {ARM_IP}:443; test CA in {}",
            network::CA_BUNDLE
        ));

        let azurite = start_azurite(&account, &server, ["127.0.0.2", "127.0.0.3"]);
        let emulator = start_imds(&account).await;
        let (arm, arm_front, scale_set) = start_arm(&emulator, &arm_cert).await;

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
            arm,
            arm_front,
            scale_set,
            operator,
            rendered,
            binary_sha256,
        }
    }

    /// The environment file as the VM gets it.
    pub fn vm_env(&self) -> BTreeMap<String, String> {
        self.rendered.env.clone()
    }

    pub fn check_the_environment(&self, env: &BTreeMap<String, String>) {
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
    pub async fn install(&self) -> PathBuf {
        let root = self
            .install_into(
                &self.rendered,
                "root",
                &[("spot-worker-primes", &worker_binary())],
            )
            .await;
        let installed = root.join("opt/spot-worker/bin/worker");
        assert_eq!(sha256(&installed), self.binary_sha256);
        installed
    }

    /// Uploads `artifacts` (blob name, file) to the artifacts container as
    /// `scripts/deploy.sh` does, then runs `rendered`'s install script for
    /// real into the scratch root `dir/<root>`, which it returns.
    pub async fn install_into(
        &self,
        rendered: &rendered::Rendered,
        root: &str,
        uploads: &[(&str, &Path)],
    ) -> PathBuf {
        let artifacts = self.operator.result_store("artifacts").unwrap();
        artifacts.prepare().await.unwrap();
        for (name, file) in uploads {
            artifacts
                .put_new(name, &std::fs::read(file).unwrap())
                .await
                .unwrap();
        }
        let script = self.dir.join(format!("install-worker-{root}.sh"));
        std::fs::write(&script, &rendered.install_script).unwrap();
        let root = self.dir.join(root);
        let tokens_before = self.emulator.tokens().len();
        let output = tokio::time::timeout(
            PATIENCE,
            tokio::process::Command::new("bash")
                .arg(&script)
                // As cloud-init runs it: a plain environment, no proxies.
                .env_clear()
                .env("PATH", SYSTEMD_PATH)
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
        assert!(
            self.emulator.tokens().len() > tokens_before,
            "the script took a token from IMDS"
        );
        note(format!("install-worker.sh: {}", stderr.trim()));
        root
    }

    /// Changes the identity settings through the emulator's control API.
    pub async fn identity(&self, change: serde_json::Value) {
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

    pub fn point_storage_at(&self, [blob, queue]: [&str; 2]) {
        let blob_host = format!("{}.blob.core.windows.net", self.account);
        let queue_host = format!("{}.queue.core.windows.net", self.account);
        self.hosts
            .set(&[(blob, &blob_host), (queue, &queue_host), (ARM_IP, ARM_HOST)]);
    }
}

/// The storage account `main.bicep` names: the first 11 characters of
/// `namePrefix` (from `main.bicepparam`), lower-cased without hyphens, and
/// `uniqueString(resourceGroup().id)`.
pub fn account_name() -> String {
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
pub fn deployment_values(account: &str, sha256: &str) -> BTreeMap<&'static str, String> {
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
        ("workerArgs", String::new()),
        ("workerBundleUrl", String::new()),
        ("workerBundleSha256", String::new()),
        // The Spot lane's scale set without the regular lane (empty: no
        // lanes), one job per CPU.
        ("lane", "spot".to_owned()),
        ("regularQueueName", String::new()),
        ("concurrency", String::new()),
        // The default (scaleInProtection=true): ARM's stand-in answers.
        ("scaleInProtection", "on".to_owned()),
    ])
}

pub fn start_azurite(account: &str, cert: &pki::ServerCert, [blob, queue]: [&str; 2]) -> Azurite {
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

/// ARM's stand-in for the emulator's subscription and resource group,
/// behind TLS at `management.azure.com:443`: this VM an instance of its
/// scale set, unprotected; the identity's IMDS tokens for ARM carrying the
/// custom role of `bicep/modules/scale-in-protection.bicep` assigned on the
/// scale set, as `main.bicep` assigns it.
async fn start_arm(
    emulator: &spot_worker_imds_emulator::RunningEmulator,
    cert: &pki::ServerCert,
) -> (Arm, TlsFront, String) {
    let config = emulator.config();
    let scale_set = config
        .scale_set_name
        .clone()
        .expect("the box's VM is an instance of a scale set");
    assert!(scale_set.ends_with(SET_SUFFIX), "{scale_set}");
    let arm = Arm::start(&config.subscription_id, &config.resource_group)
        .await
        .expect("ARM's stand-in starts");
    arm.add_vm(&scale_set, INSTANCE_ID, false);
    arm.grant_identity(
        CLIENT_ID,
        Principal {
            actions: custom_role_actions().expect("the custom role is read from bicep"),
            scope: arm.scale_set(&scale_set),
        },
    );
    let bind = SocketAddr::new(ARM_IP.parse().unwrap(), 443);
    let front = TlsFront::start(bind, &cert.cert, &cert.key, arm.addr)
        .await
        .expect("ARM's TLS front starts");
    note(format!(
        "ARM stand-in at https://{ARM_HOST} ({ARM_IP}:443): {} instance {INSTANCE_ID}, role of {} for {CLIENT_ID}",
        arm.scale_set(&scale_set),
        spot_worker_testkit::arm_stand_in::ROLE_MODULE
    ));
    (arm, front, scale_set)
}

pub fn sha256(file: &Path) -> String {
    let out = run("sha256sum", &[file.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().to_owned()
}

/// How many bearer tokens Azurite has validated (its debug log records each).
pub fn bearer_validations(azurite: &Azurite) -> usize {
    azurite
        .debug_log()
        .matches("Validation against token authentication successfully")
        .count()
}

/// The sentinel job was never taken: still there, never dequeued.
pub async fn assert_untouched(queue: &AzureQueue) {
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
pub async fn wait_for<T, F, Fut>(vm: &Vm, what: &str, mut check: F) -> T
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
