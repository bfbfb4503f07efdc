//! The pod in a box: an AKS Spot node's world inside the box's namespaces,
//! and worker pods on it run by podman from the project's image.
//!
//! - 169.254.169.254:80 is the IMDS emulator as the node answers its pods:
//!   instance metadata and Scheduled Events of the node's VM
//!   ([`NODE_VM`]), and Microsoft Entra ID's token endpoint, which exchanges
//!   a projected service-account token for a storage token of the worker's
//!   identity (a federated credential for `spot-worker/spot-worker`);
//! - `https://login.microsoftonline.com` (`AZURE_AUTHORITY_HOST`) is a TLS
//!   front on 127.0.0.4:443 passing on to that endpoint, with a
//!   certificate from the box's CA;
//! - Azurite serves the storage account over HTTPS with bearer tokens at the
//!   production host names, as in the VM box;
//! - the Kubernetes API server is the test kit's stand-in
//!   (`spot_worker_testkit::kube_stand_in`: the Role of
//!   `pod-deletion-cost.yaml`, merge patches of pod annotations, the
//!   ReplicaSet controller's pick on a scale-in) behind a TLS front at
//!   [`API_SERVER_IP`]:443, the `kubernetes` service's ClusterIP, with a
//!   certificate from the box's CA for that address and
//!   `kubernetes.default.svc`;
//! - each pod is `podman run --network host` started from inside the box,
//!   so the container shares the node's (the box's) network namespace: its
//!   lo with IMDS's address, the production names (`--add-host`), the box's
//!   CA bundle mounted read-only over the image's; the token file mounted
//!   read-only where the webhook projects it; the service-account `token`,
//!   `ca.crt` (the box's CA) and `namespace` mounted read-only at
//!   [`SERVICE_ACCOUNT_DIR`] as the kubelet mounts them; the environment is
//!   exactly `deploy/kubernetes/deployment.yaml`'s (its downward-API
//!   entries filled with the pod's name and namespace) plus what the
//!   webhook injects and the `kubernetes` service's variables the kubelet
//!   sets in every pod.
//!
//! Podman runs with a storage root, run root and lock directory under the
//! box's temporary directory, and the box mounts its own `/proc` (podman's
//! runtime reads its children there, which the host's `/proc` does not
//! show from a new PID namespace) and `/dev/shm` (podman's locks): nothing
//! is shared with podman runs outside the box.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use spot_worker::azure::{AzureStorage, DEVELOPMENT_ACCOUNT_KEY, StorageConfig};
use spot_worker_imds_emulator::{
    Emulator, EmulatorConfig, FederatedCredential, IdentityConfig, RunningEmulator,
};
use spot_worker_testkit::kube_stand_in::Kube;
use spot_worker_testkit::tls_front::TlsFront;

use super::network::{self, Hosts, IMDS_IP};
use super::the_box::{account_name, start_azurite};
use super::vm::Vm;
use super::{pki, run};
use crate::rendered::repo;

/// The node's VM: instance 0 of an AKS Spot pool's scale set.
pub const NODE_VM: &str = "aks-spot-27384956-vmss_0";
/// The worker's user-assigned identity (the webhook's `AZURE_CLIENT_ID`).
pub const WORKER_CLIENT_ID: &str = "8d3c2b1a-6f5e-4d7c-9b8a-1e2f3a4b5c6d";
/// The cluster's OIDC issuer (the projected token's `iss`).
pub const OIDC_ISSUER: &str =
    "https://eastus.oic.prod-aks.azure.com/72f988bf-86f1-41af-91ab-2d7cd011db47/0d1e2f3a/";
/// `scripts/deploy-aks.sh`'s namespace, and the service account's name.
pub const NAMESPACE: &str = "spot-worker";
/// Where the webhook projects the service-account token in the pod.
pub const TOKEN_DIR: &str = "/var/run/secrets/azure/tokens";
pub const TOKEN_FILE: &str = "/var/run/secrets/azure/tokens/azure-identity-token";
/// Entra ID's public-cloud authority, as the webhook injects it.
pub const AUTHORITY_HOST: &str = "https://login.microsoftonline.com/";
const LOGIN_HOST: &str = "login.microsoftonline.com";
const LOGIN_IP: &str = "127.0.0.4";
/// The `kubernetes` service's ClusterIP (AKS's default service CIDR
/// 10.0.0.0/16 gives it 10.0.0.1): `KUBERNETES_SERVICE_HOST` in a pod.
pub const API_SERVER_IP: &str = "10.0.0.1";
/// Where the kubelet mounts the service-account token, CA and namespace.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// How `deployment_env` marks a downward-API entry (`valueFrom.fieldRef`),
/// filled per pod by [`Node::start_pod`].
const FIELD_REF: &str = "valueFrom.fieldRef:";
/// The image, built once per run into the box's own podman storage.
const IMAGE: &str = "localhost/spot-worker:pod-in-a-box";

