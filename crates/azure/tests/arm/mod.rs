//! A loopback stand-in of Azure Resource Manager for one resource group's
//! scale sets, as far as a worker protecting its own VM reaches it:
//! `PUT …/virtualMachineScaleSets/{set}/virtualMachines/{instance}` with
//! `properties.protectionPolicy.protectFromScaleIn`, authorized as ARM does
//! (a bearer token, the principal's role assignments: the action must be in
//! the role and the resource under the assignment's scope, else 403
//! `AuthorizationFailed`), and a scale-in that, like Azure's, never picks a
//! protected instance. Faults (429 with `Retry-After`, 500) can be queued
//! ahead of the next calls.
//!
//! The custom role's actions are read from
//! `bicep/modules/scale-in-protection.bicep`, not repeated here, so the
//! template and what the worker needs cannot drift apart unseen.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

/// The action the protection's PUT needs.
pub const WRITE_ACTION: &str = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write";

/// The first Compute API version with instance protection on Flexible
/// scale sets.
const FLEXIBLE_PROTECTION_FROM: &str = "2023-09-01";

/// The actions of the custom role in the bicep module.
pub fn custom_role_actions() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bicep/modules/scale-in-protection.bicep"
    );
    let text = std::fs::read_to_string(path).expect("the bicep module is readable");
    let start = text.find("actions: [").expect("the role has actions") + "actions: [".len();
    let end = start + text[start..].find(']').expect("the actions end");
    let actions: Vec<String> = text[start..end]
        .lines()
        .map(|line| line.trim().trim_matches('\'').to_owned())
        .filter(|line| !line.is_empty())
        .collect();
    assert!(!actions.is_empty(), "no actions read from {path}");
    actions
}

/// Who a bearer token stands for: a role's actions at a scope.
#[derive(Clone, Debug)]
pub struct Principal {
    pub actions: Vec<String>,
    pub scope: String,
}

/// One instance of a scale set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vm {
    pub protected: bool,
}

/// What the stand-in holds: instances by resource id (lower case).
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    pub vms: BTreeMap<String, Vm>,
    /// Answers given, by status.
    pub answered: BTreeMap<u16, u32>,
}

struct Inner {
    fleet: watch::Sender<Fleet>,
    principals: Mutex<HashMap<String, Principal>>,
    faults: Mutex<VecDeque<(StatusCode, Option<u64>)>>,
}

/// The running stand-in.
#[derive(Clone)]
pub struct Arm {
    inner: Arc<Inner>,
    pub endpoint: String,
    pub prefix: String,
}

impl Arm {
    /// Serves on a loopback port for the resource group `rg` of `sub`.
    pub async fn start(sub: &str, rg: &str) -> Self {
        let inner = Arc::new(Inner {
            fleet: watch::channel(Fleet::default()).0,
            principals: Mutex::default(),
            faults: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Arm {
            inner,
            endpoint,
            prefix: format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute"),
        }
    }

    /// A scale set's resource id.
    pub fn scale_set(&self, set: &str) -> String {
        format!("{}/virtualMachineScaleSets/{set}", self.prefix)
    }

    /// Adds an instance of `set`.
    pub fn add_vm(&self, set: &str, instance: &str, protected: bool) {
        let id = format!("{}/virtualMachines/{instance}", self.scale_set(set)).to_lowercase();
        self.inner.fleet.send_modify(|fleet| {
            fleet.vms.insert(id, Vm { protected });
        });
    }

    /// An instance's state, if it is still there.
    pub fn vm(&self, set: &str, instance: &str) -> Option<Vm> {
        let id = format!("{}/virtualMachines/{instance}", self.scale_set(set)).to_lowercase();
        self.inner.fleet.borrow().vms.get(&id).copied()
    }

    /// Tokens `token` stand for `principal`.
    pub fn grant(&self, token: &str, principal: Principal) {
        self.inner
            .principals
            .lock()
            .unwrap()
            .insert(token.to_owned(), principal);
    }

    /// The next calls answer these, in order, before any is served.
    pub fn fail_next(&self, faults: &[(StatusCode, Option<u64>)]) {
        self.inner
            .faults
            .lock()
            .unwrap()
            .extend(faults.iter().copied());
    }

    /// Answers given with `status` so far.
    pub fn answered(&self, status: u16) -> u32 {
        self.inner
            .fleet
            .borrow()
            .answered
            .get(&status)
            .copied()
            .unwrap_or(0)
    }

    /// Waits (at most `limit`) until the fleet satisfies `check`.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: std::time::Duration,
        check: impl FnMut(&Fleet) -> bool,
    ) {
        let mut seen = self.inner.fleet.subscribe();
        tokio::time::timeout(limit, seen.wait_for(check))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out after {limit:?} waiting for {what}: {:?}",
                    self.inner.fleet.borrow()
                )
            })
            .expect("the stand-in runs");
    }

    /// Azure's scale-in of `n` instances of `set`: only instances not
    /// protected from scale-in are considered. Returns the ones removed.
    pub fn scale_in(&self, set: &str, n: usize) -> Vec<String> {
        let prefix = format!("{}/virtualMachines/", self.scale_set(set)).to_lowercase();
        let mut removed = Vec::new();
        self.inner.fleet.send_modify(|fleet| {
            let candidates: Vec<String> = fleet
                .vms
                .iter()
                .filter(|(id, vm)| id.starts_with(&prefix) && !vm.protected)
                .map(|(id, _)| id.clone())
                .take(n)
                .collect();
            for id in candidates {
                fleet.vms.remove(&id);
                removed.push(id[prefix.len()..].to_owned());
            }
        });
        removed
    }
}

