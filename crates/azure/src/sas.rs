//! Account SAS tokens signed from an account key, and the pipeline policy
//! that puts one on every request. The 1.x SDK crates have no shared-key
//! authentication, so a key (including the emulator's) is turned into a
//! short-lived SAS instead (one hour, re-signed at half-life), scoped to
//! what the worker's calls need ([`AccountSasScope::WORKER`]) and to https
//! unless the account is a local emulator on loopback.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request, Url};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The SAS version signed; its string-to-sign includes the encryption scope.
const SAS_VERSION: &str = "2021-08-06";
/// What an account SAS allows: the `ss`, `srt` and `sp` fields, and whether
/// plain http is allowed (`spr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountSasScope {
    /// Services: `b` blob, `q` queue.
    pub services: &'static str,
    /// Resource types: `s` service, `c` container/queue, `o` object/message.
    pub resource_types: &'static str,
    /// Permissions, in the order the service requires (`rwdlacup`).
    pub permissions: &'static str,
    /// `spr=https` when true; `https,http` (local emulators) when false.
    pub https_only: bool,
}

impl AccountSasScope {
    /// What the worker's own calls need, and nothing more: on blob and
    /// queue, at container level create a container or queue (`c`) and read
    /// a queue's properties (`r`); at object level read, write and create
    /// blobs (`r`, `w`, `c`: checkpoints are overwritten, results created),
    /// delete blobs (`d`: probes, finished checkpoints, claim checks), add
    /// messages (`a`: poison records), update them (`u`: visibility
    /// renewals) and get/delete them (`p`), and list blobs (`l`: the
    /// fleet's Spot sightings are one record a worker, found by listing
    /// their prefix; an account SAS cannot narrow a listing to a prefix).
    /// No service level (`s`), so no account properties or container
    /// listing.
    pub const WORKER: Self = AccountSasScope {
        services: "bq",
        resource_types: "co",
        permissions: "rwdlacup",
        https_only: true,
    };

    /// For operators and tests that inspect an account: everything the
    /// worker may do, at every level (the service too: containers and
    /// queues listed). Never given to a worker.
    pub const OPERATOR: Self = AccountSasScope {
        services: "bq",
        resource_types: "sco",
        permissions: "rwdlacup",
        https_only: true,
    };

    /// The same scope, also valid over plain http (a local emulator on
    /// loopback; other hosts are refused before any request is made).
    pub fn allowing_http(self) -> Self {
        AccountSasScope {
            https_only: false,
            ..self
        }
    }

    fn protocol(&self) -> &'static str {
        if self.https_only {
            "https"
        } else {
            "https,http"
        }
    }
}
/// Allows clock skew between this machine and the service.
const START_SKEW: Duration = Duration::from_secs(5 * 60);
/// Query parameter names of an account SAS, replaced on every try.
const SAS_PARAMETERS: [&str; 8] = ["sv", "ss", "srt", "sp", "se", "st", "spr", "sig"];

/// Something went wrong signing a SAS (a malformed key). Never contains the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot sign an account SAS: {0}")]
pub struct SasError(String);

/// Signs an account SAS with `scope`, valid from a few minutes ago until
/// `expiry`. Returns the query string (without `?`); it is a secret.
///
/// ```
/// use azure_core::credentials::Secret;
/// use spot_worker_azure::{AccountSasScope, sign_account_sas};
/// let expiry = time::macros::datetime!(2030-01-01 0:00 UTC);
/// let sas = sign_account_sas("devstoreaccount1", &Secret::new("a2V5"), &AccountSasScope::WORKER, expiry).unwrap();
/// assert!(sas.secret().contains("se=2030-01-01T00%3A00%3A00Z"));
/// assert!(sas.secret().contains("sp=rwdlacup") && sas.secret().contains("spr=https&"));
/// assert!(sas.secret().contains("&sig="));
/// ```
pub fn sign_account_sas(
    account_name: &str,
    key: &Secret,
    scope: &AccountSasScope,
    expiry: OffsetDateTime,
) -> Result<Secret, SasError> {
    let start = expiry.min(OffsetDateTime::now_utc()) - START_SKEW;
    let pairs = signed_pairs(account_name, key, scope, start, expiry)?;
    let mut url = Url::parse("http://sas.invalid/").map_err(|e| SasError(e.to_string()))?;
    url.query_pairs_mut()
        .extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())));
    Ok(Secret::new(url.query().unwrap_or_default().to_owned()))
}