/// Prints a line of the transcript.
pub fn note(text: impl AsRef<str>) {
    println!("[pod-in-a-box] {}", text.as_ref());
}

/// The node and everything around it.
pub struct Node {
    pub dir: PathBuf,
    pub account: String,
    pub azurite: spot_worker_testkit::Azurite,
    pub emulator: RunningEmulator,
    _entra: TlsFront,
    _hosts: Hosts,
    /// The API server's stand-in, and its HTTPS front at
    /// [`API_SERVER_IP`]:443.
    pub kube: Kube,
    _kube_front: TlsFront,
    /// The service-account token the kubelet mounts (the stand-in takes
    /// it for the RoleBinding's service account).
    pub kube_token: String,
    /// The directory mounted at [`SERVICE_ACCOUNT_DIR`].
    service_account: PathBuf,
    /// The box's CA certificate (the cluster's `ca.crt` too).
    pub ca_cert: PathBuf,
    /// The operator's view of the account (key-signed SAS over HTTPS).
    pub operator: AzureStorage,
    ca_bundle: PathBuf,
    /// The pods started, removed at the end whatever happens.
    started: std::sync::Mutex<Vec<String>>,
}

impl Node {
    pub async fn set_up() -> Node {
        network::bring_up();
        // Short: podman refuses a run root longer than 50 characters.
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("pod-box-{}", &id[..8]));
        std::fs::create_dir_all(&dir).unwrap();
        own_proc_and_shm();
        podman_in(&dir);

