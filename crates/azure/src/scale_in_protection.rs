//! This VM's protection from scale-in, set through Azure Resource Manager
//! (issue 39, item 1): the runtime's
//! [`ScaleInProtection`](spot_worker_runtime::scale_in_protection::ScaleInProtection)
//! for a VM of a scale set.
//!
//! One call: `PUT {arm}/subscriptions/{sub}/resourceGroups/{rg}/providers/
//! Microsoft.Compute/virtualMachineScaleSets/{set}/virtualMachines/{instance}`
//! with `{"properties": {"protectionPolicy": {"protectFromScaleIn": b}}}`,
//! API version [`API_VERSION`] (Flexible orchestration needs 2023-09-01 or
//! later; a Flexible VM's instance id there is its name). The action is
//! `Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write`, the one
//! the custom role of `bicep/modules/scale-in-protection.bicep` grants on the
//! scale set alone.
//!
//! The bearer token comes from the worker's credential (its managed
//! identity on a VM) for [`ARM_SCOPE`]; it is never logged and never sent
//! over plain http except to a loopback host. A 429 or 503 with
//! `Retry-After` gives that delay back to the keeper's backoff; any other
//! failure is an error with the status and a one-line excerpt of ARM's
//! answer (its `error.code`, e.g. `AuthorizationFailed`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use azure_core::http::Url;
use spot_worker_imds::{ImdsClient, ScaleSetMember};
use spot_worker_runtime::scale_in_protection::{ProtectionError, ScaleInProtection};

use crate::error::one_line;
use crate::redact::redact;
use crate::service_url::check_service_url;

/// The Compute API version of the call: the first to support instance
/// protection on Flexible scale sets is 2023-09-01; this is the one the
/// templates use (`bicep/modules/compute.bicep`).
pub const API_VERSION: &str = "2024-07-01";

/// The token scope for Azure Resource Manager (public cloud).
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// A connection to ARM that takes longer is not coming soon.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole call: ARM answers a VM update in seconds (the change itself
/// finishes asynchronously).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of an error body goes into the error.
const EXCERPT_CHARS: usize = 300;

/// The ARM endpoint of the cloud IMDS names in `compute.azEnvironment`: a
/// constant per cloud, not a setting.
pub fn arm_endpoint(environment: &str) -> Result<&'static str, ArmSetupError> {
    match environment.to_ascii_lowercase().as_str() {
        "" | "azurepubliccloud" => Ok("https://management.azure.com"),
        "azureusgovernmentcloud" => Ok("https://management.usgovcloudapi.net"),
        "azurechinacloud" => Ok("https://management.chinacloudapi.cn"),
        _ => Err(ArmSetupError::UnknownCloud(environment.to_owned())),
    }
}

/// Why the protection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ArmSetupError {
    /// IMDS named a cloud whose ARM endpoint is not known here.
    #[error(
        "no known Azure Resource Manager endpoint for the cloud {0:?} (compute.azEnvironment); \
         scale-in protection works in AzurePublicCloud, AzureUSGovernmentCloud and AzureChinaCloud"
    )]
    UnknownCloud(String),
    /// The ARM endpoint is not a URL this client may send a token to.
    #[error("the Azure Resource Manager endpoint {endpoint} {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why not.
        reason: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("building the Azure Resource Manager HTTP client: {0}")]
    Client(String),
}

/// Sets `protectFromScaleIn` on this VM's instance of its scale set.
pub struct ArmScaleInProtection {
    http: reqwest::Client,
    credential: Arc<dyn TokenCredential>,
    /// Where this VM is, once known.
    instance: tokio::sync::OnceCell<Instance>,
    /// Where to learn it, when not given: instance metadata.
    imds: Option<ImdsClient>,
}

/// The instance's URL and the token scope of its ARM endpoint.
#[derive(Debug, Clone)]
struct Instance {
    url: Url,
    scope: String,
}

impl std::fmt::Debug for ArmScaleInProtection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArmScaleInProtection")
            .field("instance", &self.instance.get().map(|i| i.url.as_str()))
            .finish_non_exhaustive()
    }
}

impl ArmScaleInProtection {
    /// For this VM as instance metadata (`imds`) describes it, in its own
    /// cloud's ARM endpoint ([`arm_endpoint`]), with tokens from
    /// `credential`. Instance metadata is read on the first call (and again
    /// after a failed read): a worker is built before it runs.
    pub fn from_imds(
        imds: ImdsClient,
        credential: Arc<dyn TokenCredential>,
    ) -> Result<Self, ArmSetupError> {
        Ok(Self {
            http: http_client()?,
            credential,
            instance: tokio::sync::OnceCell::new(),
            imds: Some(imds),
        })
    }

    /// For `member` in its own cloud (from `compute.azEnvironment`).
    pub fn new(
        member: &ScaleSetMember,
        credential: Arc<dyn TokenCredential>,
    ) -> Result<Self, ArmSetupError> {
        let endpoint = arm_endpoint(&member.environment)?;
        Self::at(endpoint, member, credential)
    }

