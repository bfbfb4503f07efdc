//! Parses Azure Storage connection strings (`AZURE_STORAGE_CONNECTION_STRING`):
//! `UseDevelopmentStorage=true`, full strings with `AccountKey`, and ones
//! with a `SharedAccessSignature`. The key and SAS are kept as
//! [`Secret`]s and never shown by `Debug`.

use std::fmt;
use std::str::FromStr;

use azure_core::credentials::Secret;
use azure_core::http::Url;

/// The emulator's well-known account name.
pub const DEVELOPMENT_ACCOUNT_NAME: &str = "devstoreaccount1";
/// The emulator's well-known, publicly documented account key.
pub const DEVELOPMENT_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The environment variable local runs take the connection string from.
pub const CONNECTION_STRING_ENV: &str = "AZURE_STORAGE_CONNECTION_STRING";

/// A connection string that could not be used. Its text never contains the
/// key or SAS signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionStringError {
    /// A segment (counted from 1) is not `key=value`. Its text is not shown:
    /// it could be a fragment of a secret.
    #[error("connection string segment {0} is not of the form key=value")]
    Malformed(usize),
    /// `AccountName` is missing and no endpoint names the account.
    #[error("connection string has no AccountName")]
    MissingAccountName,
    /// Neither `AccountKey` nor `SharedAccessSignature` is given.
    #[error("connection string has neither AccountKey nor SharedAccessSignature")]
    MissingCredentials,
    /// An endpoint is not a valid URL.
    #[error("connection string {field} is not a valid URL: {reason}")]
    InvalidEndpoint {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The environment variable is not valid Unicode.
    #[error("{CONNECTION_STRING_ENV} is not valid Unicode")]
    NotUnicode,
}

/// How a connection string authenticates.
#[derive(Clone)]
pub enum SharedKeyOrSas {
    /// An account key, from which short-lived account SAS tokens are signed.
    AccountKey(Secret),
    /// A ready-made SAS token (query string without the leading `?`).
    Sas(Secret),
}

impl fmt::Debug for SharedKeyOrSas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedKeyOrSas::AccountKey(_) => f.write_str("AccountKey(REDACTED)"),
            SharedKeyOrSas::Sas(_) => f.write_str("Sas(REDACTED)"),
        }
    }
}

/// A parsed connection string.
#[derive(Clone, Debug)]
pub struct ConnectionString {
    /// The storage account name.
    pub account_name: String,
    /// The key or SAS (redacted in `Debug`).
    pub credentials: SharedKeyOrSas,
    /// The blob service URL.
    pub blob_endpoint: Url,
    /// The queue service URL.
    pub queue_endpoint: Url,
}

impl ConnectionString {
    /// The emulator's account on its default local ports
    /// (`UseDevelopmentStorage=true`).
    pub fn development() -> Result<Self, ConnectionStringError> {
        Fields {
            account_name: Some(DEVELOPMENT_ACCOUNT_NAME.to_owned()),
            account_key: Some(DEVELOPMENT_ACCOUNT_KEY.to_owned()),
            blob_endpoint: Some(format!("http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT_NAME}")),
            queue_endpoint: Some(format!("http://127.0.0.1:10001/{DEVELOPMENT_ACCOUNT_NAME}")),
            ..Fields::default()
        }
        .build()
    }

    /// Reads [`CONNECTION_STRING_ENV`]; `Ok(None)` if it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, ConnectionStringError> {
        match std::env::var(CONNECTION_STRING_ENV) {
            Ok(value) => Self::from_optional(Some(&value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConnectionStringError::NotUnicode),
        }
    }

    /// Parses a connection string that may be absent or blank.
    pub(crate) fn from_optional(
        value: Option<&str>,
    ) -> Result<Option<Self>, ConnectionStringError> {
        match value {
            Some(value) if !value.trim().is_empty() => value.parse().map(Some),
            _ => Ok(None),
        }
    }
}

impl FromStr for ConnectionString {
    type Err = ConnectionStringError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut fields = Fields::default();
        for (index, segment) in text.split(';').map(str::trim).enumerate() {
            if segment.is_empty() {
                continue;
            }
            // Values (keys, SAS) may contain '=', so split at the first one only.
            let (key, value) = segment
                .split_once('=')
                .ok_or(ConnectionStringError::Malformed(index + 1))?;
            let value = value.trim().to_owned();
            match key.trim().to_ascii_lowercase().as_str() {
                "usedevelopmentstorage" => fields.development = value.eq_ignore_ascii_case("true"),
                "defaultendpointsprotocol" => fields.protocol = Some(value),
                "accountname" => fields.account_name = Some(value),
                "accountkey" => fields.account_key = Some(value),
                "sharedaccesssignature" => fields.sas = Some(value),
                "endpointsuffix" => fields.endpoint_suffix = Some(value),
                "blobendpoint" => fields.blob_endpoint = Some(value),
                "queueendpoint" => fields.queue_endpoint = Some(value),
                // Table/file endpoints and unknown keys don't concern us.
                _ => {}
            }
        }
        fields.build()
    }
}

