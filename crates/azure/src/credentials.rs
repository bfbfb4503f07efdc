//! How to authenticate to the storage account, and which way is chosen from
//! the settings: a connection string (local runs, Azurite), a workload
//! identity (AKS pods: `AZURE_FEDERATED_TOKEN_FILE` set by the webhook), a
//! managed identity (Azure VMs: the client id from `AZURE_CLIENT_ID`), or the
//! Azure CLI's login (laptops).

use std::fmt;
use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_identity::AzureCliCredential;

use crate::config_error::{CLIENT_ID_ENV, StorageConfigError};
use crate::connection_string::ConnectionString;
use crate::endpoints::AccountEndpoints;
use crate::identity::ManagedIdentityTokens;
use crate::redact::redact;
use crate::workload_identity::{self, TOKEN_FILE_ENV, WorkloadIdentity, WorkloadIdentityTokens};

/// The settings that choose a credential ([`Credentials::choose`]), each as
/// given (blank counts as absent).
#[derive(Clone, Copy, Debug, Default)]
pub struct CredentialSettings<'a> {
    /// `AZURE_STORAGE_CONNECTION_STRING`.
    pub connection_string: Option<&'a str>,
    /// `AZURE_CLIENT_ID`.
    pub client_id: Option<&'a str>,
    /// `AZURE_FEDERATED_TOKEN_FILE`.
    pub federated_token_file: Option<&'a str>,
    /// `AZURE_TENANT_ID`.
    pub tenant_id: Option<&'a str>,
    /// `AZURE_AUTHORITY_HOST`.
    pub authority_host: Option<&'a str>,
}

/// A setting's value, or `None` when absent or blank.
fn present(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// How to authenticate.
#[derive(Clone)]
pub enum Credentials {
    /// A connection string: its account key signs short-lived SAS tokens, or
    /// its SAS is used as is.
    ConnectionString(ConnectionString),
    /// An Entra ID token credential (workload identity, managed identity,
    /// Azure CLI, or any other `TokenCredential`).
    Token {
        /// The account's service URLs.
        endpoints: AccountEndpoints,
        /// The credential.
        credential: Arc<dyn TokenCredential>,
        /// What it is, for logs (`workload identity`, `managed identity`,
        /// `Azure CLI`, ...).
        kind: &'static str,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::ConnectionString(cs) => {
                f.debug_tuple("ConnectionString").field(cs).finish()
            }
            Credentials::Token {
                endpoints, kind, ..
            } => f
                .debug_struct("Token")
                .field("kind", kind)
                .field("endpoints", endpoints)
                .finish_non_exhaustive(),
        }
    }
}

impl Credentials {
    /// A managed identity; a user-assigned one when `client_id` is given.
    /// Its token requests go straight to IMDS, never through a proxy.
    pub fn managed_identity(
        endpoints: AccountEndpoints,
        client_id: Option<String>,
    ) -> Result<Self, StorageConfigError> {
        Ok(Credentials::Token {
            endpoints,
            credential: ManagedIdentityTokens::new(client_id)?,
            kind: "managed identity",
        })
    }

    /// The token credential, if these credentials are one (not a
    /// connection string): the same identity may then call Azure Resource
    /// Manager (scale-in protection).
    pub fn token_credential(&self) -> Option<Arc<dyn TokenCredential>> {
        match self {
            Credentials::Token { credential, .. } => Some(Arc::clone(credential)),
            Credentials::ConnectionString(_) => None,
        }
    }

    /// The VM's managed identity as a token credential (user-assigned when
    /// `client_id` is given), for calls other than storage when storage is
    /// reached with a connection string.
    pub fn managed_identity_credential(
        client_id: Option<String>,
    ) -> Result<Arc<dyn TokenCredential>, StorageConfigError> {
        Ok(ManagedIdentityTokens::new(client_id)?)
    }

    /// The developer's `az login` session.
    pub fn azure_cli(endpoints: AccountEndpoints) -> Result<Self, StorageConfigError> {
        let credential =
            AzureCliCredential::new(None).map_err(|e| StorageConfigError::Credential {
                kind: "Azure CLI",
                reason: redact(&e.to_string()),
            })?;
        Ok(Credentials::Token {
            endpoints,
            credential,
            kind: "Azure CLI",
        })
    }

    /// A workload identity (an AKS pod's projected service-account token
    /// exchanged for the identity's tokens). Fails at once, with the reason,
    /// when the token file cannot be read.
    pub fn workload_identity(
        endpoints: AccountEndpoints,
        identity: WorkloadIdentity,
    ) -> Result<Self, StorageConfigError> {
        Ok(Credentials::Token {
            endpoints,
            credential: WorkloadIdentityTokens::new(identity)?,
            kind: "workload identity",
        })
    }

