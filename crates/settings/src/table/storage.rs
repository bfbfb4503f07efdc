//! The settings of storage.

use crate::setting::Setting;

use super::Text;

/// Storage by connection string.
pub const CONNECTION_STRING: Setting<Option<Text>> = Setting {
    key: "AZURE_STORAGE_CONNECTION_STRING",
    default: None,
    default_doc: None,
    doc: "storage by connection string (`UseDevelopmentStorage=true` for Azurite); a secret, never logged",
    secret: true,
};

/// The storage account reached with a managed identity.
pub const STORAGE_ACCOUNT_URL: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_STORAGE_ACCOUNT_URL",
    default: None,
    default_doc: None,
    doc: "otherwise the account (`https://<acct>.blob.core.windows.net` or its name), `https://` only (a local Azurite is reached with the connection string); reached with the user-assigned managed identity `AZURE_CLIENT_ID` names, else with the Azure CLI's login (`az login`): a VM's system-assigned identity alone is not used",
    secret: false,
};

/// The user-assigned managed identity.
pub const CLIENT_ID: Setting<Option<Text>> = Setting {
    key: "AZURE_CLIENT_ID",
    default: None,
    default_doc: None,
    doc: "the user-assigned managed identity's client id (on AKS: the workload identity's, set by its webhook); unset, storage by account URL uses the Azure CLI's login",
    secret: false,
};

/// The workload identity's projected service-account token.
pub const FEDERATED_TOKEN_FILE: Setting<Option<Text>> = Setting {
    key: "AZURE_FEDERATED_TOKEN_FILE",
    default: None,
    default_doc: None,
    doc: "a projected service-account token (set by the AKS workload identity webhook): storage with workload identity, as `AZURE_CLIENT_ID` in `AZURE_TENANT_ID`; re-read when it changes",
    secret: false,
};

/// The workload identity's tenant.
pub const TENANT_ID: Setting<Option<Text>> = Setting {
    key: "AZURE_TENANT_ID",
    default: None,
    default_doc: None,
    doc: "the tenant of the workload identity (set by the webhook)",
    secret: false,
};

/// Where workload identity exchanges its token.
pub const AUTHORITY_HOST: Setting<Option<Text>> = Setting {
    key: "AZURE_AUTHORITY_HOST",
    default: None,
    default_doc: Some("`https://login.microsoftonline.com/`"),
    doc: "the Microsoft Entra ID endpoint workload identity asks for tokens (set by the webhook); `https://` only",
    secret: false,
};
