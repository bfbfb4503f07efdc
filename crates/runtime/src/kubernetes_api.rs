//! The one call this worker makes to the Kubernetes API: a JSON merge patch
//! of its own pod's `controller.kubernetes.io/pod-deletion-cost` annotation
//! (issue 39, item 2), as any in-cluster client does it.
//!
//! - **Where**: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/NS/pods/NAME`,
//!   the pod's name and namespace from the downward API
//!   (`SPOT_WORKER_POD_NAME`, `SPOT_WORKER_POD_NAMESPACE`, set in
//!   deploy/kubernetes/deployment.yaml).
//! - **Who**: the pod's service-account token (`token` in
//!   `SPOT_WORKER_SERVICE_ACCOUNT_DIR`), re-read for every call since the
//!   kubelet rotates it; sent only to the API server, over TLS checked
//!   against the cluster's CA (`ca.crt` there) and nothing else; never
//!   logged.
//! - **What it may do**: the Role in deploy/kubernetes/pod-deletion-cost.yaml
//!   allows `patch` on pods in the worker's namespace and nothing more.
//!
//! A small module of the runtime rather than a crate of its own or a
//! Kubernetes client library: one request with one body, through the
//! `reqwest` the workspace already builds; the runtime owns the worker's
//! activity it reports, and `spot-worker-azure` is for Azure only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use spot_worker_settings::{Source, table};

use crate::error::ConfigError;
use crate::pod_deletion_cost::{CostWriteError, DeletionCostTarget};

/// The annotation the ReplicaSet controller ranks pods by on scale-in.
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// How long one patch may take, connection included: a slow API server
/// delays only the next cost, never a job.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where this pod is and how to reach its API server, from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSettings {
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
    /// `KUBERNETES_SERVICE_HOST`.
    pub api_host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub api_port: u16,
    /// Where `token` and `ca.crt` are.
    pub service_account_dir: PathBuf,
    /// The cost's step and least interval between busy values
    /// (`SPOT_WORKER_POD_DELETION_COST_STEP`).
    pub step: Duration,
}

impl PodSettings {
    /// The settings when the pod's deletion cost is to be kept: `None`
    /// when `SPOT_WORKER_POD_DELETION_COST` is off or the worker is not in a
    /// pod (`SPOT_WORKER_POD_NAME` unset); an error when it is in one but
    /// the namespace or the API server's address is missing.
    pub fn from_source(source: &Source) -> Result<Option<Self>, ConfigError> {
        if !source.get(&table::POD_DELETION_COST)? {
            return Ok(None);
        }
        let Some(name) = source.get(&table::POD_NAME)? else {
            return Ok(None);
        };
        let required = |value: Option<String>, key: &str, reason: &str| {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| ConfigError::Invalid {
                    setting: key.to_owned(),
                    value: String::new(),
                    reason: format!("{reason} (or set {}=false)", table::POD_DELETION_COST.key),
                })
        };
        let namespace = required(
            source.get(&table::POD_NAMESPACE)?.map(|v| v.into_owned()),
            table::POD_NAMESPACE.key,
            "required with SPOT_WORKER_POD_NAME: the pod's metadata.namespace from the downward API",
        )?;
        let api_host = required(
            source
                .get(&table::KUBERNETES_SERVICE_HOST)?
                .map(|v| v.into_owned()),
            table::KUBERNETES_SERVICE_HOST.key,
            "the kubelet sets it in every pod; without it the API server cannot be reached",
        )?;
        let port = source.get(&table::KUBERNETES_SERVICE_PORT)?.unwrap_or(443);
        let api_port =
            u16::try_from(port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ConfigError::Invalid {
                    setting: table::KUBERNETES_SERVICE_PORT.key.to_owned(),
                    value: port.to_string(),
                    reason: "not a TCP port".to_owned(),
                })?;
        Ok(Some(PodSettings {
            name: name.into_owned(),
            namespace,
            api_host,
            api_port,
            service_account_dir: PathBuf::from(source.get(&table::SERVICE_ACCOUNT_DIR)?.as_ref()),
            step: source.get(&table::POD_DELETION_COST_STEP)?,
        }))
    }

    /// The pod's URL on the API server.
    pub fn pod_url(&self) -> String {
        // An IPv6 address is bracketed in a URL, as client-go does.
        let host = if self.api_host.contains(':') && !self.api_host.starts_with('[') {
            format!("[{}]", self.api_host)
        } else {
            self.api_host.clone()
        };
        format!(
            "https://{host}:{}/api/v1/namespaces/{}/pods/{}",
            self.api_port, self.namespace, self.name
        )
    }
}

