//! A plain-HTTP stand-in of the Kubernetes API server and the ReplicaSet
//! controller, as far as a worker keeping its pod's deletion cost reaches
//! them (issue 39, item 2), and nothing else:
//!
//! - it authorises by the Role and RoleBinding of
//!   `deploy/kubernetes/pod-deletion-cost.yaml`, read from the file: a
//!   bearer token [`Kube::grant`]ed to a service account stands for it; a
//!   request of a verb, resource or namespace the Role does not allow to
//!   the bound service account is refused with 403, an unknown token with
//!   401;
//! - it applies JSON merge patches to the pods' annotations and records
//!   every `controller.kubernetes.io/pod-deletion-cost` written;
//! - on a scale-in it picks the pods the ReplicaSet controller would
//!   (Kubernetes' ReplicaSet docs, "Scaling a ReplicaSet", and KEP-2255):
//!   all pods here are scheduled, running and ready on one node, so the
//!   lower deletion cost goes first (a pod without one counts 0), then the
//!   more recently created. Stopping the removed pods' containers is the
//!   caller's (what the kubelet does).
//!
//! Faults (429 with `Retry-After`, 500) can be queued ahead of the next
//! allowed patches. Shared by `tests/it/pod_deletion_cost.rs` (the worker
//! binary on loopback) and the pod in a box, each behind
//! [`crate::tls_front`] with its own certificate.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::arm_stand_in::lock;

/// The annotation the ReplicaSet controller ranks pods by.
pub const ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The manifest of the Role and RoleBinding, from the workspace root.
pub const MANIFEST: &str = "deploy/kubernetes/pod-deletion-cost.yaml";

mod role;

pub use role::{KubeError, Role};

/// One pod as the stand-in keeps it.
#[derive(Clone, Debug, Default)]
pub struct Pod {
    /// Creation order (higher: newer).
    pub created: usize,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
    /// Every deletion cost written, in order.
    pub costs: Vec<i32>,
    /// Removed by a scale-in (terminating: still patchable, never picked
    /// again).
    pub removed: bool,
}

