//! Workload identity, as the AKS webhook sets it up in a pod: a projected
//! service-account token in a file (`AZURE_FEDERATED_TOKEN_FILE`) is
//! exchanged at Microsoft Entra ID (`AZURE_AUTHORITY_HOST`) for a storage
//! token of the identity `AZURE_CLIENT_ID` in `AZURE_TENANT_ID`, which trusts
//! that service account through a federated credential.
//!
//! The exchange is the SDK's `ClientAssertionCredential` (which caches the
//! storage token until shortly before it expires). The assertion is read
//! here rather than by the SDK's `WorkloadIdentityCredential`, which re-reads
//! the file only every ten minutes: the kubelet rotates the projected token
//! in place, so the file is read again whenever its modification time
//! changes (a `stat` per token request, which happens about once an hour),
//! and a file that is missing or empty is an error naming the file and the
//! variable, not a bare I/O error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::error::ErrorKind;
use azure_core::http::{ClientMethodOptions, ClientOptions};
use azure_identity::{
    ClientAssertion, ClientAssertionCredential, ClientAssertionCredentialOptions,
};

use crate::config_error::StorageConfigError;
use crate::identity::TokenSightings;
use crate::redact::redact;

/// The variables that name a workload identity (what the AKS webhook
/// injects), for messages.
pub(crate) const TOKEN_FILE_ENV: &str = spot_worker_settings::table::FEDERATED_TOKEN_FILE.key;
const TENANT_ID_ENV: &str = spot_worker_settings::table::TENANT_ID.key;
const AUTHORITY_HOST_ENV: &str = spot_worker_settings::table::AUTHORITY_HOST.key;

/// A workload identity: which identity, in which tenant, proven by which
/// token file, exchanged where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadIdentity {
    /// The identity's client id (`AZURE_CLIENT_ID`).
    pub client_id: String,
    /// Its tenant (`AZURE_TENANT_ID`).
    pub tenant_id: String,
    /// The projected service-account token (`AZURE_FEDERATED_TOKEN_FILE`).
    pub token_file: PathBuf,
    /// Microsoft Entra ID's endpoint (`AZURE_AUTHORITY_HOST`); `None`: the
    /// public cloud's.
    pub authority_host: Option<String>,
}

/// The projected token, read again whenever the kubelet replaces it.
#[derive(Debug)]
struct ProjectedToken {
    path: PathBuf,
    /// The file's modification time when last read, and what it held.
    last: Mutex<Option<(SystemTime, String)>>,
}

impl ProjectedToken {
    fn new(path: PathBuf) -> Self {
        ProjectedToken {
            path,
            last: Mutex::new(None),
        }
    }

    /// The token the file holds now.
    fn read(&self) -> Result<String, String> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(|e| self.unreadable(&e))?;
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((seen, token)) = last.as_ref()
            && *seen == modified
        {
            return Ok(token.clone());
        }
        let token = std::fs::read_to_string(&self.path).map_err(|e| self.unreadable(&e))?;
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(format!(
                "the workload identity token file {} ({TOKEN_FILE_ENV}) is empty",
                self.path.display()
            ));
        }
        *last = Some((modified, token.clone()));
        Ok(token)
    }

    fn unreadable(&self, error: &std::io::Error) -> String {
        format!(
            "the workload identity token file {} ({TOKEN_FILE_ENV}) cannot be read: {error}; \
             is the pod labelled azure.workload.identity/use and its service account annotated?",
            self.path.display()
        )
    }
}

#[async_trait]
impl ClientAssertion for ProjectedToken {
    async fn secret(&self, _: Option<ClientMethodOptions<'_>>) -> azure_core::Result<String> {
        self.read()
            .map_err(|message| azure_core::Error::with_message(ErrorKind::Credential, message))
    }
}

/// Storage tokens for a workload identity, with errors that say which
/// identity, tenant and token file were used.
pub(crate) struct WorkloadIdentityTokens {
    inner: Arc<ClientAssertionCredential<ProjectedToken>>,
    identity: WorkloadIdentity,
    seen: TokenSightings,
}

