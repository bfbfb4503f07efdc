//! How to reach the storage account: its endpoints
//! ([`crate::endpoints`]), the credentials ([`crate::credentials`]), and the
//! bounded retry policy every client uses.

use std::time::Duration;

use azure_core::http::{ExponentialRetryOptions, RetryOptions};

pub use crate::config_error::StorageConfigError;
pub use crate::credentials::Credentials;
pub use crate::endpoints::AccountEndpoints;
use crate::sas::AccountSasScope;

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
    use azure_core::http::Url;

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