impl Pod {
    /// Its deletion cost as the controller reads it (none: 0).
    pub fn cost(&self) -> i32 {
        self.annotations
            .get(ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// One request answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// Its method.
    pub method: String,
    /// Its path.
    pub path: String,
    /// The status answered.
    pub status: u16,
}

/// What the stand-in holds.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// The pods by name.
    pub pods: BTreeMap<String, Pod>,
    /// Every request answered, in order.
    pub log: Vec<Answered>,
}

impl Cluster {
    /// The deletion costs written to `pod` so far, in order.
    pub fn costs(&self, pod: &str) -> Vec<i32> {
        self.pods
            .get(pod)
            .map(|p| p.costs.clone())
            .unwrap_or_default()
    }
}

struct Inner {
    role: Role,
    cluster: watch::Sender<Cluster>,
    /// Bearer tokens and the service account (`namespace/name`) each
    /// stands for.
    tokens: Mutex<BTreeMap<String, String>>,
    /// Answers given instead of applying the next allowed patches:
    /// (status, Retry-After seconds).
    faults: Mutex<VecDeque<(u16, Option<u64>)>>,
}

/// The running stand-in (plain HTTP on loopback: put a
/// [`crate::tls_front::TlsFront`] before it).
#[derive(Clone)]
pub struct Kube {
    inner: Arc<Inner>,
    /// Its plain-HTTP address.
    pub addr: SocketAddr,
}

impl Kube {
    /// Serves on a loopback port, authorising by the manifest's Role
    /// rendered for `namespace`.
    pub async fn start(namespace: &str) -> Result<Kube, KubeError> {
        let role = Role::from_manifest(namespace)?;
        let inner = Arc::new(Inner {
            role,
            cluster: watch::channel(Cluster::default()).0,
            tokens: Mutex::default(),
            faults: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(KubeError::Bind)?;
        let addr = listener.local_addr().map_err(KubeError::Bind)?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Kube { inner, addr })
    }

    /// The Role it authorises by.
    pub fn role(&self) -> &Role {
        &self.inner.role
    }

    /// `token` stands for the service account `account`
    /// (`namespace/name`), as a service-account token does.
    pub fn grant(&self, token: &str, account: &str) {
        lock(&self.inner.tokens).insert(token.to_owned(), account.to_owned());
    }

    /// Creates the pod `name` (newer than those before).
    pub fn add_pod(&self, name: &str) {
        self.inner.cluster.send_modify(|cluster| {
            let created = cluster.pods.len();
            cluster.pods.insert(
                name.to_owned(),
                Pod {
                    created,
                    ..Pod::default()
                },
            );
        });
    }

    /// Deletes the pod object `name` (its container has stopped): gone
    /// from the ReplicaSet, a patch of it is 404.
    pub fn delete_pod(&self, name: &str) {
        self.inner.cluster.send_modify(|cluster| {
            cluster.pods.remove(name);
        });
    }

    /// A copy of what it holds now.
    pub fn cluster(&self) -> Cluster {
        self.inner.cluster.borrow().clone()
    }

    /// The deletion costs written to `pod` so far, in order.
    pub fn costs(&self, pod: &str) -> Vec<i32> {
        self.inner.cluster.borrow().costs(pod)
    }

    /// Every request answered so far.
    pub fn log(&self) -> Vec<Answered> {
        self.inner.cluster.borrow().log.clone()
    }

    /// The next allowed patches are answered these (status, Retry-After
    /// seconds), in order, instead of being applied.
    pub fn fail_next(&self, faults: &[(u16, Option<u64>)]) {
        lock(&self.inner.faults).extend(faults.iter().copied());
    }

    /// Waits (at most `limit`) until the cluster satisfies `check`; the
    /// error says what was awaited and what the cluster was.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        check: impl FnMut(&Cluster) -> bool,
    ) -> Result<(), String> {
        let mut seen = self.inner.cluster.subscribe();
        match tokio::time::timeout(limit, seen.wait_for(check)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "timed out after {limit:?} waiting for {what}: {:?}",
                self.inner.cluster.borrow().pods
            )),
        }
    }

    /// Scales the pods down to `replicas` by the ReplicaSet controller's
    /// ranking (see the module doc); returns the removed pods' names.
    pub fn scale_in(&self, replicas: usize) -> Vec<String> {
        let mut removed = Vec::new();
        self.inner.cluster.send_modify(|cluster| {
            removed = to_remove(&cluster.pods, replicas);
            for name in &removed {
                if let Some(pod) = cluster.pods.get_mut(name) {
                    pod.removed = true;
                }
            }
        });
        removed
    }
}

/// The pods a scale-in to `replicas` removes: the lowest deletion cost
/// first, then the newest.
fn to_remove(pods: &BTreeMap<String, Pod>, replicas: usize) -> Vec<String> {
    let mut live: Vec<(&String, &Pod)> = pods.iter().filter(|(_, p)| !p.removed).collect();
    live.sort_by(|(_, a), (_, b)| a.cost().cmp(&b.cost()).then(b.created.cmp(&a.created)));
    live.iter()
        .take(live.len().saturating_sub(replicas))
        .map(|(name, _)| (*name).clone())
        .collect()
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (status, retry_after, text) = answer(&inner, &method, &uri, &headers, &body);
    inner.cluster.send_modify(|cluster| {
        cluster.log.push(Answered {
            method: method.to_string(),
            path: uri.path().to_owned(),
            status: status.as_u16(),
        });
    });
    let mut response = (status, [("content-type", "application/json")], text).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from(seconds));
    }
    response
}

/// A Kubernetes `Status` answer.
fn status(code: StatusCode, reason: &str, message: String) -> (StatusCode, Option<u64>, String) {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "message": message, "code": code.as_u16(),
    });
    (code, None, body.to_string())
}