fn arm_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    (status, axum::Json(body)).into_response()
}

/// Whether `action` is one of `actions` (ARM compares case-insensitively;
/// a trailing `*` matches any rest).
fn allows(actions: &[String], action: &str) -> bool {
    let action = action.to_ascii_lowercase();
    actions.iter().any(|granted| {
        let granted = granted.to_ascii_lowercase();
        match granted.strip_suffix('*') {
            Some(prefix) => action.starts_with(prefix),
            None => granted == action,
        }
    })
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let response = serve(&inner, &method, &uri, &headers, &body);
    let status = response.status().as_u16();
    inner
        .fleet
        .send_modify(|fleet| *fleet.answered.entry(status).or_default() += 1);
    response
}

fn serve(inner: &Inner, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
    let Some(token) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return arm_error(
            StatusCode::UNAUTHORIZED,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing.",
        );
    };
    let Some(principal) = inner.principals.lock().unwrap().get(token).cloned() else {
        return arm_error(
            StatusCode::UNAUTHORIZED,
            "InvalidAuthenticationToken",
            "The access token is invalid.",
        );
    };
    let resource = uri.path().to_lowercase();
    let is_instance = resource.contains("/providers/microsoft.compute/virtualmachinescalesets/")
        && resource.split('/').rev().nth(1) == Some("virtualmachines");
    if !is_instance || method != Method::PUT {
        return arm_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the stand-in serves PUT on scale set instances only",
        );
    }
    let action = WRITE_ACTION;
    let scope = principal.scope.to_lowercase();
    let in_scope = resource == scope || resource.starts_with(&format!("{scope}/"));
    if !in_scope || !allows(&principal.actions, action) {
        return arm_error(
            StatusCode::FORBIDDEN,
            "AuthorizationFailed",
            &format!(
                "The client does not have authorization to perform action '{action}' over scope '{}'",
                uri.path()
            ),
        );
    }
    if let Some((status, retry_after)) = inner.faults.lock().unwrap().pop_front() {
        let mut response = arm_error(status, "Injected", "a fault queued by the test");
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", seconds.to_string().parse().unwrap());
        }
        return response;
    }
    let version = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("api-version="))
        .unwrap_or_default();
    if version < FLEXIBLE_PROTECTION_FROM {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "instance protection on Flexible scale sets needs api-version 2023-09-01 or later",
        );
    }
    let Some(protect) = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["properties"]["protectionPolicy"]["protectFromScaleIn"].as_bool())
    else {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequestContent",
            "properties.protectionPolicy.protectFromScaleIn missing",
        );
    };
    let mut found = false;
    inner.fleet.send_modify(|fleet| {
        if let Some(vm) = fleet.vms.get_mut(&resource) {
            vm.protected = protect;
            found = true;
        }
    });
    if !found {
        return arm_error(
            StatusCode::NOT_FOUND,
            "ResourceNotFound",
            "the instance is not in the scale set",
        );
    }
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({
            "properties": {"protectionPolicy": {"protectFromScaleIn": protect}}
        })),
    )
        .into_response()
}
