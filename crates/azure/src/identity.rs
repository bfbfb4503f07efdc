//! The VM's user-assigned managed identity as a token credential: the SDK's
//! `ManagedIdentityCredential` (IMDS at 169.254.169.254) on an HTTP client
//! that never uses a proxy and never follows redirects, like the Scheduled
//! Events client, and errors that name the client id and where it comes
//! from (`AZURE_CLIENT_ID`), since a wrong one otherwise shows only as
//! "The requested identity has not been assigned to this resource".
//!
//! Why no proxy: `reqwest` honours `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`,
//! so with a proxy configured for the VM's outbound traffic the token
//! request would go to the proxy, which either cannot reach the link-local
//! address or is refused by IMDS (requests with `X-Forwarded-For` are), and
//! a proxy must never see the VM's tokens. Storage requests keep the SDK's
//! default client and so may go through a proxy.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::error::ErrorKind;
use azure_core::http::{ClientOptions, Transport};
use azure_identity::{ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId};
use time::OffsetDateTime;

use crate::config_error::{CLIENT_ID_ENV, StorageConfigError};
use crate::redact::redact;

/// IMDS is on the host: a connection that takes longer is not coming.
const IMDS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A token answer is small; the SDK retries a slow one.
const IMDS_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A managed identity's tokens from IMDS, with errors that say which
/// identity was asked for.
pub(crate) struct ManagedIdentityTokens {
    inner: Arc<ManagedIdentityCredential>,
    client_id: Option<String>,
    seen: TokenSightings,
}

impl fmt::Debug for ManagedIdentityTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedIdentityTokens")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl ManagedIdentityTokens {
    /// The identity `client_id` (user-assigned), or the system-assigned one.
    pub(crate) fn new(client_id: Option<String>) -> Result<Arc<Self>, StorageConfigError> {
        let credential_error = |reason: String| StorageConfigError::Credential {
            kind: "managed identity",
            reason: redact(&reason),
        };
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: client_id.clone().map(UserAssignedId::ClientId),
            client_options: ClientOptions {
                transport: Some(imds_transport().map_err(credential_error)?),
                ..Default::default()
            },
        };
        let inner = ManagedIdentityCredential::new(Some(options))
            .map_err(|e| credential_error(e.to_string()))?;
        Ok(Arc::new(ManagedIdentityTokens {
            inner,
            client_id,
            seen: TokenSightings::default(),
        }))
    }

    /// Which identity, for messages.
    fn identity(&self) -> String {
        match &self.client_id {
            Some(id) => format!("the user-assigned managed identity {CLIENT_ID_ENV}={id}"),
            None => "the system-assigned managed identity".to_owned(),
        }
    }

    /// Logs a token (the first time it is seen: [`TokenSightings`]).
    fn note(&self, token: &AccessToken) {
        tracing::info!(
            client_id = self.client_id.as_deref().unwrap_or("system-assigned"),
            expires_on = token.expires_on.unix_timestamp(),
            "managed identity token acquired from IMDS"
        );
    }
}

/// The expiry of the last token a credential handed out, so each new token
/// is logged once: the SDK caches tokens and hands the same one out until
/// shortly before it expires.
#[derive(Debug, Default)]
pub(crate) struct TokenSightings(Mutex<Option<OffsetDateTime>>);

impl TokenSightings {
    /// True the first time a token with this expiry is seen.
    pub(crate) fn is_new(&self, token: &AccessToken) -> bool {
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let new = *last != Some(token.expires_on);
        *last = Some(token.expires_on);
        new
    }

    /// `token` as a credential answers: a new one noted by `note`, a
    /// failure wrapped as a credential error whose message `explain` writes
    /// (which identity was asked for, and what to check).
    pub(crate) fn noted(
        &self,
        token: azure_core::Result<AccessToken>,
        explain: impl FnOnce(&azure_core::Error) -> String,
        note: impl FnOnce(&AccessToken),
    ) -> azure_core::Result<AccessToken> {
        match token {
            Ok(token) => {
                if self.is_new(&token) {
                    note(&token);
                }
                Ok(token)
            }
            Err(error) => {
                let message = explain(&error);
                Err(azure_core::Error::with_error(
                    ErrorKind::Credential,
                    error,
                    message,
                ))
            }
        }
    }
}

/// An HTTP client for IMDS: no proxy, no redirects, short timeouts.
fn imds_transport() -> Result<Transport, String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(IMDS_CONNECT_TIMEOUT)
        .read_timeout(IMDS_READ_TIMEOUT)
        .build()
        .map_err(|e| format!("building the IMDS HTTP client: {e}"))?;
    Ok(Transport::new(Arc::new(client)))
}

/// The HTTP status of the IMDS answer, wherever it sits in the chain (the
/// SDK wraps the HTTP error in a credential error).
fn status_in_chain(error: &azure_core::Error) -> Option<u16> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = current {
        if let Some(status) = cause
            .downcast_ref::<azure_core::Error>()
            .and_then(azure_core::Error::http_status)
        {
            return Some(u16::from(status));
        }
        current = cause.source();
    }
    None
}

#[async_trait]
impl TokenCredential for ManagedIdentityTokens {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let explain = |error: &azure_core::Error| {
            let hint = match status_in_chain(error) {
                // IMDS answers 400 "Identity not found" for a client id
                // that is not assigned to this VM.
                Some(400) => format!(
                    "; IMDS refused the client id: check that {CLIENT_ID_ENV} names an \
                     identity assigned to this VM or scale set"
                ),
                _ => String::new(),
            };
            format!(
                "no token for {} from IMDS (169.254.169.254){hint}: {}",
                self.identity(),
                crate::error::describe(error)
            )
        };
        let token = self.inner.get_token(scopes, options).await;
        self.seen.noted(token, explain, |token| self.note(token))
    }
}
