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
//!
//! A bearer token is either one [`Arm::grant`] named, or a token the IMDS
//! emulator issued for Azure Resource Manager to a client id
//! [`Arm::grant_identity`] named (its `aud` is ARM, its `appid` the client
//! id, its `exp` not past): how the unmodified worker in the VM in a box
//! reaches it, with the role assignment of the bicep module.
//!
//! Shared by `crates/azure/tests/it/scale_in_protection.rs` (the runtime's
//! workers) and the VM in a box (the deployed binary, behind
//! [`crate::tls_front`] at `management.azure.com`).

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

/// The bicep module that defines the custom role, from the workspace root.
pub const ROLE_MODULE: &str = "bicep/modules/scale-in-protection.bicep";

/// The audiences of a token for Azure Resource Manager (public cloud), as
/// Entra ID and IMDS write them.
const ARM_AUDIENCES: [&str; 2] = [
    "https://management.azure.com",
    "https://management.azure.com/",
];

/// Why the role could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The module could not be read.
    #[error("reading the custom role from {path}: {source}")]
    Read {
        /// The module's path.
        path: String,
        /// Why not.
        source: std::io::Error,
    },
    /// The module has no `actions: [ ... ]` list, or an empty one.
    #[error("no actions in the custom role of {0}")]
    NoActions(String),
}

/// The actions of the custom role in the bicep module.
pub fn custom_role_actions() -> Result<Vec<String>, RoleError> {
    let path = crate::workspace_root().join(ROLE_MODULE);
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| RoleError::Read {
        path: shown.clone(),
        source,
    })?;
    let actions = role_actions(&text);
    if actions.is_empty() {
        return Err(RoleError::NoActions(shown));
    }
    Ok(actions)
}

/// The entries of the first `actions: [ ... ]` list of a bicep role
/// definition, one quoted action a line.
fn role_actions(text: &str) -> Vec<String> {
    let Some(start) = text.find("actions: [").map(|i| i + "actions: [".len()) else {
        return Vec::new();
    };
    let Some(end) = text[start..].find(']').map(|i| start + i) else {
        return Vec::new();
    };
    text[start..end]
        .lines()
        .map(|line| line.trim().trim_matches('\'').to_owned())
        .filter(|line| !line.is_empty())
        .collect()
}

/// Who a bearer token stands for: a role's actions at a scope.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The role's actions (a trailing `*` matches any rest).
    pub actions: Vec<String>,
    /// The assignment's scope: a resource id.
    pub scope: String,
}

/// One instance of a scale set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vm {
    /// `protectFromScaleIn`.
    pub protected: bool,
}

/// What the stand-in holds: instances by resource id (lower case).
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// The instances.
    pub vms: BTreeMap<String, Vm>,
    /// Answers given, by status.
    pub answered: BTreeMap<u16, u32>,
    /// Protections set (200 answers), in order: instance id, protect.
    pub protections: Vec<(String, bool)>,
}

struct Inner {
    fleet: watch::Sender<Fleet>,
    principals: Mutex<HashMap<String, Principal>>,
    /// Client ids of managed identities, whose IMDS tokens stand for these.
    identities: Mutex<HashMap<String, Principal>>,
    faults: Mutex<VecDeque<(StatusCode, Option<u64>)>>,
}

/// The running stand-in.
#[derive(Clone)]
pub struct Arm {
    inner: Arc<Inner>,
    /// `http://` and its loopback address.
    pub endpoint: String,
    /// Its loopback address (for a TLS front).
    pub addr: std::net::SocketAddr,
    /// `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute`.
    pub prefix: String,
}

impl Arm {
    /// Serves on a loopback port for the resource group `rg` of `sub`.
    pub async fn start(sub: &str, rg: &str) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            fleet: watch::channel(Fleet::default()).0,
            principals: Mutex::default(),
            identities: Mutex::default(),
            faults: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Arm {
            inner,
            endpoint: format!("http://{addr}"),
            addr,
            prefix: format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute"),
        })
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
        lock(&self.inner.principals).insert(token.to_owned(), principal);
    }

    /// Tokens the IMDS emulator issues for ARM to the managed identity
    /// `client_id` stand for `principal` (the identity's role assignment).
    pub fn grant_identity(&self, client_id: &str, principal: Principal) {
        lock(&self.inner.identities).insert(client_id.to_ascii_lowercase(), principal);
    }

    /// The calls that changed an instance's protection so far, in order:
    /// (instance resource id in lower case, `protectFromScaleIn`).
    pub fn protections(&self) -> Vec<(String, bool)> {
        self.inner.fleet.borrow().protections.clone()
    }

    /// The next calls answer these, in order, before any is served.
    pub fn fail_next(&self, faults: &[(StatusCode, Option<u64>)]) {
        lock(&self.inner.faults).extend(faults.iter().copied());
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

    /// Waits (at most `limit`) until the fleet satisfies `check`; the
    /// error says what was awaited and what the fleet was.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: std::time::Duration,
        check: impl FnMut(&Fleet) -> bool,
    ) -> Result<(), String> {
        let mut seen = self.inner.fleet.subscribe();
        match tokio::time::timeout(limit, seen.wait_for(check)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "timed out after {limit:?} waiting for {what}: {:?}",
                self.inner.fleet.borrow()
            )),
        }
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

/// A lock, whether or not a holder panicked (the maps stay consistent:
/// every change is one insert or pop).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The principal an IMDS emulator token stands for: its claims (the
/// unsigned JWT's middle part) name ARM as `aud`, a granted client id as
/// `appid`, and an `exp` not past.
fn identity_principal(inner: &Inner, token: &str) -> Option<Principal> {
    use base64::Engine as _;
    let claims = token.split('.').nth(1)?;
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims)
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&claims).ok()?;
    let audience = claims["aud"].as_str()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if !ARM_AUDIENCES.contains(&audience) || claims["exp"].as_u64()? <= now {
        return None;
    }
    let client_id = claims["appid"].as_str()?.to_ascii_lowercase();
    lock(&inner.identities).get(&client_id).cloned()
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
    let granted = lock(&inner.principals).get(token).cloned();
    let Some(principal) = granted.or_else(|| identity_principal(inner, token)) else {
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
    let fault = lock(&inner.faults).pop_front();
    if let Some((status, retry_after)) = fault {
        let mut response = arm_error(status, "Injected", "a fault queued by the test");
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from(seconds));
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
            fleet.protections.push((resource.clone(), protect));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_is_read_from_the_bicep_module() {
        let actions = custom_role_actions().unwrap();
        assert!(
            actions.iter().any(|a| a.eq_ignore_ascii_case(WRITE_ACTION)),
            "{actions:?}"
        );
        assert!(role_actions("no role here").is_empty());
        assert_eq!(
            role_actions("actions: [\n  'a/b'\n  'c/*'\n]"),
            ["a/b", "c/*"]
        );
    }

    #[test]
    fn actions_match_as_arm_matches_them() {
        let granted = ["Microsoft.Compute/virtualMachineScaleSets/*".to_owned()];
        assert!(allows(&granted, WRITE_ACTION));
        assert!(allows(&[WRITE_ACTION.to_uppercase()], WRITE_ACTION));
        assert!(!allows(
            &["Microsoft.Compute/virtualMachineScaleSets/read".to_owned()],
            WRITE_ACTION
        ));
    }
}