    /// Chooses the credential, first match wins:
    ///
    /// 1. the connection string (`AZURE_STORAGE_CONNECTION_STRING`);
    /// 2. a workload identity if a token file (`AZURE_FEDERATED_TOKEN_FILE`)
    ///    is given, which then needs `AZURE_CLIENT_ID` and `AZURE_TENANT_ID`
    ///    (an AKS pod: the webhook sets all three, and the node's managed
    ///    identity must never be used in its place);
    /// 3. a managed identity if a client id (`AZURE_CLIENT_ID`, the VM's
    ///    user-assigned identity) is given;
    /// 4. the Azure CLI.
    ///
    /// `endpoints` is the account from configuration, used unless a
    /// connection string is given.
    pub fn choose(
        settings: CredentialSettings<'_>,
        endpoints: Option<AccountEndpoints>,
    ) -> Result<Self, StorageConfigError> {
        if let Some(parsed) = ConnectionString::from_optional(settings.connection_string)? {
            return Ok(Credentials::ConnectionString(parsed));
        }
        let endpoints = endpoints.ok_or(StorageConfigError::NotConfigured)?;
        let client_id = present(settings.client_id);
        if let Some(token_file) = workload_identity::given(settings.federated_token_file) {
            let missing = |name: &str| StorageConfigError::Credential {
                kind: "workload identity",
                reason: format!(
                    "{TOKEN_FILE_ENV} is set but {name} is not (the workload identity webhook sets both)"
                ),
            };
            let identity = WorkloadIdentity {
                client_id: client_id.ok_or_else(|| missing(CLIENT_ID_ENV))?.to_owned(),
                tenant_id: present(settings.tenant_id)
                    .ok_or_else(|| missing("AZURE_TENANT_ID"))?
                    .to_owned(),
                token_file: token_file.to_path_buf(),
                authority_host: present(settings.authority_host).map(str::to_owned),
            };
            return Self::workload_identity(endpoints, identity);
        }
        match client_id {
            Some(client_id) => Self::managed_identity(endpoints, Some(client_id.to_owned())),
            None => Self::azure_cli(endpoints),
        }
    }

    /// Which kind of credential this is, for logs: `connection string`,
    /// `workload identity`, `managed identity` or `Azure CLI`.
    pub fn kind(&self) -> &'static str {
        match self {
            Credentials::ConnectionString(_) => "connection string",
            Credentials::Token { kind, .. } => kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "00000000-0000-0000-0000-000000000001";
    const TENANT: &str = "00000000-0000-0000-0000-000000000002";

    fn account() -> Option<AccountEndpoints> {
        Some(AccountEndpoints::for_account("acct").unwrap())
    }

    #[test]
    fn a_connection_string_wins() {
        let chosen = Credentials::choose(
            CredentialSettings {
                connection_string: Some("UseDevelopmentStorage=true"),
                client_id: Some(CLIENT),
                federated_token_file: Some("/var/run/secrets/azure/tokens/azure-identity-token"),
                tenant_id: Some(TENANT),
                authority_host: None,
            },
            account(),
        );
        assert_eq!(chosen.unwrap().kind(), "connection string");
    }

    #[test]
    fn a_client_id_selects_the_user_assigned_managed_identity() {
        let credentials = Credentials::choose(
            CredentialSettings {
                client_id: Some(CLIENT),
                federated_token_file: Some(" "),
                ..CredentialSettings::default()
            },
            account(),
        )
        .unwrap();
        assert_eq!(credentials.kind(), "managed identity");
        let Credentials::Token { endpoints, .. } = credentials else {
            panic!("a token credential");
        };
        assert_eq!(
            endpoints.queue.as_str(),
            "https://acct.queue.core.windows.net/"
        );
    }

    #[test]
    fn otherwise_the_azure_cli_and_an_account_is_required() {
        let blank = Some("  ");
        let settings = CredentialSettings {
            connection_string: blank,
            client_id: blank,
            federated_token_file: blank,
            tenant_id: blank,
            authority_host: blank,
        };
        assert_eq!(
            Credentials::choose(settings, account()).unwrap().kind(),
            "Azure CLI"
        );
        // Nothing configured: one sentence naming both ways, said once.
        let text = Credentials::choose(settings, None).unwrap_err().to_string();
        assert_eq!(
            text,
            "no storage configured: set AZURE_STORAGE_CONNECTION_STRING \
             (`UseDevelopmentStorage=true` for a local Azurite, which `spot-worker dev` starts) \
             or SPOT_WORKER_STORAGE_ACCOUNT_URL (the account, reached with the user-assigned \
             managed identity AZURE_CLIENT_ID names, else with the Azure CLI's login)"
        );
    }

    #[test]
    fn a_token_file_selects_workload_identity_never_the_nodes_managed_identity() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("azure-identity-token");
        std::fs::write(&token, "header.payload.signature").unwrap();
        let token = token.to_str().unwrap();
        let settings = CredentialSettings {
            client_id: Some(CLIENT),
            federated_token_file: Some(token),
            tenant_id: Some(TENANT),
            authority_host: Some("https://login.microsoftonline.com/"),
            ..CredentialSettings::default()
        };
        assert_eq!(
            Credentials::choose(settings, account()).unwrap().kind(),
            "workload identity"
        );
        // What the webhook always sets together: one missing is an error
        // naming it, never a fall-back to another credential.
        for (settings, named) in [
            (
                CredentialSettings {
                    client_id: None,
                    ..settings
                },
                "AZURE_CLIENT_ID",
            ),
            (
                CredentialSettings {
                    tenant_id: Some(""),
                    ..settings
                },
                "AZURE_TENANT_ID",
            ),
        ] {
            let error = Credentials::choose(settings, account())
                .unwrap_err()
                .to_string();
            assert!(error.contains(named), "{error}");
        }
        let missing_file = CredentialSettings {
            federated_token_file: Some("/nonexistent/azure-identity-token"),
            ..settings
        };
        let error = Credentials::choose(missing_file, account())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/nonexistent/azure-identity-token"),
            "{error}"
        );
    }
}