        let account = account_name();
        let blob_host = format!("{account}.blob.core.windows.net");
        let queue_host = format!("{account}.queue.core.windows.net");
        let ca = pki::new_ca(&dir, "pod-in-a-box-ca");
        let storage_cert = ca.issue(
            &dir,
            "storage",
            &["*.blob.core.windows.net", "*.queue.core.windows.net"],
        );
        let login_cert = ca.issue(&dir, "login", &[LOGIN_HOST]);
        let api_cert = ca.issue(
            &dir,
            "kube-apiserver",
            &[
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "kubernetes",
                "kubernetes.default",
                API_SERVER_IP,
            ],
        );
        network::trust(&dir, &ca.cert);
        let hosts = Hosts::mount(
            &dir,
            &[
                ("127.0.0.2", &blob_host),
                ("127.0.0.3", &queue_host),
                (LOGIN_IP, LOGIN_HOST),
            ],
        );
        let azurite = start_azurite(&account, &storage_cert, ["127.0.0.2", "127.0.0.3"]);
        let emulator = start_node_imds().await;
        let entra = TlsFront::start(
            SocketAddr::new(LOGIN_IP.parse().unwrap(), 443),
            &login_cert.cert,
            &login_cert.key,
            SocketAddr::new(IMDS_IP.parse().unwrap(), 80),
        )
        .await
        .expect("the TLS front of the token endpoint starts");
        let (kube, kube_front, kube_token, service_account) =
            start_api_server(&dir, &ca.cert, &api_cert).await;
        note(format!(
            "node {NODE_VM}: IMDS + Entra ID token endpoint on {IMDS_IP}:80, \
             {AUTHORITY_HOST} -> TLS front {LOGIN_IP}:443; {blob_host} -> 127.0.0.2:443, \
             {queue_host} -> 127.0.0.3:443; box CA in {}; Kubernetes API (stand-in, \
             Role of {}) at https://{API_SERVER_IP}:443, service account at {SERVICE_ACCOUNT_DIR}",
            network::CA_BUNDLE,
            spot_worker_testkit::kube_stand_in::MANIFEST
        ));
        let operator = AzureStorage::new(
            StorageConfig::from_connection_string(&format!(
                "DefaultEndpointsProtocol=https;AccountName={account};AccountKey={DEVELOPMENT_ACCOUNT_KEY};EndpointSuffix=core.windows.net"
            ))
            .unwrap(),
        )
        .unwrap();
        Node {
            ca_bundle: dir.join("ca-certificates.crt"),
            dir,
            account,
            azurite,
            emulator,
            _entra: entra,
            _hosts: hosts,
            kube,
            _kube_front: kube_front,
            kube_token,
            service_account,
            ca_cert: ca.cert.clone(),
            operator,
            started: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Builds the image (the spot-worker command and the primes example as
    /// `cargo test` built them) with `scripts/build-image.sh`.
    pub fn build_image(&self, cli: &Path, primes: &Path) {
        let output = std::process::Command::new(repo().join("scripts/build-image.sh"))
            .env("IMAGE", IMAGE)
            .env("SPOT_WORKER_BINARY", cli)
            .env("PRIMES_BINARY", primes)
            .output()
            .expect("scripts/build-image.sh runs");
        assert!(
            output.status.success(),
            "building the image failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        note(format!("image {IMAGE} built (scripts/build-image.sh)"));
    }

    /// The environment of a worker pod: `deployment.yaml`'s, rendered as
    /// `scripts/deploy-aks.sh` renders it, plus the webhook's variables.
    pub fn pod_env(&self) -> BTreeMap<String, String> {
        let values = BTreeMap::from([
            (
                "STORAGE_ACCOUNT_URL",
                format!("https://{}.blob.core.windows.net/", self.account),
            ),
            ("QUEUE", "jobs".to_owned()),
            // No regular lane in the box: the deployment's output is empty
            // then, and an empty setting is an unset one (no lanes).
            ("REGULAR_QUEUE", String::new()),
        ]);
        let mut env = deployment_env(&values);
        for (key, value) in [
            ("AZURE_CLIENT_ID", WORKER_CLIENT_ID.to_owned()),
            ("AZURE_TENANT_ID", IdentityConfig::default().tenant_id),
            ("AZURE_AUTHORITY_HOST", AUTHORITY_HOST.to_owned()),
            ("AZURE_FEDERATED_TOKEN_FILE", TOKEN_FILE.to_owned()),
        ] {
            env.insert(key.to_owned(), value);
        }
        // What the kubelet sets in every pod for the `kubernetes` service.
        let tcp = format!("tcp://{API_SERVER_IP}:443");
        for (key, value) in [
            ("KUBERNETES_SERVICE_HOST", API_SERVER_IP),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", &tcp),
            ("KUBERNETES_PORT_443_TCP", &tcp),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", API_SERVER_IP),
        ] {
            env.insert(key.to_owned(), value.to_owned());
        }
        env
    }

    /// A directory holding a projected service-account token for the
    /// worker's service account, valid for `valid_for` from now (negative:
    /// expired), or none at all; mounted at [`TOKEN_DIR`].
    pub fn token_dir(&self, name: &str, valid_for: Option<i64>) -> PathBuf {
        let dir = self.dir.join("tokens").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(valid_for) = valid_for {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let claims = serde_json::json!({
                "iss": OIDC_ISSUER,
                "sub": format!("system:serviceaccount:{NAMESPACE}:{NAMESPACE}"),
                "aud": ["api://AzureADTokenExchange"],
                "iat": now.min(now + valid_for) - 60,
                "nbf": now.min(now + valid_for) - 60,
                "exp": now + valid_for,
            });
            let token = format!(
                "{}.{}.c2lnbmF0dXJl",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"box"}"#),
                URL_SAFE_NO_PAD.encode(claims.to_string())
            );
            std::fs::write(dir.join("azure-identity-token"), token).unwrap();
        }
        // The worker is uid 65532, as the kubelet's projection would allow.
        run("chmod", &["-R", "a+rX", dir.to_str().unwrap()]);
        dir
    }

    /// Starts the pod `name` with `env` (its health port set to `port`),
    /// `tokens` mounted at [`TOKEN_DIR`], pinned to `cpu`.
    pub fn start_pod(
        &self,
        name: &str,
        env: &BTreeMap<String, String>,
        port: u16,
        tokens: &Path,
        cpu: usize,
    ) -> Vm {
        let mut env = env.clone();
        // Pods share the node's network namespace here (not in Kubernetes,
        // where each pod has its own): one port per pod.
        env.insert("SPOT_WORKER_HEALTH_ADDR".into(), format!("0.0.0.0:{port}"));
        // The downward API, as the kubelet fills it for this pod.
        for value in env.values_mut() {
            if let Some(field) = value.strip_prefix(FIELD_REF) {
                *value = match field {
                    "metadata.name" => name.to_owned(),
                    "metadata.namespace" => NAMESPACE.to_owned(),
                    other => panic!("deployment.yaml's fieldRef {other} is not filled by the box"),
                };
            }
        }
        // The pod object exists before its container starts.
        self.kube.add_pod(name);
        let mut command = tokio::process::Command::new(repo().join("scripts/podman.sh"));
        command.args(["run", "--rm", "--name", name, "--network", "host"]);
        for host in [
            format!("{}.blob.core.windows.net:127.0.0.2", self.account),
            format!("{}.queue.core.windows.net:127.0.0.3", self.account),
            format!("{LOGIN_HOST}:{LOGIN_IP}"),
        ] {
            command.args(["--add-host", &host]);
        }
        // The Deployment's security context: read-only root with /tmp
        // writable, no capabilities, no privilege escalation.
        command.args(["--read-only", "--tmpfs", "/tmp", "--cap-drop", "all"]);
        command.args(["--security-opt", "no-new-privileges"]);
        // One CPU each: the worker's default concurrency (CPUs) is then 1,
        // so each pod holds one job.
        command.args(["--cpuset-cpus", &cpu.to_string()]);
        command.args([
            "--volume",
            &format!("{}:{}:ro", self.ca_bundle.display(), network::CA_BUNDLE),
        ]);
        command.args(["--volume", &format!("{}:{TOKEN_DIR}:ro", tokens.display())]);
        command.args([
            "--volume",
            &format!(
                "{}:{SERVICE_ACCOUNT_DIR}:ro",
                self.service_account.display()
            ),
        ]);
        for (key, value) in &env {
            command.args(["--env", &format!("{key}={value}")]);
        }
        // `WORKER_ARGS`' default in scripts/deploy-aks.sh.
        command.args([IMAGE, "/usr/local/bin/primes"]);
        self.started.lock().unwrap().push(name.to_owned());
        Vm::spawn(command, &format!("127.0.0.1:{port}"))
    }

    /// `podman stop -t <grace>` of a pod, as the kubelet stops one KEDA
    /// scales in; how long it took.
    pub async fn stop_pod(&self, name: &str, grace: Duration) -> Duration {
        let started = std::time::Instant::now();
        let output = tokio::time::timeout(
            grace + Duration::from_secs(30),
            tokio::process::Command::new(repo().join("scripts/podman.sh"))
                .args(["stop", "--time", &grace.as_secs().to_string(), name])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("podman stop returns")
        .unwrap();
        assert!(
            output.status.success(),
            "podman stop {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        started.elapsed()
    }
}

impl Drop for Node {
    /// Removes the pods, then the box's directory with podman's storage
    /// (over 100 MB), also when a case failed.
    fn drop(&mut self) {
        for name in self.started.lock().unwrap().iter() {
            let _ = std::process::Command::new(repo().join("scripts/podman.sh"))
                .args(["rm", "--force", "--ignore", name])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `/proc` of the box's PID namespace and a `/dev/shm` of its own, in
/// its private mount namespace (see the module docs).
fn own_proc_and_shm() {
    run("mount", &["-t", "proc", "proc", "/proc"]);
    run("mount", &["-t", "tmpfs", "tmpfs", "/dev/shm"]);
}

/// Points `scripts/podman.sh` (and so `scripts/build-image.sh`) at storage,
/// run and lock directories under `dir`.
fn podman_in(dir: &Path) {
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        format!(
            "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\ntmp_dir = \"{}\"\n",
            dir.join("podman/tmp").display()
        ),
    )
    .unwrap();
    // SAFETY: called by the only test of the inner process before it starts
    // any child process or thread that reads the environment.
    unsafe {
        std::env::set_var("CONTAINERS_CONF", &conf);
        std::env::set_var("SPOT_WORKER_PODMAN_ROOT", dir.join("podman"));
    }
}

/// IMDS as the node answers its pods, with Entra ID's exchange trusting the
/// worker's service account.
async fn start_node_imds() -> RunningEmulator {
    let listener = tokio::net::TcpListener::bind((IMDS_IP, 80))
        .await
        .expect("binding IMDS's address in the box");
    let config = EmulatorConfig {
        identity: IdentityConfig {
            federated: vec![FederatedCredential::for_service_account(
                WORKER_CLIENT_ID,
                OIDC_ISSUER,
                NAMESPACE,
                NAMESPACE,
            )],
            ..IdentityConfig::default()
        },
        ..EmulatorConfig::for_vm(NODE_VM)
    };
    Emulator::new(config).spawn(listener)
}

/// The API server's stand-in for [`NAMESPACE`] behind its TLS front at
/// [`API_SERVER_IP`]:443 (the address added to the box's loopback), with a
/// service-account token for the RoleBinding's service account, and the
/// directory the kubelet would mount: `token`, `ca.crt`, `namespace`.
async fn start_api_server(
    dir: &Path,
    ca_cert: &Path,
    cert: &pki::ServerCert,
) -> (Kube, TlsFront, String, PathBuf) {
    run(
        "ip",
        &["addr", "add", &format!("{API_SERVER_IP}/32"), "dev", "lo"],
    );
    let kube = Kube::start(NAMESPACE)
        .await
        .expect("the Kubernetes API stand-in starts");
    let account = kube.role().subject.clone();
    // A bound service-account token's shape (a JWT for the API server).
    let claims = serde_json::json!({
        "iss": OIDC_ISSUER,
        "sub": format!("system:serviceaccount:{}", account.replace('/', ":")),
        "aud": ["https://kubernetes.default.svc"],
    });
    let token = format!(
        "{}.{}.c2lnbmF0dXJl",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"box-sa"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    kube.grant(&token, &account);
    let front = TlsFront::start(
        SocketAddr::new(API_SERVER_IP.parse().unwrap(), 443),
        &cert.cert,
        &cert.key,
        kube.addr,
    )
    .await
    .expect("the API server's TLS front starts");
    let service_account = dir.join("serviceaccount");
    std::fs::create_dir_all(&service_account).unwrap();
    std::fs::write(service_account.join("token"), &token).unwrap();
    std::fs::copy(ca_cert, service_account.join("ca.crt")).unwrap();
    std::fs::write(service_account.join("namespace"), NAMESPACE).unwrap();
    // The worker is uid 65532.
    run("chmod", &["-R", "a+rX", service_account.to_str().unwrap()]);
    (kube, front, token, service_account)
}

/// The container's `env` in `deploy/kubernetes/deployment.yaml`, with
/// `${NAME}` replaced from `values`. Downward-API entries
/// (`valueFrom.fieldRef`) are kept as `valueFrom.fieldRef:<fieldPath>`,
/// filled per pod by [`Node::start_pod`]. Entries from a secret
/// (`valueFrom.secretKeyRef`, all optional) are left out: the box has no
/// such secret, and Kubernetes leaves an optional reference to a missing
/// secret unset.
pub fn deployment_env(values: &BTreeMap<&str, String>) -> BTreeMap<String, String> {
    let yaml = std::fs::read_to_string(repo().join("deploy/kubernetes/deployment.yaml")).unwrap();
    let mut env = BTreeMap::new();
    let mut indent = None;
    let mut name: Option<String> = None;
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        let depth = line.len() - trimmed.len();
        if trimmed == "env:" {
            indent = Some(depth);
            continue;
        }
        let Some(env_indent) = indent else { continue };
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if depth <= env_indent && !trimmed.starts_with("- ") {
            break;
        }
        if let Some(entry) = trimmed.strip_prefix("- name: ") {
            name = Some(entry.trim().to_owned());
        } else if let Some(field) = trimmed.strip_prefix("fieldPath: ") {
            if let Some(key) = name.take() {
                env.insert(key, format!("{FIELD_REF}{}", field.trim()));
            }
        } else if let Some(value) = trimmed.strip_prefix("value: ")
            && let Some(key) = name.take()
        {
            let mut value = value.trim().trim_matches('"').to_owned();
            for (var, replacement) in values {
                value = value.replace(&format!("${{{var}}}"), replacement);
            }
            assert!(!value.contains("${"), "{key}: {value} is not rendered");
            env.insert(key, value);
        }
    }
    assert!(!env.is_empty(), "deployment.yaml's env list was read");
    env
}
