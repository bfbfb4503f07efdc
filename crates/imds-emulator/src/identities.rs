//! The managed identities of the emulated VM ([`IdentityConfig`]), the
//! federated credentials Entra ID's endpoint trusts for them
//! ([`FederatedCredential`]), and what a checked token request asks for:
//! the data both token endpoints ([`identity`](crate::identity),
//! [`entra`](crate::entra)) and the tokens ([`token`](crate::token)) share.

use std::time::Duration;

/// The audience Entra ID expects in a federated token.
pub const TOKEN_EXCHANGE_AUDIENCE: &str = "api://AzureADTokenExchange";

/// Azure's managed-identity tokens live about a day.
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The managed identities of the emulated VM and the tokens it is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityConfig {
    /// Client ids of the user-assigned identities assigned to the VM. Only
    /// these are answered; a VM without any answers every token request
    /// with "Identity not found".
    pub client_ids: Vec<String>,
    /// The Entra ID tenant (`tid`, and the issuer's path).
    pub tenant_id: String,
    /// How long issued tokens are valid (`exp - iat`).
    pub token_lifetime: Duration,
    /// Overrides the issuer (`iss`), default `https://sts.windows.net/<tenant>/`,
    /// to test a service that refuses the token.
    pub issuer: Option<String>,
    /// Overrides the audience (`aud`), default the resource asked for.
    pub audience: Option<String>,
    /// Federated credentials: which service-account tokens Entra ID's
    /// endpoint ([`crate::entra`]) exchanges for which identity's tokens.
    pub federated: Vec<FederatedCredential>,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            client_ids: Vec::new(),
            tenant_id: "72f988bf-86f1-41af-91ab-2d7cd011db47".to_owned(),
            token_lifetime: DEFAULT_TOKEN_LIFETIME,
            issuer: None,
            audience: None,
            federated: Vec::new(),
        }
    }
}

impl IdentityConfig {
    /// A VM with the one user-assigned identity `client_id`.
    pub fn user_assigned(client_id: impl Into<String>) -> Self {
        IdentityConfig {
            client_ids: vec![client_id.into()],
            ..Self::default()
        }
    }

    /// The issuer of the tokens.
    pub fn issuer(&self) -> String {
        self.issuer
            .clone()
            .unwrap_or_else(|| format!("https://sts.windows.net/{}/", self.tenant_id))
    }
}

/// A federated identity credential of a user-assigned identity: tokens from
/// `issuer` about `subject` for `audience` may be exchanged for the tokens
/// of `client_id` (what `bicep/modules/workload-identity.bicep` creates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FederatedCredential {
    /// The identity's client id.
    pub client_id: String,
    /// The cluster's OIDC issuer URL (the projected token's `iss`).
    pub issuer: String,
    /// `system:serviceaccount:<namespace>:<name>` (its `sub`).
    pub subject: String,
    /// Its `aud`, normally [`TOKEN_EXCHANGE_AUDIENCE`].
    pub audience: String,
}

impl FederatedCredential {
    /// Trust of `client_id` for the service account `namespace/name` of the
    /// cluster whose OIDC issuer is `issuer`.
    pub fn for_service_account(
        client_id: impl Into<String>,
        issuer: impl Into<String>,
        namespace: &str,
        name: &str,
    ) -> Self {
        FederatedCredential {
            client_id: client_id.into(),
            issuer: issuer.into(),
            subject: format!("system:serviceaccount:{namespace}:{name}"),
            audience: TOKEN_EXCHANGE_AUDIENCE.to_owned(),
        }
    }
}

/// What a token request asks for, once checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TokenRequest {
    pub client_id: String,
    pub resource: String,
}
