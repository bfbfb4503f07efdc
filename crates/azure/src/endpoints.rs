//! Where the storage account is: its blob and queue service URLs
//! ([`AccountEndpoints`]), each checked as it is parsed.

use std::fmt;

use azure_core::http::Url;

use crate::config_error::StorageConfigError;
use crate::redact::redact;
use crate::service_url::{check_service_url, without_secrets};

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