    /// For `member` at the ARM endpoint `endpoint` (https; plain http only
    /// to a loopback host, such as a local stand-in of ARM). The token is
    /// asked for `{endpoint}/.default`.
    pub fn at(
        endpoint: &str,
        member: &ScaleSetMember,
        credential: Arc<dyn TokenCredential>,
    ) -> Result<Self, ArmSetupError> {
        Ok(Self {
            http: http_client()?,
            credential,
            instance: tokio::sync::OnceCell::new_with(Some(instance(endpoint, member)?)),
            imds: None,
        })
    }

    /// The instance's URL (no secret in it), once known.
    pub fn instance_url(&self) -> Option<&str> {
        self.instance.get().map(|instance| instance.url.as_str())
    }

    /// Where this VM is: given, or read from instance metadata once.
    async fn instance(&self) -> Result<&Instance, String> {
        self.instance
            .get_or_try_init(|| async {
                let imds = self
                    .imds
                    .as_ref()
                    .ok_or_else(|| "no instance given and no instance metadata".to_owned())?;
                let member = imds
                    .scale_set_member()
                    .await
                    .map_err(|e| {
                        format!("reading this VM's scale set from instance metadata: {e}")
                    })?
                    .ok_or_else(|| {
                        "this VM is in no scale set (instance metadata's vmScaleSetName is empty): \
                         scale-in protection applies only to scale sets; turn \
                         SPOT_WORKER_SCALE_IN_PROTECTION off"
                            .to_owned()
                    })?;
                let endpoint = arm_endpoint(&member.environment).map_err(|e| e.to_string())?;
                let found = instance(endpoint, &member).map_err(|e| e.to_string())?;
                tracing::info!(instance = %found.url, "scale-in protection: this VM's instance");
                Ok(found)
            })
            .await
    }
}

/// The HTTP client for ARM: no redirects (a token must not follow one),
/// bounded.
fn http_client() -> Result<reqwest::Client, ArmSetupError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .build()
        .map_err(|e| ArmSetupError::Client(e.to_string()))
}

/// The instance's URL at `endpoint`, checked.
fn instance(endpoint: &str, member: &ScaleSetMember) -> Result<Instance, ArmSetupError> {
    let invalid = |reason| ArmSetupError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let base = Url::parse(endpoint).map_err(|_| invalid("is not a URL"))?;
    check_service_url(&base).map_err(invalid)?;
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| invalid("cannot have a path"))?
        .pop_if_empty()
        .extend([
            "subscriptions",
            &member.subscription_id,
            "resourceGroups",
            &member.resource_group,
            "providers",
            "Microsoft.Compute",
            "virtualMachineScaleSets",
            &member.scale_set,
            "virtualMachines",
            &member.instance_id,
        ]);
    url.query_pairs_mut()
        .append_pair("api-version", API_VERSION);
    Ok(Instance {
        url,
        scope: format!("{}/.default", base.origin().ascii_serialization()),
    })
}

/// `Retry-After` in seconds (ARM sends seconds), if present and sane.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

#[async_trait]
impl ScaleInProtection for ArmScaleInProtection {
    async fn set(&self, protected: bool) -> Result<(), ProtectionError> {
        let failed = |message: String, retry_after| ProtectionError {
            message: redact(&message),
            retry_after,
        };
        let instance = self.instance().await.map_err(|e| failed(e, None))?;
        let token = self
            .credential
            .get_token(&[&instance.scope], None)
            .await
            .map_err(|e| {
                failed(
                    format!(
                        "no token for Azure Resource Manager: {}",
                        crate::error::describe(&e)
                    ),
                    None,
                )
            })?;
        let body = serde_json::json!({
            "properties": {"protectionPolicy": {"protectFromScaleIn": protected}}
        });
        let response = self
            .http
            .put(instance.url.clone())
            .bearer_auth(token.token.secret())
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                // reqwest's error names the URL, which holds no secret.
                failed(format!("PUT {}: {e}", instance.url), None)
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let wait = matches!(status.as_u16(), 429 | 503)
            .then(|| retry_after(response.headers()))
            .flatten();
        let text = response.text().await.unwrap_or_default();
        Err(failed(
            format!(
                "PUT {} answered {status}: {}",
                instance.url,
                one_line(&text, EXCERPT_CHARS)
            ),
            wait,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_known_cloud_has_its_endpoint_and_an_unknown_one_is_refused() {
        assert_eq!(
            arm_endpoint("AzurePublicCloud").unwrap(),
            "https://management.azure.com"
        );
        assert_eq!(
            arm_endpoint("AzureUSGovernmentCloud").unwrap(),
            "https://management.usgovcloudapi.net"
        );
        assert_eq!(
            arm_endpoint("azurechinacloud").unwrap(),
            "https://management.chinacloudapi.cn"
        );
        let error = arm_endpoint("AzureStackCloud").unwrap_err();
        assert!(error.to_string().contains("AzureStackCloud"), "{error}");
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, " 17 ".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(17)));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
