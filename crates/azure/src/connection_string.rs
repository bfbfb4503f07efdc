//! Parses Azure Storage connection strings (`AZURE_STORAGE_CONNECTION_STRING`):
//! `UseDevelopmentStorage=true`, full strings with `AccountKey`, and ones
//! with a `SharedAccessSignature` — including the portal's SAS connection
//! strings, which name explicit endpoints and no `AccountName`. The key and
//! SAS are kept as [`Secret`]s and never shown by `Debug`; endpoints must not
//! carry a query string (a SAS there would be appended to and logged with
//! every URL).

use std::fmt;
use std::str::FromStr;

use azure_core::credentials::Secret;
use azure_core::http::Url;

use crate::redact::redact;
use crate::service_url::check_service_url;

/// The emulator's well-known account name.
pub const DEVELOPMENT_ACCOUNT_NAME: &str = "devstoreaccount1";
/// The emulator's well-known, publicly documented account key.
pub const DEVELOPMENT_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The environment variable local runs take the connection string from.
pub const CONNECTION_STRING_ENV: &str = spot_worker_settings::table::CONNECTION_STRING.key;

/// A connection string that could not be used. Its text never contains the
/// key or SAS signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionStringError {
    /// A segment (counted from 1) is not `key=value`. Its text is not shown:
    /// it could be a fragment of a secret.
    #[error("connection string segment {0} is not of the form key=value")]
    Malformed(usize),
    /// `AccountName` is missing but needed: to sign with an `AccountKey`, or
    /// to derive an endpoint that is not given explicitly.
    #[error(
        "connection string has no AccountName, which an AccountKey, or a missing BlobEndpoint or QueueEndpoint, needs"
    )]
    MissingAccountName,
    /// Neither `AccountKey` nor `SharedAccessSignature` is given.
    #[error("connection string has neither AccountKey nor SharedAccessSignature")]
    MissingCredentials,
    /// An endpoint is not a valid URL, or not a plain service URL (it has a
    /// query string, credentials or a fragment). Its text is not shown.
    #[error("connection string {field} is not a valid service URL: {reason}")]
    InvalidEndpoint {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: String,
    },
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
#[derive(Clone)]
pub struct ConnectionString {
    /// The storage account name; `None` for a SAS connection string with
    /// explicit endpoints (the portal's), which does not need it.
    pub account_name: Option<String>,
    /// The key or SAS (redacted in `Debug`).
    pub credentials: SharedKeyOrSas,
    /// The blob service URL.
    pub blob_endpoint: Url,
    /// The queue service URL.
    pub queue_endpoint: Url,
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Endpoints are redacted too: the fields are public, so a hand-built
        // value may carry a SAS in an endpoint's query string.
        f.debug_struct("ConnectionString")
            .field("account_name", &self.account_name)
            .field("credentials", &self.credentials)
            .field("blob_endpoint", &redact(self.blob_endpoint.as_str()))
            .field("queue_endpoint", &redact(self.queue_endpoint.as_str()))
            .finish()
    }
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
        let account_name = self.account_name.filter(|name| !name.is_empty());
        let credentials = match (self.account_key, self.sas) {
            // The key signs SAS tokens for this account name.
            (Some(_), _) if account_name.is_none() => {
                return Err(ConnectionStringError::MissingAccountName);
            }
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
            let text = match (explicit, &account_name) {
                (Some(explicit), _) => explicit,
                (None, Some(name)) => format!("{protocol}://{name}.{service}.{suffix}"),
                (None, None) => return Err(ConnectionStringError::MissingAccountName),
            };
            let url = Url::parse(text.trim_end_matches('/')).map_err(|e| {
                ConnectionStringError::InvalidEndpoint {
                    field,
                    reason: e.to_string(),
                }
            })?;
            check_service_url(&url).map_err(|reason| ConnectionStringError::InvalidEndpoint {
                field,
                reason: reason.to_owned(),
            })?;
            Ok(url)
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
        assert_eq!(
            parsed.account_name.as_deref(),
            Some(DEVELOPMENT_ACCOUNT_NAME)
        );
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
        assert_eq!(parsed.account_name.as_deref(), Some("acct"));
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
    fn portal_sas_connection_strings_need_no_account_name() {
        // As the portal's "Shared access signature" blade prints it.
        let parsed: ConnectionString = "BlobEndpoint=https://acct.blob.core.windows.net/;QueueEndpoint=https://acct.queue.core.windows.net/;FileEndpoint=https://acct.file.core.windows.net/;TableEndpoint=https://acct.table.core.windows.net/;SharedAccessSignature=sv=2022-11-02&ss=bq&srt=sco&sp=rwdlacup&se=2030-01-01T00:00:00Z&spr=https&sig=c2VjcmV0JTJC"
            .parse()
            .unwrap();
        assert_eq!(parsed.account_name, None);
        assert_eq!(
            parsed.queue_endpoint.as_str(),
            "https://acct.queue.core.windows.net/"
        );
        assert_eq!(
            parsed.blob_endpoint.as_str(),
            "https://acct.blob.core.windows.net/"
        );
        assert!(
            matches!(parsed.credentials, SharedKeyOrSas::Sas(ref sas) if sas.secret().ends_with("&sig=c2VjcmV0JTJC"))
        );
        let debug = format!("{parsed:?}");
        assert!(!debug.contains("c2VjcmV0"), "{debug}");
        // Usable to build clients.
        let storage = crate::AzureStorage::new(crate::StorageConfig::new(
            crate::Credentials::ConnectionString(parsed),
        ))
        .unwrap();
        assert!(storage.queue("jobs").is_ok());
        // Without AccountName an endpoint cannot be derived.
        assert_eq!(
            "QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig=x"
                .parse::<ConnectionString>()
                .unwrap_err(),
            ConnectionStringError::MissingAccountName
        );
    }

    #[test]
    fn endpoints_with_a_query_string_are_refused_without_showing_it() {
        for text in [
            "AccountName=a;AccountKey=a2V5;QueueEndpoint=https://a.queue.core.windows.net/?sv=1&sig=c2VjcmV0",
            "SharedAccessSignature=sv=1&sig=x;BlobEndpoint=https://a.blob.core.windows.net?sig=c2VjcmV0;QueueEndpoint=https://a.queue.core.windows.net",
            "AccountName=a;AccountKey=a2V5;BlobEndpoint=https://u:c2VjcmV0@a.blob.core.windows.net",
        ] {
            let err = text.parse::<ConnectionString>().unwrap_err();
            assert!(
                matches!(err, ConnectionStringError::InvalidEndpoint { .. }),
                "{err:?}"
            );
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("c2VjcmV0"), "{shown}");
        }
    }

    #[test]
    fn debug_redacts_endpoints_of_hand_built_values() {
        let mut parsed: ConnectionString = "AccountName=a;AccountKey=a2V5".parse().unwrap();
        parsed.queue_endpoint =
            Url::parse("https://a.queue.core.windows.net/?sv=1&sig=c2VjcmV0").unwrap();
        let config = crate::StorageConfig::new(crate::Credentials::ConnectionString(parsed));
        let debug = format!("{config:?}");
        assert!(!debug.contains("c2VjcmV0"), "{debug}");
        assert!(debug.contains("sig=REDACTED"), "{debug}");
        // And the hand-built endpoint is refused when a client is built.
        let storage = crate::AzureStorage::new(config).unwrap();
        let err = storage.queue("jobs").unwrap_err().to_string();
        assert!(err.contains("query") && !err.contains("c2VjcmV0"), "{err}");
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