/// Writes the deletion cost of this pod through the Kubernetes API.
pub struct KubernetesPodCost {
    client: reqwest::Client,
    url: String,
    token_file: PathBuf,
}

impl KubernetesPodCost {
    /// A client for the pod `settings` name, trusting only the cluster CA
    /// in its service-account directory. Refused (with what to do) when
    /// the CA or the token cannot be read: a pod whose token is not
    /// mounted (`automountServiceAccountToken: false`) cannot keep its cost.
    pub fn new(settings: &PodSettings) -> Result<Self, ConfigError> {
        let dir = &settings.service_account_dir;
        let invalid = |reason: String| ConfigError::Invalid {
            setting: table::SERVICE_ACCOUNT_DIR.key.to_owned(),
            value: dir.display().to_string(),
            reason: format!(
                "{reason}; mount the service-account token (automountServiceAccountToken: true, \
                 deploy/kubernetes/deployment.yaml) or set {}=false",
                table::POD_DELETION_COST.key
            ),
        };
        let ca_file = dir.join("ca.crt");
        let pem = std::fs::read(&ca_file)
            .map_err(|e| invalid(format!("cannot read {}: {e}", ca_file.display())))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| invalid(format!("{} is not a PEM bundle: {e}", ca_file.display())))?;
        if certificates.is_empty() {
            return Err(invalid(format!(
                "{} holds no certificate",
                ca_file.display()
            )));
        }
        let token_file = dir.join("token");
        read_token(&token_file).map_err(|e| invalid(e.message))?;
        let client = reqwest::Client::builder()
            .tls_certs_only(certificates)
            .https_only(true)
            .timeout(REQUEST_TIMEOUT)
            // The API server is reached directly, never through a proxy
            // the environment may name.
            .no_proxy()
            .build()
            .map_err(|e| invalid(format!("cannot build the HTTPS client: {e}")))?;
        Ok(Self {
            client,
            url: settings.pod_url(),
            token_file,
        })
    }
}

