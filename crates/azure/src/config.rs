//! Where the storage account is and how to reach it: its endpoints, the
//! credentials ([`crate::credentials`]), and the bounded retry policy every
//! client uses.

use std::fmt;
use std::time::Duration;

use azure_core::http::{ExponentialRetryOptions, RetryOptions, Url};

use crate::connection_string::ConnectionStringError;
pub use crate::credentials::Credentials;
use crate::redact::redact;
use crate::sas::AccountSasScope;

/// The environment variable naming a user-assigned managed identity's client id.
pub const CLIENT_ID_ENV: &str = spot_worker_settings::table::CLIENT_ID.key;

/// Storage configuration could not be built. Never contains secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageConfigError {
    /// The connection string is unusable.
    #[error(transparent)]
    ConnectionString(#[from] ConnectionStringError),
    /// An account URL is invalid.
    #[error("invalid storage account URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// Why.
        reason: String,
    },
    /// Neither a connection string nor an account is configured.
    #[error(
        "no storage configured: set {connection_string} (`UseDevelopmentStorage=true` for a local \
         Azurite, which `spot-worker dev` starts) or {account_url} (the account, reached with the \
         user-assigned managed identity {client_id} names, else with the Azure CLI's login)",
        connection_string = spot_worker_settings::table::CONNECTION_STRING.key,
        account_url = spot_worker_settings::table::STORAGE_ACCOUNT_URL.key,
        client_id = spot_worker_settings::table::CLIENT_ID.key
    )]
    NotConfigured,
    /// A credential could not be created.
    #[error("cannot create the {kind} credential: {reason}")]
    Credential {
        /// Which credential.
        kind: &'static str,
        /// Why, redacted.
        reason: String,
    },
    /// A name (queue, container) is invalid.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
}

/// The blob and queue service URLs of a storage account.
#[derive(Clone, PartialEq, Eq)]
pub struct AccountEndpoints {
    /// `https://<account>.blob.core.windows.net`
    pub blob: Url,
    /// `https://<account>.queue.core.windows.net`
    pub queue: Url,
}

impl AccountEndpoints {
    /// The public-cloud endpoints of account `account_name`.
    pub fn for_account(account_name: &str) -> Result<Self, StorageConfigError> {
        Ok(AccountEndpoints {
            blob: parse_url(&format!("https://{account_name}.blob.core.windows.net"))?,
            queue: parse_url(&format!("https://{account_name}.queue.core.windows.net"))?,
        })
    }

    /// Explicit service URLs (sovereign clouds, private endpoints).
    pub fn new(blob: &str, queue: &str) -> Result<Self, StorageConfigError> {
        Ok(AccountEndpoints {
            blob: parse_url(blob)?,
            queue: parse_url(queue)?,
        })
    }
}

impl fmt::Debug for AccountEndpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Redacted all the same: the fields are public, so a hand-built
        // value may carry a SAS in a query string.
        f.debug_struct("AccountEndpoints")
            .field("blob", &redact(self.blob.as_str()))
            .field("queue", &redact(self.queue.as_str()))
            .finish()
    }
}

fn parse_url(text: &str) -> Result<Url, StorageConfigError> {
    let url = Url::parse(text).map_err(|e| StorageConfigError::InvalidUrl {
        url: without_user_info(&redact(text)),
        reason: e.to_string(),
    })?;
    check_service_url(&url).map_err(|reason| StorageConfigError::InvalidUrl {
        url: without_secrets(&url),
        reason: reason.to_owned(),
    })?;
    Ok(url)
}

/// Text that did not parse as a URL, with any `user:password@` before its
/// host replaced by [`REDACTED`](crate::REDACTED): a password there is a
/// secret that [`redact`] does not know.
fn without_user_info(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://{}@{}", crate::REDACTED, &rest[at + 1..]),
        None => text.to_owned(),
    }
}

/// `url` without the parts that may hold secrets (user info, query,
/// fragment), for messages about a URL that was refused for having them.
pub(crate) fn without_secrets(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// What a storage service URL must look like: https (plain http only to a
/// loopback host, i.e. a local emulator), no credentials, no query string
/// and no fragment. Every request carries a SAS signed with the account key
/// or a bearer token, which over plain http anyone on the path could read
/// and replay. Queue and container names are appended to the path, which a
/// query would end up after; and a query here is usually a SAS pasted into
/// the wrong place, where it would be logged as part of the URL. Returns
/// why not.
pub(crate) fn check_service_url(url: &Url) -> Result<(), &'static str> {
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(url) => {}
        "http" => {
            return Err(
                "must be https: plain http is allowed only to a loopback host \
                 (127.0.0.0/8, ::1, localhost: a local emulator), since every request \
                 carries a SAS or bearer token",
            );
        }
        _ => return Err("must be an https URL"),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not contain a user name or password");
    }
    if url.query().is_some() {
        return Err(
            "must not have a query string (a SAS goes into SharedAccessSignature, or the credentials)",
        );
    }
    if url.fragment().is_some() {
        return Err("must not have a fragment");
    }
    Ok(())
}