fn answer(
    inner: &Inner,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, Option<u64>, String) {
    let account = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| lock(&inner.tokens).get(token).cloned());
    let Some(account) = account else {
        return status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
        );
    };
    // /api/v1/namespaces/NS/RESOURCE/NAME or /apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME
    let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _, rest @ ..] => (*group, rest),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
            );
        }
    };
    let ["namespaces", namespace, resource, name] = rest else {
        return status(
            StatusCode::NOT_FOUND,
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
    if !inner
        .role
        .allows(&account, namespace, group, resource, verb)
    {
        let user = format!("system:serviceaccount:{}", account.replace('/', ":"));
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{resource} \"{name}\" is forbidden: User \"{user}\" cannot {verb} resource \
                 \"{resource}\" in API group \"{group}\" in the namespace \"{namespace}\""
            ),
        );
    }
    if let Some((code, retry_after)) = lock(&inner.faults).pop_front() {
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (code, _, text) = status(code, "Fault", format!("planted {code}"));
        return (code, retry_after, text);
    }
    if verb != "patch" {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the stand-in only patches".into(),
        );
    }
    if headers.get("content-type").and_then(|v| v.to_str().ok())
        != Some("application/merge-patch+json")
    {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "expected a JSON merge patch".into(),
        );
    }
    let Ok(patch) = serde_json::from_slice::<serde_json::Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let Some(annotations) = patch
        .pointer("/metadata/annotations")
        .and_then(|a| a.as_object())
    else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "the stand-in expects an annotations patch".into(),
        );
    };
    let mut answer = None;
    inner.cluster.send_modify(|cluster| {
        // A removed pod is terminating: its object stays, patchable, until
        // its container has stopped, as in a cluster.
        answer = Some(match cluster.pods.get_mut(*name) {
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("pods \"{name}\" not found"),
            ),
            Some(pod) => apply(pod, annotations, name, namespace),
        });
    });
    answer.unwrap_or_else(|| {
        status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the patch was not applied".into(),
        )
    })
}

/// Applies an annotations merge patch to `pod`, all or nothing, as the API
/// server validates it (the deletion cost must be an int32).
fn apply(
    pod: &mut Pod,
    annotations: &serde_json::Map<String, serde_json::Value>,
    name: &str,
    namespace: &str,
) -> (StatusCode, Option<u64>, String) {
    let mut patched = pod.annotations.clone();
    let mut costs = Vec::new();
    for (key, value) in annotations {
        match value {
            serde_json::Value::Null => {
                patched.remove(key);
            }
            serde_json::Value::String(text) => {
                if key == ANNOTATION {
                    let Ok(cost) = text.parse::<i32>() else {
                        return status(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "Invalid",
                            format!("{ANNOTATION}: {text:?} is not an int32"),
                        );
                    };
                    costs.push(cost);
                }
                patched.insert(key.clone(), text.clone());
            }
            other => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("annotation {key} is {other}, not a string"),
                );
            }
        }
    }
    pod.annotations = patched;
    pod.costs.extend(costs);
    let body = serde_json::json!({"kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, "annotations": pod.annotations}});
    (StatusCode::OK, None, body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_is_read_from_the_manifest() {
        let role = Role::from_manifest("ns").unwrap();
        assert_eq!(role.subject, "ns/spot-worker");
        assert!(role.allows("ns/spot-worker", "ns", "", "pods", "patch"));
        assert!(!role.allows("ns/spot-worker", "ns", "", "pods", "get"));
        assert!(!role.allows("ns/spot-worker", "other", "", "pods", "patch"));
        assert!(!role.allows("ns/default", "ns", "", "pods", "patch"));
        assert!(Role::parse("kind: nothing").is_err());
    }

    #[test]
    fn a_scale_in_removes_the_lowest_cost_then_the_newest() {
        let pod = |created, cost: Option<i32>| Pod {
            created,
            annotations: cost
                .map(|c| (ANNOTATION.to_owned(), c.to_string()))
                .into_iter()
                .collect(),
            ..Pod::default()
        };
        let pods: BTreeMap<String, Pod> = [
            ("busy".to_owned(), pod(0, Some(40))),
            ("old-idle".to_owned(), pod(1, Some(0))),
            ("new-unset".to_owned(), pod(2, None)),
        ]
        .into();
        assert_eq!(to_remove(&pods, 2), ["new-unset"]);
        assert_eq!(to_remove(&pods, 1), ["new-unset", "old-idle"]);
        assert!(to_remove(&pods, 3).is_empty());
    }
}