#[derive(Default)]
struct Fields {
    development: bool,
    protocol: Option<String>,
    account_name: Option<String>,
    account_key: Option<String>,
    sas: Option<String>,
    endpoint_suffix: Option<String>,
    blob_endpoint: Option<String>,
    queue_endpoint: Option<String>,
}

impl Fields {
    fn build(self) -> Result<ConnectionString, ConnectionStringError> {
        if self.development {
            return ConnectionString::development();
        }
        let account_name = self
            .account_name
            .ok_or(ConnectionStringError::MissingAccountName)?;
        let credentials = match (self.account_key, self.sas) {
            (Some(key), _) => SharedKeyOrSas::AccountKey(Secret::new(key)),
            (None, Some(sas)) => {
                SharedKeyOrSas::Sas(Secret::new(sas.trim_start_matches('?').to_owned()))
            }
            (None, None) => return Err(ConnectionStringError::MissingCredentials),
        };
        let protocol = self.protocol.unwrap_or_else(|| "https".to_owned());
        let suffix = self
            .endpoint_suffix
            .unwrap_or_else(|| "core.windows.net".to_owned());
        let endpoint = |field: &'static str, explicit: Option<String>, service: &str| {
            let text = explicit
                .unwrap_or_else(|| format!("{protocol}://{account_name}.{service}.{suffix}"));
            Url::parse(text.trim_end_matches('/')).map_err(|e| {
                ConnectionStringError::InvalidEndpoint {
                    field,
                    reason: e.to_string(),
                }
            })
        };
        Ok(ConnectionString {
            blob_endpoint: endpoint("BlobEndpoint", self.blob_endpoint, "blob")?,
            queue_endpoint: endpoint("QueueEndpoint", self.queue_endpoint, "queue")?,
            account_name,
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn development_storage_uses_the_emulator_defaults() {
        let parsed: ConnectionString = "UseDevelopmentStorage=true".parse().unwrap();
        assert_eq!(parsed.account_name, DEVELOPMENT_ACCOUNT_NAME);
        assert_eq!(
            parsed.queue_endpoint.as_str(),
            "http://127.0.0.1:10001/devstoreaccount1"
        );
        assert_eq!(
            parsed.blob_endpoint.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        assert!(
            matches!(parsed.credentials, SharedKeyOrSas::AccountKey(ref key) if key.secret() == DEVELOPMENT_ACCOUNT_KEY)
        );
    }

    #[test]
    fn full_strings_derive_endpoints_from_the_suffix() {
        let parsed: ConnectionString =
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5+/==;EndpointSuffix=core.chinacloudapi.cn"
                .parse()
                .unwrap();
        assert_eq!(parsed.account_name, "acct");
        assert_eq!(
            parsed.queue_endpoint.as_str(),
            "https://acct.queue.core.chinacloudapi.cn/"
        );
        assert_eq!(
            parsed.blob_endpoint.as_str(),
            "https://acct.blob.core.chinacloudapi.cn/"
        );
        assert!(
            matches!(parsed.credentials, SharedKeyOrSas::AccountKey(ref key) if key.secret() == "a2V5+/==")
        );
    }

    #[test]
    fn explicit_endpoints_and_sas_are_honoured() {
        let parsed: ConnectionString =
            "AccountName=a;SharedAccessSignature=?sv=1&sig=abc;QueueEndpoint=http://127.0.0.1:1234/a/;BlobEndpoint=http://127.0.0.1:1233/a"
                .parse()
                .unwrap();
        assert_eq!(parsed.queue_endpoint.as_str(), "http://127.0.0.1:1234/a");
        assert!(
            matches!(parsed.credentials, SharedKeyOrSas::Sas(ref sas) if sas.secret() == "sv=1&sig=abc")
        );
    }

    #[test]
    fn missing_parts_are_errors() {
        assert_eq!(
            "AccountKey=abc".parse::<ConnectionString>().unwrap_err(),
            ConnectionStringError::MissingAccountName
        );
        assert_eq!(
            "AccountName=a".parse::<ConnectionString>().unwrap_err(),
            ConnectionStringError::MissingCredentials
        );
        assert!(matches!(
            "AccountName=a;AccountKey=k;QueueEndpoint=not a url".parse::<ConnectionString>(),
            Err(ConnectionStringError::InvalidEndpoint {
                field: "QueueEndpoint",
                ..
            })
        ));
    }

    #[test]
    fn debug_and_errors_never_show_the_key_or_signature() {
        let parsed: ConnectionString = "AccountName=a;AccountKey=c3VwZXJzZWNyZXQ=".parse().unwrap();
        let debug = format!("{parsed:?}");
        assert!(!debug.contains("c3VwZXJzZWNyZXQ"), "{debug}");
        let err = "AccountName=a;AccountKey=c3VwZXJz;ZWNyZXQzzz"
            .parse::<ConnectionString>()
            .unwrap_err();
        assert_eq!(err, ConnectionStringError::Malformed(3));
        let text = format!("{err} {err:?}");
        assert!(
            !text.contains("zzz") && !text.contains("c3VwZXJzZWNyZXQ"),
            "{text}"
        );
    }
}