/// The token in `file`, trimmed; the error names the file, never the token.
fn read_token(file: &Path) -> Result<String, CostWriteError> {
    let unreadable = |reason: String| CostWriteError {
        message: format!("service-account token {}: {reason}", file.display()),
        status: None,
        retry_after: None,
    };
    let text = std::fs::read_to_string(file).map_err(|e| unreadable(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(unreadable("empty".to_owned()));
    }
    Ok(token.to_owned())
}

#[async_trait]
impl DeletionCostTarget for KubernetesPodCost {
    async fn set(&self, cost: i32) -> Result<(), CostWriteError> {
        let token = read_token(&self.token_file)?;
        // Annotation values are strings; a merge patch touches only this one.
        let body = serde_json::json!({
            "metadata": { "annotations": { DELETION_COST_ANNOTATION: cost.to_string() } }
        });
        let response = self
            .client
            .patch(&self.url)
            .bearer_auth(token)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/merge-patch+json",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| CostWriteError {
                // reqwest's error names the URL, never the headers.
                message: format!("PATCH {}: {e}", self.url),
                status: None,
                retry_after: None,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // The API server's Status object says why (e.g. the verb and the
        // resource a 403 refused); bounded, it holds no secret.
        let text = response.text().await.unwrap_or_default();
        let reason: String = text.chars().take(300).collect();
        Err(CostWriteError {
            message: format!("PATCH {}: HTTP {status}: {reason}", self.url),
            status: Some(status.as_u16()),
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Option<PodSettings>, ConfigError> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let source = Source::from_lookup(move |key| {
            owned.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        })
        .expect("a source");
        PodSettings::from_source(&source)
    }

    #[test]
    fn only_in_a_pod_and_only_when_on() {
        let pod = [
            ("SPOT_WORKER_POD_NAME", "spot-worker-7d9-abc"),
            ("SPOT_WORKER_POD_NAMESPACE", "jobs"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ];
        let found = settings(&pod).unwrap().expect("in a pod: on by default");
        assert_eq!(
            found.pod_url(),
            "https://10.0.0.1:443/api/v1/namespaces/jobs/pods/spot-worker-7d9-abc"
        );
        assert_eq!(
            found.service_account_dir,
            Path::new("/var/run/secrets/kubernetes.io/serviceaccount")
        );
        assert_eq!(found.step, Duration::from_secs(60));
        assert_eq!(settings(&[]).unwrap(), None, "not in a pod");
        let mut off = pod.to_vec();
        off.push(("SPOT_WORKER_POD_DELETION_COST", "false"));
        assert_eq!(settings(&off).unwrap(), None, "turned off");
        let v6 = [
            ("SPOT_WORKER_POD_NAME", "p"),
            ("SPOT_WORKER_POD_NAMESPACE", "n"),
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ];
        assert_eq!(
            settings(&v6).unwrap().unwrap().pod_url(),
            "https://[fd00::1]:6443/api/v1/namespaces/n/pods/p"
        );
    }

    #[test]
    fn a_pod_without_its_namespace_or_api_server_is_refused_with_what_to_do() {
        let no_namespace = [
            ("SPOT_WORKER_POD_NAME", "p"),
            ("KUBERNETES_SERVICE_HOST", "h"),
        ];
        let error = settings(&no_namespace).unwrap_err().to_string();
        assert!(error.contains("SPOT_WORKER_POD_NAMESPACE"), "{error}");
        assert!(
            error.contains("SPOT_WORKER_POD_DELETION_COST=false"),
            "{error}"
        );
        let no_host = [
            ("SPOT_WORKER_POD_NAME", "p"),
            ("SPOT_WORKER_POD_NAMESPACE", "n"),
        ];
        let error = settings(&no_host).unwrap_err().to_string();
        assert!(error.contains("KUBERNETES_SERVICE_HOST"), "{error}");
        let bad_port = [
            ("SPOT_WORKER_POD_NAME", "p"),
            ("SPOT_WORKER_POD_NAMESPACE", "n"),
            ("KUBERNETES_SERVICE_HOST", "h"),
            ("KUBERNETES_SERVICE_PORT", "70000"),
        ];
        assert!(settings(&bad_port).is_err());
    }

    #[test]
    fn a_missing_token_or_ca_is_refused_without_showing_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let pod = PodSettings {
            name: "p".into(),
            namespace: "n".into(),
            api_host: "127.0.0.1".into(),
            api_port: 443,
            service_account_dir: dir.path().to_owned(),
            step: Duration::from_secs(60),
        };
        let error = KubernetesPodCost::new(&pod)
            .err()
            .expect("no CA")
            .to_string();
        assert!(
            error.contains("ca.crt") && error.contains("automountServiceAccountToken"),
            "{error}"
        );
        std::fs::write(dir.path().join("token"), "  \n").unwrap();
        let error = read_token(&dir.path().join("token"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("empty"), "{error}");
        std::fs::write(dir.path().join("token"), "s3cret-token\n").unwrap();
        assert_eq!(
            read_token(&dir.path().join("token")).unwrap(),
            "s3cret-token"
        );
        let error = read_token(&dir.path().join("absent"))
            .unwrap_err()
            .to_string();
        assert!(!error.contains("s3cret"), "{error}");
    }
}
