//! AKS scale-in with the pods' deletion cost (issue 39, item 2), rehearsed
//! on loopback with the REAL worker binary (`examples/primes`) against a
//! real Azurite queue and a stand-in of the Kubernetes API.
//!
//! The stand-in serves HTTPS on 127.0.0.1 with a certificate of a test CA,
//! the CA given to the workers as the cluster's `ca.crt`, exactly where a
//! pod finds it (`SPOT_WORKER_SERVICE_ACCOUNT_DIR`, with the token beside
//! it). It does what the API server and the ReplicaSet controller do for
//! this feature, and nothing else:
//!
//! - it authorises by the Role and RoleBinding of
//!   `deploy/kubernetes/pod-deletion-cost.yaml`, read from the file: a
//!   request of a verb, resource or namespace the Role does not allow to the
//!   bound service account is refused with 403, an unknown token with 401;
//! - it applies JSON merge patches to the pods' annotations;
//! - on a scale-in it removes the pods the ReplicaSet controller would
//!   (Kubernetes' ReplicaSet docs, "Scaling a ReplicaSet", and KEP-2255):
//!   all pods here are scheduled, running and ready on one node, so the
//!   lower `controller.kubernetes.io/pod-deletion-cost` goes first (a pod
//!   without one counts 0), then the more recently created. Removing a pod
//!   is what the kubelet does: SIGTERM to the worker.
//!
//! Only what cannot exist off a cluster is swapped: the API server's
//! address (`KUBERNETES_SERVICE_HOST`/`PORT`, set by the kubelet in a pod),
//! the service-account directory (a temporary one), the pod names (the
//! downward API's), Azurite's connection string for workload identity, IMDS
//! off (no node). `SPOT_WORKER_POD_DELETION_COST_STEP` is 1 s instead of a
//! minute so that a job's saves move its cost within seconds.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::Azurite;
use spot_worker_testkit::tls_front::TlsFront;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

mod rendered;

use rendered::{repo, worker_binary};

/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(180);
/// The workers' namespace (scripts/deploy-aks.sh's default).
const NAMESPACE: &str = "spot-worker";
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.spot-worker-service-account.test";
const ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// What `pod-deletion-cost.yaml` allows, as read from it.
#[derive(Debug)]
struct Role {
    namespace: String,
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// `namespace/name` of the bound service account.
    subject: String,
}

impl Role {
    /// The manifest, rendered for [`NAMESPACE`] as deploy-aks.sh does.
    fn from_manifest() -> Role {
        let text = std::fs::read_to_string(repo().join("deploy/kubernetes/pod-deletion-cost.yaml"))
            .unwrap()
            .replace("${NAMESPACE}", NAMESPACE);
        let documents: Vec<&str> = text.split("\n---\n").collect();
        let role = documents
            .iter()
            .find(|d| d.contains("\nkind: Role\n"))
            .expect("a Role");
        let binding = documents
            .iter()
            .find(|d| d.contains("\nkind: RoleBinding\n"))
            .expect("a RoleBinding");
        let role_name = scalar(role, "name").expect("the Role's name");
        assert_eq!(
            roleref_name(binding),
            Some(role_name),
            "the binding refers to the Role"
        );
        assert_eq!(list(role, "rules").len(), 1, "one rule: {role}");
        Role {
            namespace: scalar(role, "namespace").expect("a namespaced Role"),
            api_groups: list(role, "apiGroups"),
            resources: list(role, "resources"),
            verbs: list(role, "verbs"),
            subject: format!(
                "{}/{}",
                scalar(binding.split("subjects:").nth(1).unwrap(), "namespace").unwrap(),
                scalar(binding.split("subjects:").nth(1).unwrap(), "name").unwrap()
            ),
        }
    }

    fn allows(
        &self,
        subject: &str,
        namespace: &str,
        group: &str,
        resource: &str,
        verb: &str,
    ) -> bool {
        subject == self.subject
            && namespace == self.namespace
            && self.api_groups.iter().any(|g| g == group)
            && self.resources.iter().any(|r| r == resource)
            && self.verbs.iter().any(|v| v == verb)
    }
}

/// The first `key: value` in `text` (quotes removed).
fn scalar(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("{key}: "))?;
    let rest = &text[at + key.len() + 2..];
    Some(rest.lines().next()?.trim().trim_matches('"').to_owned())
}

fn roleref_name(binding: &str) -> Option<String> {
    scalar(binding.split("roleRef:").nth(1)?, "name")
}

