//! AKS scale-in with the pods' deletion cost (issue 39, item 2), rehearsed
//! on loopback with the REAL worker binary (`examples/primes`) against a
//! real Azurite queue and a stand-in of the Kubernetes API.
//!
//! The stand-in (`spot_worker_testkit::kube_stand_in`, shared with the pod
//! in a box) authorises by the Role of
//! `deploy/kubernetes/pod-deletion-cost.yaml`, applies the merge patches and
//! picks the pods a scale-in removes as the ReplicaSet controller does. Here
//! it serves HTTPS on 127.0.0.1 with a certificate of a test CA, the CA
//! given to the workers as the cluster's `ca.crt`, exactly where a pod
//! finds it (`SPOT_WORKER_SERVICE_ACCOUNT_DIR`, with the token beside it).
//! Removing a pod is what the kubelet does: SIGTERM to the worker.
//!
//! Only what cannot exist off a cluster is swapped: the API server's
//! address (`KUBERNETES_SERVICE_HOST`/`PORT`, set by the kubelet in a pod),
//! the service-account directory (a temporary one), the pod names (the
//! downward API's), Azurite's connection string for workload identity, IMDS
//! off (no node). `SPOT_WORKER_POD_DELETION_COST_STEP` is 1 s instead of a
//! minute so that a job's saves move its cost within seconds.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker::azure::{AzureStorage, StorageConfig};
use spot_worker::storage::{CheckpointStore, ResultStore};
use spot_worker_testkit::Azurite;
use spot_worker_testkit::kube_stand_in::Kube;
use spot_worker_testkit::tls_front::TlsFront;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{enqueue_primes, start_worker};
use crate::in_the_box::pki;
use crate::rendered::worker_binary;

/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(180);
/// The workers' namespace (scripts/deploy-aks.sh's default).
const NAMESPACE: &str = "spot-worker";
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.spot-worker-service-account.test";

/// A CA and a certificate for 127.0.0.1 (the API server's stand-in), made
/// as the pod in a box makes its cluster's ([`pki`]).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca = pki::new_ca(dir, "kubernetes-ca");
    let server = ca.issue(
        dir,
        "kube-apiserver",
        &["127.0.0.1", "kubernetes.default.svc"],
    );
    (ca.cert, server.cert, server.key)
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
    api: Kube,
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
        let api = Kube::start(NAMESPACE).await.unwrap();
        // The token the kubelet mounts stands for the bound service account.
        api.grant(TOKEN, &api.role().subject.clone());
        let front = TlsFront::start("127.0.0.1:0".parse().unwrap(), &cert, &key, api.addr)
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
        let mut child = start_worker(
            Command::new(worker_binary())
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
                .env("SPOT_WORKER_POD_DELETION_COST_STEP", "1s"),
            Stdio::piped(),
        );
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
    enqueue_primes(&queue, "long", 200_000_000_000).await;
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
    let denied: Vec<_> = api.log().into_iter().filter(|a| a.status != 200).collect();
    assert!(denied.is_empty(), "every write was allowed: {denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_throttled_writes_lose_no_job_and_are_retried() {
    let cluster = Cluster::start("pod-cost-refused").await;
    // The API server throttles, then fails, before it accepts.
    cluster.api.fail_next(&[(429, Some(1)), (500, None)]);
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
        .log()
        .iter()
        .filter(|a| a.path.ends_with(&pod))
        .map(|a| a.status)
        .collect();
    assert_eq!(statuses, [429, 500, 200], "retried until it landed");

    // The refused pod's worker still does its jobs.
    let storage = cluster.storage();
    let queue = storage.queue(&cluster.queue).unwrap();
    let results = storage.result_store("results").unwrap();
    throttled.child.start_kill().unwrap();
    throttled.child.wait().await.unwrap();
    let small = enqueue_primes(&queue, "small", 2_000_000).await;
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
        .log()
        .iter()
        .filter(|a| a.path.starts_with("/api/v1/namespaces/default/"))
        .map(|a| a.status)
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