fn signed_pairs(
    account_name: &str,
    key: &Secret,
    scope: &AccountSasScope,
    start: OffsetDateTime,
    expiry: OffsetDateTime,
) -> Result<Vec<(&'static str, String)>, SasError> {
    let start = format_time(start)?;
    let expiry = format_time(expiry)?;
    let AccountSasScope {
        services,
        resource_types,
        permissions,
        ..
    } = scope;
    let protocol = scope.protocol();
    // The field order is fixed by the service; empty lines are the unused
    // signed IP and encryption scope.
    let string_to_sign = format!(
        "{account_name}\n{permissions}\n{services}\n{resource_types}\n{start}\n{expiry}\n\n{protocol}\n{SAS_VERSION}\n\n"
    );
    let signature = azure_core::hmac::hmac_sha256(&string_to_sign, key)
        .map_err(|e| SasError(crate::redact::redact(&e.to_string())))?;
    Ok(vec![
        ("sv", SAS_VERSION.to_owned()),
        ("ss", (*services).to_owned()),
        ("srt", (*resource_types).to_owned()),
        ("sp", (*permissions).to_owned()),
        ("st", start),
        ("se", expiry),
        ("spr", protocol.to_owned()),
        ("sig", signature),
    ])
}

fn format_time(t: OffsetDateTime) -> Result<String, SasError> {
    // The service wants second precision: 2030-01-01T00:00:00Z.
    t.replace_nanosecond(0)
        .map_err(|e| SasError(e.to_string()))?
        .format(&Rfc3339)
        .map_err(|e| SasError(e.to_string()))
}

/// Where a [`SasPolicy`] gets its token.
#[derive(Clone)]
pub(crate) enum SasSource {
    /// Sign from this account key, re-signing before expiry.
    AccountKey {
        account_name: String,
        key: Secret,
        scope: AccountSasScope,
        lifetime: Duration,
    },
    /// Use this fixed token.
    Fixed(Secret),
}

/// Decoded SAS query pairs, and when to re-sign them.
type CachedSas = (Vec<(String, String)>, OffsetDateTime);

/// Adds the SAS query parameters to every request (every try, so a retry
/// after a re-sign uses the fresh token).
pub(crate) struct SasPolicy {
    source: SasSource,
    cached: Mutex<Option<CachedSas>>,
}

impl fmt::Debug for SasPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SasPolicy(REDACTED)")
    }
}

impl SasPolicy {
    pub(crate) fn new(source: SasSource) -> Arc<Self> {
        Arc::new(SasPolicy {
            source,
            cached: Mutex::new(None),
        })
    }

    fn current_pairs(&self) -> azure_core::Result<Vec<(String, String)>> {
        let now = OffsetDateTime::now_utc();
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((pairs, refresh_at)) = cached.as_ref()
            && now < *refresh_at
        {
            return Ok(pairs.clone());
        }
        let (pairs, refresh_at) = match &self.source {
            SasSource::Fixed(sas) => (
                parse_query(sas.secret()),
                OffsetDateTime::now_utc() + Duration::from_secs(86400 * 365),
            ),
            SasSource::AccountKey {
                account_name,
                key,
                scope,
                lifetime,
            } => {
                let expiry = now + *lifetime;
                let pairs = signed_pairs(account_name, key, scope, now - START_SKEW, expiry)
                    .map_err(|e| {
                        azure_core::Error::with_message(
                            azure_core::error::ErrorKind::Credential,
                            e.to_string(),
                        )
                    })?;
                // Re-sign when half the lifetime is used, well before expiry.
                let owned = pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                (owned, now + *lifetime / 2)
            }
        };
        *cached = Some((pairs.clone(), refresh_at));
        Ok(pairs)
    }
}