impl fmt::Debug for WorkloadIdentityTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadIdentityTokens")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl WorkloadIdentityTokens {
    /// Checks what can be checked before the first token (the token file is
    /// readable, the authority is HTTPS) so a pod set up wrongly fails at
    /// start with the reason.
    pub(crate) fn new(identity: WorkloadIdentity) -> Result<Arc<Self>, StorageConfigError> {
        let credential_error = |reason: String| StorageConfigError::Credential {
            kind: "workload identity",
            reason: redact(&reason),
        };
        let assertion = ProjectedToken::new(identity.token_file.clone());
        assertion.read().map_err(credential_error)?;
        let mut client_options = ClientOptions::default();
        if let Some(host) = &identity.authority_host {
            check_authority_host(host).map_err(credential_error)?;
            let mut custom = CustomConfiguration::default();
            custom.authority_host = host.clone();
            client_options.cloud = Some(Arc::new(CloudConfiguration::from(custom)));
        }
        let inner = ClientAssertionCredential::new(
            identity.tenant_id.clone(),
            identity.client_id.clone(),
            assertion,
            Some(ClientAssertionCredentialOptions { client_options }),
        )
        .map_err(|e| credential_error(e.to_string()))?;
        Ok(Arc::new(WorkloadIdentityTokens {
            inner,
            identity,
            seen: TokenSightings::default(),
        }))
    }

    /// Logs a token (the first time it is seen: [`TokenSightings`]).
    fn note(&self, token: &AccessToken) {
        tracing::info!(
            client_id = %self.identity.client_id,
            tenant_id = %self.identity.tenant_id,
            expires_on = token.expires_on.unix_timestamp(),
            "workload identity token acquired"
        );
    }
}

/// The authority must be an `https://` URL: the SDK refuses anything else
/// at the first token, this says so at start.
fn check_authority_host(host: &str) -> Result<(), String> {
    match azure_core::http::Url::parse(host) {
        Ok(url) if url.scheme() == "https" && url.host().is_some() => Ok(()),
        Ok(_) => Err(format!(
            "{AUTHORITY_HOST_ENV} {host} is not an https:// URL"
        )),
        Err(e) => Err(format!("{AUTHORITY_HOST_ENV} {host} is not a URL: {e}")),
    }
}

#[async_trait]
impl TokenCredential for WorkloadIdentityTokens {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let explain = |error: &azure_core::Error| {
            format!(
                "no storage token for the workload identity {client}={} in {TENANT_ID_ENV}={} \
                 with the token in {}: check that the identity has a federated credential for \
                 this pod's service account, and that {client} is that identity's client id: {}",
                self.identity.client_id,
                self.identity.tenant_id,
                self.identity.token_file.display(),
                crate::error::describe(error),
                client = crate::config_error::CLIENT_ID_ENV,
            )
        };
        let token = self.inner.get_token(scopes, options).await;
        self.seen.noted(token, explain, |token| self.note(token))
    }
}

/// Whether `path` names a token file at all (blank values count as absent).
pub(crate) fn given(path: Option<&str>) -> Option<&Path> {
    path.map(str::trim).filter(|p| !p.is_empty()).map(Path::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_again_when_the_kubelet_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = ProjectedToken::new(path.clone());
        assert_eq!(token.read().unwrap(), "first");
        // The kubelet writes a new file and swaps it in (atomic rename);
        // set a distinct mtime so the test does not depend on clock
        // granularity.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&next)
            .unwrap()
            .set_modified(later)
            .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(token.read().unwrap(), "second");
    }

    #[test]
    fn a_missing_or_empty_token_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ProjectedToken::new(dir.path().join("absent"));
        let error = missing.read().unwrap_err();
        assert!(
            error.contains("absent") && error.contains(TOKEN_FILE_ENV),
            "{error}"
        );
        let path = dir.path().join("empty");
        std::fs::write(&path, " \n").unwrap();
        let error = ProjectedToken::new(path).read().unwrap_err();
        assert!(error.contains("is empty"), "{error}");
    }

    #[test]
    fn only_an_https_authority_is_accepted() {
        // (authority host, accepted)
        let table = [
            ("https://login.microsoftonline.com/", true),
            ("https://login.example.test:8443", true),
            ("http://login.microsoftonline.com/", false),
            ("login.microsoftonline.com", false),
            ("", false),
        ];
        for (host, accepted) in table {
            assert_eq!(check_authority_host(host).is_ok(), accepted, "{host:?}");
        }
    }

    #[test]
    fn a_pod_set_up_wrongly_fails_at_start_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let identity = WorkloadIdentity {
            client_id: "00000000-0000-0000-0000-000000000001".to_owned(),
            tenant_id: "00000000-0000-0000-0000-000000000002".to_owned(),
            token_file: dir.path().join("no-token"),
            authority_host: None,
        };
        let error = WorkloadIdentityTokens::new(identity.clone()).unwrap_err();
        assert!(error.to_string().contains("no-token"), "{error}");
        std::fs::write(dir.path().join("token"), "a.b.c").unwrap();
        let plain_http = WorkloadIdentity {
            token_file: dir.path().join("token"),
            authority_host: Some("http://127.0.0.1:1".to_owned()),
            ..identity.clone()
        };
        let error = WorkloadIdentityTokens::new(plain_http).unwrap_err();
        assert!(error.to_string().contains("https://"), "{error}");
        let fine = WorkloadIdentity {
            token_file: dir.path().join("token"),
            ..identity
        };
        assert!(WorkloadIdentityTokens::new(fine).is_ok());
    }
}