/// Whether `url`'s host is this machine: 127.0.0.0/8, `::1` or `localhost`.
pub(crate) fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The bounded, jittered exponential retry policy of every request. The
/// SDK's own retry policy applies it, honouring `Retry-After` on 429/503 and
/// retrying 408, 429, 500, 502, 503, 504 and connection failures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry.
    pub initial_delay: Duration,
    /// Longest delay between retries.
    pub max_delay: Duration,
    /// Give up once this much time has passed since the first attempt, so a
    /// storage outage surfaces in seconds (the SDK default is over a minute).
    pub max_elapsed: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 4,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(2),
            max_elapsed: Duration::from_secs(10),
        }
    }
}

/// Slack on top of the retry budget before a call is abandoned: the last
/// try may start just before `max_elapsed` and then needs time to answer.
const CALL_DEADLINE_MARGIN: Duration = Duration::from_secs(2);

impl RetryConfig {
    /// The total deadline of every storage call, retries included:
    /// `max_elapsed + max_delay + 2 s`. The SDK's retry policy only checks
    /// `max_elapsed` between tries, and its transport allows 20 s to connect
    /// and 60 s per read, so without this a blackholed connection would hold
    /// a call for a minute or more. A call past its deadline fails with
    /// `StorageError::Unavailable` (transient).
    pub fn call_deadline(&self) -> Duration {
        self.max_elapsed
            .saturating_add(self.max_delay)
            .saturating_add(CALL_DEADLINE_MARGIN)
    }

    pub(crate) fn to_options(&self) -> RetryOptions {
        RetryOptions::exponential(ExponentialRetryOptions {
            initial_delay: self
                .initial_delay
                .try_into()
                .unwrap_or(time::Duration::ZERO),
            max_retries: self.max_retries,
            max_total_elapsed: self.max_elapsed.try_into().unwrap_or(time::Duration::ZERO),
            max_delay: self.max_delay.try_into().unwrap_or(time::Duration::ZERO),
        })
    }
}

/// Everything needed to reach the storage account.
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// Where and how to authenticate.
    pub credentials: Credentials,
    /// Request retries.
    pub retry: RetryConfig,
    /// Lifetime of SAS tokens signed from an account key (re-signed at half).
    pub sas_lifetime: Duration,
    /// What SAS tokens signed from an account key allow:
    /// [`AccountSasScope::WORKER`] by default, [`AccountSasScope::OPERATOR`]
    /// (the service level too) for the operator's command ([`StorageConfig::for_operator`]).
    pub sas_scope: AccountSasScope,
}

impl StorageConfig {
    /// A configuration with default retries and a one-hour SAS lifetime.
    pub fn new(credentials: Credentials) -> Self {
        StorageConfig {
            credentials,
            retry: RetryConfig::default(),
            sas_lifetime: Duration::from_secs(3600),
            sas_scope: AccountSasScope::WORKER,
        }
    }

    /// The same account for an operator's tools, which also reach the
    /// service level (containers, queues). Never for a worker: it needs
    /// none of that.
    #[must_use]
    pub fn for_operator(mut self) -> Self {
        self.sas_scope = AccountSasScope::OPERATOR;
        self
    }

    /// From a connection string's text.
    pub fn from_connection_string(text: &str) -> Result<Self, StorageConfigError> {
        Ok(Self::new(Credentials::ConnectionString(text.parse()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_key() {
        let config = StorageConfig::from_connection_string("UseDevelopmentStorage=true").unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("Eby8vdM02"), "{debug}");
        assert!(debug.contains("AccountKey(REDACTED)"), "{debug}");
    }

    #[test]
    fn retry_options_are_bounded() {
        let retry = RetryConfig::default();
        assert!(retry.max_elapsed <= Duration::from_secs(10));
        assert!(retry.max_retries <= 5);
        assert_eq!(retry.call_deadline(), Duration::from_secs(14));
    }

    #[test]
    fn endpoints_with_a_query_or_credentials_are_refused_and_never_shown() {
        assert!(AccountEndpoints::new("http://127.0.0.1:1/a", "http://127.0.0.1:2/a").is_ok());
        for bad in [
            "https://acct.blob.core.windows.net/?sv=1&sig=c2VjcmV0",
            "https://user:c2VjcmV0@acct.blob.core.windows.net/",
            "https://acct.blob.core.windows.net/#c2VjcmV0",
            "ftp://acct.blob.core.windows.net/",
        ] {
            let err = AccountEndpoints::new(bad, "https://acct.queue.core.windows.net")
                .unwrap_err()
                .to_string();
            assert!(err.contains("must"), "{err}");
            assert!(!err.contains("c2VjcmV0"), "{err}");
        }
        // Hand-built endpoints bypass the check; Debug still redacts.
        let endpoints = AccountEndpoints {
            blob: Url::parse("https://acct.blob.core.windows.net/?sig=c2VjcmV0").unwrap(),
            queue: Url::parse("https://acct.queue.core.windows.net").unwrap(),
        };
        let debug = format!("{endpoints:?}");
        assert!(
            !debug.contains("c2VjcmV0") && debug.contains("sig=REDACTED"),
            "{debug}"
        );
    }
}