/// Splits a SAS query string into decoded pairs, decoding exactly as the
/// URL parser does so that re-encoding in [`apply`] round-trips.
fn parse_query(query: &str) -> Vec<(String, String)> {
    match Url::parse(&format!("http://sas.invalid/?{query}")) {
        Ok(url) => url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Replaces any SAS parameters already on `url` with `pairs`.
fn apply(url: &mut Url, pairs: &[(String, String)]) {
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !SAS_PARAMETERS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.set_query(None);
    let mut query = url.query_pairs_mut();
    query.extend_pairs(kept.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    query.extend_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
}

#[async_trait]
impl Policy for SasPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let pairs = self.current_pairs()?;
        apply(request.url_mut(), &pairs);
        match next.split_first() {
            Some((first, rest)) => first.send(ctx, request, rest).await,
            None => Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Other,
                "SAS policy must not be the last in the pipeline",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer_signature() {
        // Computed independently (Python hmac/hashlib) for this string-to-sign.
        let key = Secret::new(crate::connection_string::DEVELOPMENT_ACCOUNT_KEY);
        let start = time::macros::datetime!(2030-01-01 0:00 UTC);
        let expiry = time::macros::datetime!(2030-01-01 1:00 UTC);
        // The string-to-sign of the broad scope, over http and https.
        let scope = AccountSasScope::OPERATOR.allowing_http();
        let pairs = signed_pairs("devstoreaccount1", &key, &scope, start, expiry).unwrap();
        let sig = &pairs.iter().find(|(k, _)| *k == "sig").unwrap().1;
        assert_eq!(sig, KNOWN_SIGNATURE);
    }

    const KNOWN_SIGNATURE: &str = "pfXvG84SzB+sLX1kzfr5Qkcias7JuUlAZGQRdsm3ERg=";

    #[test]
    fn apply_replaces_earlier_sas_parameters_and_keeps_others() {
        let mut url = Url::parse("http://h/q/messages?numofmessages=3&sig=old&sv=old").unwrap();
        apply(
            &mut url,
            &[("sv".into(), "new".into()), ("sig".into(), "a+b/c=".into())],
        );
        let pairs: Vec<_> = url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("numofmessages".to_owned(), "3".to_owned()),
                ("sv".to_owned(), "new".to_owned()),
                ("sig".to_owned(), "a+b/c=".to_owned())
            ]
        );
    }

    #[test]
    fn signed_tokens_are_short_lived_and_cached_until_half_life() {
        let policy = SasPolicy::new(SasSource::AccountKey {
            account_name: "devstoreaccount1".into(),
            key: Secret::new(crate::connection_string::DEVELOPMENT_ACCOUNT_KEY),
            scope: AccountSasScope::WORKER,
            lifetime: Duration::from_secs(3600),
        });
        let first = policy.current_pairs().unwrap();
        let expiry = &first.iter().find(|(k, _)| k == "se").unwrap().1;
        let expiry = OffsetDateTime::parse(expiry, &Rfc3339).unwrap();
        let from_now = expiry - OffsetDateTime::now_utc();
        assert!(
            from_now > time::Duration::minutes(59) && from_now <= time::Duration::hours(1),
            "{from_now}"
        );
        // Not re-signed on every request.
        assert_eq!(policy.current_pairs().unwrap(), first);
        assert!(!format!("{policy:?}").contains("sig"));
    }

    #[test]
    fn fixed_tokens_are_decoded_once_and_reapplied() {
        let policy = SasPolicy::new(SasSource::Fixed(Secret::new("sv=1&sig=a%2Bb%3D")));
        let pairs = policy.current_pairs().unwrap();
        assert_eq!(pairs[1], ("sig".to_owned(), "a+b=".to_owned()));
    }
}