/// The items of the block list under `key:` (the `- item` lines at the
/// first item's indent, until a line less indented than that).
fn list(text: &str, key: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim_start().trim_start_matches("- ") != format!("{key}:"))
        .skip(1)
        .filter(|l| !l.trim().is_empty());
    let Some(first) = lines.next() else {
        return Vec::new();
    };
    let depth = indent(first);
    std::iter::once(first)
        .chain(lines.take_while(|l| indent(l) >= depth))
        .filter(|l| indent(l) == depth)
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|item| item.trim().trim_matches('"').to_owned())
        .collect()
}

/// One pod as the stand-in keeps it.
#[derive(Debug, Default)]
struct Pod {
    /// Creation order (higher: newer).
    created: usize,
    annotations: BTreeMap<String, String>,
    /// Every deletion cost written, in order.
    costs: Vec<i32>,
    removed: bool,
}

impl Pod {
    fn cost(&self) -> i32 {
        self.annotations
            .get(ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// The API server and the ReplicaSet controller, for this feature.
#[derive(Default)]
struct Api {
    role: Option<Role>,
    pods: Mutex<BTreeMap<String, Pod>>,
    /// Answers given instead of applying the next allowed patches:
    /// (status, Retry-After seconds).
    faults: Mutex<VecDeque<(u16, Option<u64>)>>,
    /// Every request's (method, path, status).
    log: Mutex<Vec<(String, String, u16)>>,
}

impl Api {
    fn add_pod(&self, name: &str) {
        let mut pods = self.pods.lock().unwrap();
        let created = pods.len();
        pods.insert(
            name.to_owned(),
            Pod {
                created,
                ..Pod::default()
            },
        );
    }

    fn costs(&self, name: &str) -> Vec<i32> {
        self.pods.lock().unwrap()[name].costs.clone()
    }

    /// Scales the pods down to `replicas`, by the ReplicaSet controller's
    /// ranking (see the module doc); returns the removed pods' names.
    fn scale_in(&self, replicas: usize) -> Vec<String> {
        let mut pods = self.pods.lock().unwrap();
        let mut live: Vec<(&String, &Pod)> = pods.iter().filter(|(_, p)| !p.removed).collect();
        live.sort_by(|(_, a), (_, b)| a.cost().cmp(&b.cost()).then(b.created.cmp(&a.created)));
        let removed: Vec<String> = live
            .iter()
            .take(live.len().saturating_sub(replicas))
            .map(|(name, _)| (*name).clone())
            .collect();
        for name in &removed {
            pods.get_mut(name).unwrap().removed = true;
        }
        removed
    }

    fn answer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> (StatusCode, Vec<(&'static str, String)>, String) {
        let status = |code: u16, reason: &str, message: String| {
            let body = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": reason, "message": message, "code": code,
            });
            (
                StatusCode::from_u16(code).unwrap(),
                Vec::new(),
                body.to_string(),
            )
        };
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer != Some(TOKEN) {
            return status(401, "Unauthorized", "Unauthorized".into());
        }
        let subject = format!("{NAMESPACE}/spot-worker");
        // /api/v1/namespaces/NS/RESOURCE/NAME or /apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME
        let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", "v1", rest @ ..] => ("", rest),
            ["apis", group, _, rest @ ..] => (*group, rest),
            _ => {
                return status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource".into(),
                );
            }
        };
        let ["namespaces", namespace, resource, name] = rest else {
            return status(
                404,
                "NotFound",
                format!("{} is not a namespaced object", uri.path()),
            );
        };
        let verb = match *method {
            Method::GET => "get",
            Method::PATCH => "patch",
            Method::PUT => "update",
            Method::DELETE => "delete",
            Method::POST => "create",
            _ => "unknown",
        };
        let role = self.role.as_ref().unwrap();
        if !role.allows(&subject, namespace, group, resource, verb) {
            return status(
                403,
                "Forbidden",
                format!(
                    "{resource} \"{name}\" is forbidden: User \"system:serviceaccount:{NAMESPACE}:spot-worker\" \
                     cannot {verb} resource \"{resource}\" in API group \"{group}\" in the namespace \"{namespace}\""
                ),
            );
        }
        if let Some((code, retry_after)) = self.faults.lock().unwrap().pop_front() {
            let (code_, headers_, body_) = status(code, "Fault", format!("planted {code}"));
            let mut headers_ = headers_;
            if let Some(seconds) = retry_after {
                headers_.push(("retry-after", seconds.to_string()));
            }
            return (code_, headers_, body_);
        }
        if verb != "patch" {
            return status(405, "MethodNotAllowed", "the stand-in only patches".into());
        }
        if headers.get("content-type").and_then(|v| v.to_str().ok())
            != Some("application/merge-patch+json")
        {
            return status(
                415,
                "UnsupportedMediaType",
                "expected a JSON merge patch".into(),
            );
        }
        let mut pods = self.pods.lock().unwrap();
        let Some(pod) = pods.get_mut(*name).filter(|p| !p.removed) else {
            return status(404, "NotFound", format!("pods \"{name}\" not found"));
        };
        let Ok(patch) = serde_json::from_slice::<serde_json::Value>(body) else {
            return status(400, "BadRequest", "not JSON".into());
        };
        let Some(annotations) = patch
            .pointer("/metadata/annotations")
            .and_then(|a| a.as_object())
        else {
            return status(
                422,
                "Invalid",
                "the stand-in expects an annotations patch".into(),
            );
        };
        for (key, value) in annotations {
            match value {
                serde_json::Value::Null => {
                    pod.annotations.remove(key);
                }
                serde_json::Value::String(text) => {
                    if key == ANNOTATION {
                        // The API server validates it as an int32.
                        let Ok(cost) = text.parse::<i32>() else {
                            return status(
                                422,
                                "Invalid",
                                format!("{ANNOTATION}: {text:?} is not an int32"),
                            );
                        };
                        pod.costs.push(cost);
                    }
                    pod.annotations.insert(key.clone(), text.clone());
                }
                other => {
                    return status(
                        400,
                        "BadRequest",
                        format!("annotation {key} is {other}, not a string"),
                    );
                }
            }
        }
        let body = serde_json::json!({"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "annotations": pod.annotations}});
        (StatusCode::OK, Vec::new(), body.to_string())
    }
}

async fn serve(
    State(api): State<Arc<Api>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (status, extra, text) = api.answer(&method, &uri, &headers, &body);
    api.log
        .lock()
        .unwrap()
        .push((method.to_string(), uri.path().to_owned(), status.as_u16()));
    let mut response = (status, [("content-type", "application/json")], text).into_response();
    for (name, value) in extra {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// A CA and a certificate for 127.0.0.1, made with openssl(1).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kubernetes-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-sha256",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

/// A worker process in a pod, its output kept for failure messages.
struct Worker {
    pod: String,
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Worker {
    fn text(&self) -> String {
        self.output.lock().unwrap().clone()
    }
}

fn capture(
    output: &Arc<Mutex<String>>,
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) {
    let out = output.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut text = out.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });
}

struct Cluster {
    _dir: tempfile::TempDir,
    account_dir: PathBuf,
    api: Arc<Api>,
    front: TlsFront,
    azurite: Azurite,
    queue: String,
}

impl Cluster {
    async fn start(queue: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = certificates(dir.path());
        // The service-account directory as the kubelet mounts it.
        let account_dir = dir.path().join("serviceaccount");
        std::fs::create_dir(&account_dir).unwrap();
        std::fs::copy(&ca, account_dir.join("ca.crt")).unwrap();
        std::fs::write(account_dir.join("token"), TOKEN).unwrap();
        std::fs::write(account_dir.join("namespace"), NAMESPACE).unwrap();
        let api = Arc::new(Api {
            role: Some(Role::from_manifest()),
            ..Api::default()
        });
        let app = axum::Router::new().fallback(serve).with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let front = TlsFront::start("127.0.0.1:0".parse().unwrap(), &cert, &key, backend)
            .await
            .expect("the API server's TLS front");
        let azurite = tokio::task::spawn_blocking(Azurite::start)
            .await
            .unwrap()
            .expect("azurite starts (run `npm ci --prefix tools/azurite`)");
        Cluster {
            _dir: dir,
            account_dir,
            api,
            front,
            azurite,
            queue: queue.to_owned(),
        }
    }

    /// Starts the worker of pod `pod` in `namespace` (the downward API's).
    fn start_worker(&self, pod: &str, namespace: &str) -> Worker {
        self.api.add_pod(pod);
        let health = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let mut child = Command::new(worker_binary())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                self.azurite.connection_string(),
            )
            .env("SPOT_WORKER_QUEUE", &self.queue)
            .env("SPOT_WORKER_IMDS", "false")
            .env("SPOT_WORKER_HEALTH_ADDR", health.to_string())
            .env("SPOT_WORKER_CONCURRENCY", "1")
            .env("SPOT_WORKER_CHECKPOINT_EVERY", "3s")
            .env(
                "SPOT_WORKER_LOG_FILTER",
                "info,spot_worker_runtime::pod_deletion_cost=debug",
            )
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env(
                "KUBERNETES_SERVICE_PORT",
                self.front.addr().port().to_string(),
            )
            .env("SPOT_WORKER_SERVICE_ACCOUNT_DIR", &self.account_dir)
            .env("SPOT_WORKER_POD_NAME", pod)
            .env("SPOT_WORKER_POD_NAMESPACE", namespace)
            .env("SPOT_WORKER_POD_DELETION_COST_STEP", "1s")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the worker starts");
        capture(&output, child.stdout.take().unwrap());
        capture(&output, child.stderr.take().unwrap());
        Worker {
            pod: pod.to_owned(),
            child,
            output,
        }
    }

    fn storage(&self) -> AzureStorage {
        AzureStorage::new(
            StorageConfig::from_connection_string(&self.azurite.connection_string()).unwrap(),
        )
        .unwrap()
    }
}

/// Polls `check` every 100 ms until it is true, failing after [`PATIENCE`]
/// (or at once if a worker exited) with what it waited for and the output.
async fn until(what: &str, workers: &mut [&mut Worker], mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if check() {
            return;
        }
        for worker in workers.iter_mut() {
            if let Some(status) = worker.child.try_wait().unwrap() {
                panic!(
                    "waiting for {what}: the worker of {} exited ({status}):\n{}",
                    worker.pod,
                    worker.text()
                );
            }
        }
        if tokio::time::Instant::now() > deadline {
            let outputs: Vec<String> = workers
                .iter()
                .map(|w| format!("--- {}:\n{}", w.pod, w.text()))
                .collect();
            panic!(
                "timed out after {PATIENCE:?} waiting for {what}\n{}",
                outputs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `costs` rose above its first busy value and later fell while
/// still busy: a save lowered the cost.
fn rose_then_fell_while_busy(costs: &[i32]) -> bool {
    let busy: Vec<i32> = costs
        .iter()
        .copied()
        .skip_while(|c| *c <= 0)
        .take_while(|c| *c > 0)
        .collect();
    busy.windows(2).any(|w| w[1] > w[0]) && {
        let peak = busy.iter().position(|c| *c > 1).unwrap_or(busy.len());
        busy[peak..].windows(2).any(|w| w[1] < w[0])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_in_from_two_to_one_removes_the_idle_pod_and_the_busy_pods_cost_follows_its_saves()
{
    let cluster = Cluster::start("pod-cost").await;
    let mut first = cluster.start_worker("spot-worker-7d9f8-aaaaa", NAMESPACE);
    let mut second = cluster.start_worker("spot-worker-7d9f8-bbbbb", NAMESPACE);
    let api = cluster.api.clone();
    let (a, b) = (first.pod.clone(), second.pod.clone());

    // Both start idle and say so: cost 0, written once.
    until(
        "both pods' first cost",
        &mut [&mut first, &mut second],
        || api.costs(&a) == [0] && api.costs(&b) == [0],
    )
    .await;

    // A long job that saves every 3 s: one pod takes it.
    let storage = cluster.storage();
    let queue = storage.queue(&cluster.queue).unwrap();
    let checkpoints = storage.checkpoint_store("checkpoints").unwrap();
    let long = PrimesJob::new("long", 0, 200_000_000_000).unwrap();
    queue
        .send(&long.to_message(), Duration::ZERO)
        .await
        .unwrap();
    until("a pod to turn busy", &mut [&mut first, &mut second], || {
        api.costs(&a).iter().any(|c| *c > 0) || api.costs(&b).iter().any(|c| *c > 0)
    })
    .await;
    let (busy, idle) = if api.costs(&a).iter().any(|c| *c > 0) {
        (a, b)
    } else {
        (b, a)
    };

    // The busy pod's cost grows with its unsaved work and falls when it saves.
    until(
        "the busy pod's cost to rise and fall with a save",
        &mut [&mut first, &mut second],
        || rose_then_fell_while_busy(&api.costs(&busy)),
    )
    .await;
    assert!(
        checkpoints.read("long").await.unwrap().is_some(),
        "the job saved"
    );
    assert_eq!(
        api.costs(&idle),
        [0],
        "the idle pod stays at 0, written once"
    );

    eprintln!(
        "costs written: busy pod {:?}, idle pod {:?}",
        api.costs(&busy),
        api.costs(&idle)
    );
    // KEDA scales the Deployment from 2 to 1: the idle pod goes.
    let removed = api.scale_in(1);
    assert_eq!(
        removed,
        std::slice::from_ref(&idle),
        "costs: busy {:?}, idle {:?}",
        api.costs(&busy),
        api.costs(&idle)
    );
    let (gone, staying) = if first.pod == idle {
        (&mut first, &mut second)
    } else {
        (&mut second, &mut first)
    };
    let pid = gone.child.id().unwrap().to_string();
    // SIGTERM, as the kubelet stops a removed pod's container.
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(PATIENCE, gone.child.wait())
        .await
        .expect("the idle worker exits")
        .unwrap();
    assert!(
        status.success(),
        "the idle worker exits 0:\n{}",
        gone.text()
    );

    // The busy one keeps its job: it saves on, its cost still follows.
    let saved = checkpoints.read("long").await.unwrap().unwrap().etag;
    let staying_pod = staying.pod.clone();
    let writes_before = api.costs(&staying_pod).len();
    let mut moved_on = false;
    for _ in 0..(PATIENCE.as_millis() / 200) {
        if let Some(status) = staying.child.try_wait().unwrap() {
            panic!("the busy worker exited ({status}):\n{}", staying.text());
        }
        let etag = checkpoints.read("long").await.unwrap().map(|c| c.etag);
        if etag.is_some_and(|e| e != saved) && api.costs(&staying_pod).len() > writes_before + 1 {
            moved_on = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        moved_on,
        "the busy pod saved again and its cost moved:\n{}",
        staying.text()
    );
    assert!(!staying.text().contains(TOKEN), "the token is never logged");
    let denied: Vec<_> = api
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, s)| *s != 200)
        .cloned()
        .collect();
    assert!(denied.is_empty(), "every write was allowed: {denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_throttled_writes_lose_no_job_and_are_retried() {
    let cluster = Cluster::start("pod-cost-refused").await;
    // The API server throttles, then fails, before it accepts.
    cluster
        .api
        .faults
        .lock()
        .unwrap()
        .extend([(429, Some(1)), (500, None)]);
    let mut throttled = cluster.start_worker("spot-worker-7d9f8-ccccc", NAMESPACE);
    // A pod whose namespace the Role does not cover: every write is 403.
    let mut outside = cluster.start_worker("spot-worker-7d9f8-ddddd", "default");
    let api = cluster.api.clone();
    let pod = throttled.pod.clone();
    until(
        "the throttled pod's cost, after its retries",
        &mut [&mut throttled, &mut outside],
        || api.costs(&pod) == [0],
    )
    .await;
    let statuses: Vec<u16> = api
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, path, _)| path.ends_with(&pod))
        .map(|(_, _, s)| *s)
        .collect();
    assert_eq!(statuses, [429, 500, 200], "retried until it landed");

    // The refused pod's worker still does its jobs.
    let storage = cluster.storage();
    let queue = storage.queue(&cluster.queue).unwrap();
    let results = storage.result_store("results").unwrap();
    throttled.child.start_kill().unwrap();
    throttled.child.wait().await.unwrap();
    let small = PrimesJob::new("small", 0, 2_000_000).unwrap();
    queue
        .send(&small.to_message(), Duration::ZERO)
        .await
        .unwrap();
    let mut result = None;
    for _ in 0..(PATIENCE.as_millis() / 100) {
        if let Some(bytes) = results.get("small.json").await.unwrap() {
            result = Some(serde_json::from_slice::<serde_json::Value>(&bytes).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        result.as_ref(),
        Some(&spot_worker_primes::expected_result(&small)),
        "the job is done although every cost write is refused:\n{}",
        outside.text()
    );
    let refused: Vec<_> = api
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, path, _)| path.starts_with("/api/v1/namespaces/default/"))
        .map(|(_, _, s)| *s)
        .collect();
    assert!(
        !refused.is_empty() && refused.iter().all(|s| *s == 403),
        "{refused:?}"
    );
    let log = outside.text();
    assert!(
        log.contains("could not write this pod's deletion cost"),
        "{log}"
    );
    assert!(log.contains("403"), "{log}");
    assert!(!log.contains(TOKEN), "the token is never logged");
}
