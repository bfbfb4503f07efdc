//! Azure Application Insights: parsing `APPLICATIONINSIGHTS_CONNECTION_STRING`
//! without ever revealing its instrumentation key, and building the
//! exporters that post traces and metrics to the ingestion endpoint.

use std::fmt;
use std::str::FromStr;

use opentelemetry_application_insights::Exporter;

/// The ingestion endpoint used when a connection string names none (the
/// same default the Azure SDKs use).
pub const DEFAULT_INGESTION_ENDPOINT: &str = "https://dc.services.visualstudio.com";

const REDACTED: &str = "<redacted>";

/// A parsed Application Insights connection string.
///
/// Only what this crate needs is kept: the instrumentation key and the
/// ingestion endpoint. `Debug` and `Display` redact the key, so the value can
/// be logged or put in an error safely.
///
/// ```
/// use spot_worker_telemetry::AppInsightsConnectionString;
///
/// let cs: AppInsightsConnectionString =
///     "InstrumentationKey=0000-secret;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/"
///         .parse()?;
/// assert_eq!(cs.ingestion_endpoint(), "https://westeurope-5.in.applicationinsights.azure.com");
/// assert!(!format!("{cs:?} {cs}").contains("secret"));
/// # Ok::<(), spot_worker_telemetry::AppInsightsConnectionStringError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AppInsightsConnectionString {
    instrumentation_key: String,
    ingestion_endpoint: String,
}

/// Why a connection string was rejected. Never contains the string itself,
/// since it carries the instrumentation key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppInsightsConnectionStringError {
    /// The string is empty or only whitespace.
    #[error("the connection string is empty")]
    Empty,
    /// A `;`-separated segment has no `=` (segment numbers start at 1).
    #[error("segment {0} is not of the form Key=Value")]
    InvalidSegment(usize),
    /// There is no `InstrumentationKey=` segment, or it is empty.
    #[error("the connection string has no InstrumentationKey")]
    MissingInstrumentationKey,
    /// `Authorization=` names something other than `ikey` (Microsoft Entra
    /// authentication needs a token credential this crate does not have).
    #[error("unsupported Authorization {0:?}: only \"ikey\" is supported")]
    UnsupportedAuthorization(String),
    /// The ingestion endpoint is not an absolute `http(s)` URL with a host.
    #[error("invalid ingestion endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given (endpoints are not secret).
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl AppInsightsConnectionString {
    /// Parses a connection string of `;`-separated `Key=Value` segments, as
    /// shown in the Azure portal.
    ///
    /// Keys are case-insensitive and unknown keys are ignored. The endpoint
    /// comes from `IngestionEndpoint`, else from `EndpointSuffix` (and
    /// `Location`), else [`DEFAULT_INGESTION_ENDPOINT`]. Unlike the Azure
    /// SDKs, an `http://` endpoint is kept as written rather than upgraded to
    /// `https://`, so a local proxy or test receiver can stand in for Azure.
    pub fn parse(input: &str) -> Result<Self, AppInsightsConnectionStringError> {
        if input.trim().is_empty() {
            return Err(AppInsightsConnectionStringError::Empty);
        }
        let mut instrumentation_key = None;
        let mut ingestion_endpoint = None;
        let mut endpoint_suffix = None;
        let mut location = None;
        for (index, segment) in input.split(';').enumerate() {
            let segment = segment.trim();
            // Portal strings sometimes end with `;`; an empty segment is harmless.
            if segment.is_empty() {
                continue;
            }
            let (key, value) = segment
                .split_once('=')
                .ok_or(AppInsightsConnectionStringError::InvalidSegment(index + 1))?;
            let value = value.trim();
            match key.trim().to_ascii_lowercase().as_str() {
                "instrumentationkey" => instrumentation_key = Some(value),
                "ingestionendpoint" => ingestion_endpoint = Some(value),
                "endpointsuffix" => endpoint_suffix = Some(value),
                "location" => location = Some(value),
                "authorization" if !value.eq_ignore_ascii_case("ikey") => {
                    return Err(AppInsightsConnectionStringError::UnsupportedAuthorization(
                        value.to_owned(),
                    ));
                }
                _ => {}
            }
        }
        let instrumentation_key = instrumentation_key
            .filter(|key| !key.is_empty())
            .ok_or(AppInsightsConnectionStringError::MissingInstrumentationKey)?
            .to_owned();
        let endpoint = match (ingestion_endpoint, endpoint_suffix) {
            (Some(endpoint), _) if !endpoint.is_empty() => endpoint.to_owned(),
            (_, Some(suffix)) if !suffix.is_empty() => match location.filter(|l| !l.is_empty()) {
                Some(location) => format!("https://{location}.dc.{suffix}"),
                None => format!("https://dc.{suffix}"),
            },
            _ => DEFAULT_INGESTION_ENDPOINT.to_owned(),
        };
        Ok(Self {
            instrumentation_key,
            ingestion_endpoint: validate_endpoint(&endpoint)?,
        })
    }

    /// The ingestion endpoint (scheme and authority, no trailing `/`); the
    /// exporter posts to `{endpoint}/v2/track`.
    pub fn ingestion_endpoint(&self) -> &str {
        &self.ingestion_endpoint
    }

    /// The instrumentation key. This is a secret: do not log it.
    pub fn instrumentation_key(&self) -> &str {
        &self.instrumentation_key
    }
}

fn validate_endpoint(endpoint: &str) -> Result<String, AppInsightsConnectionStringError> {
    let invalid = |reason: &str| AppInsightsConnectionStringError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.to_owned(),
    };
    let url = reqwest::Url::parse(endpoint).map_err(|error| invalid(&error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("there is no host"));
    }
    Ok(endpoint.trim_end_matches('/').to_owned())
}

impl FromStr for AppInsightsConnectionString {
    type Err = AppInsightsConnectionStringError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Self::parse(input)
    }
}

impl fmt::Debug for AppInsightsConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppInsightsConnectionString")
            .field("instrumentation_key", &REDACTED)
            .field("ingestion_endpoint", &self.ingestion_endpoint)
            .finish()
    }
}

impl fmt::Display for AppInsightsConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "InstrumentationKey={REDACTED};IngestionEndpoint={}",
            self.ingestion_endpoint
        )
    }
}

/// Builds the Application Insights exporter (it implements both the span
/// and the push-metric exporter traits).
///
/// The deprecated `Exporter::new` + `with_endpoint` pair is used on purpose:
/// `new_from_connection_string` rewrites `http://` endpoints to `https://`,
/// which would make a loopback receiver unreachable, and the connection
/// string has already been parsed (with redacting errors) by this module.
#[allow(deprecated)]
pub(crate) fn exporter<C>(
    connection_string: &AppInsightsConnectionString,
    client: C,
) -> Result<Exporter<C>, String> {
    Exporter::new(connection_string.instrumentation_key.clone(), client)
        .with_endpoint(&connection_string.ingestion_endpoint)
        .map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00000000-1111-2222-3333-444444444444";

    #[test]
    fn parses_key_and_ingestion_endpoint() {
        let cs = AppInsightsConnectionString::parse(&format!(
            "InstrumentationKey={KEY};IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/;LiveEndpoint=https://westeurope.livediagnostics.monitor.azure.com/;ApplicationId=abc"
        ))
        .unwrap();
        assert_eq!(cs.instrumentation_key(), KEY);
        assert_eq!(
            cs.ingestion_endpoint(),
            "https://westeurope-5.in.applicationinsights.azure.com"
        );
    }

    #[test]
    fn keys_are_case_insensitive_and_trailing_separator_is_fine() {
        let cs = AppInsightsConnectionString::parse(&format!(
            " instrumentationkey = {KEY} ; ingestionendpoint=http://127.0.0.1:9/ ;"
        ))
        .unwrap();
        assert_eq!(cs.instrumentation_key(), KEY);
        assert_eq!(cs.ingestion_endpoint(), "http://127.0.0.1:9");
    }

    #[test]
    fn endpoint_falls_back_to_suffix_then_default() {
        let cs = AppInsightsConnectionString::parse(&format!(
            "InstrumentationKey={KEY};EndpointSuffix=ai.contoso.com;Location=westus2"
        ))
        .unwrap();
        assert_eq!(cs.ingestion_endpoint(), "https://westus2.dc.ai.contoso.com");
        let cs = AppInsightsConnectionString::parse(&format!(
            "InstrumentationKey={KEY};EndpointSuffix=ai.contoso.com"
        ))
        .unwrap();
        assert_eq!(cs.ingestion_endpoint(), "https://dc.ai.contoso.com");
        let cs = AppInsightsConnectionString::parse(&format!("InstrumentationKey={KEY}")).unwrap();
        assert_eq!(cs.ingestion_endpoint(), DEFAULT_INGESTION_ENDPOINT);
        let cs = AppInsightsConnectionString::parse(&format!(
            "Authorization=ikey;InstrumentationKey={KEY}"
        ))
        .unwrap();
        assert_eq!(cs.instrumentation_key(), KEY);
    }

    #[test]
    fn rejects_malformed_strings_without_echoing_them() {
        let cases = [
            ("", AppInsightsConnectionStringError::Empty),
            ("   ", AppInsightsConnectionStringError::Empty),
            (
                "IngestionEndpoint=https://example.com",
                AppInsightsConnectionStringError::MissingInstrumentationKey,
            ),
            (
                "InstrumentationKey=",
                AppInsightsConnectionStringError::MissingInstrumentationKey,
            ),
            (
                "InstrumentationKey=00000000-1111-2222-3333-444444444444;garbage",
                AppInsightsConnectionStringError::InvalidSegment(2),
            ),
            (
                "Authorization=AAD;InstrumentationKey=00000000-1111-2222-3333-444444444444",
                AppInsightsConnectionStringError::UnsupportedAuthorization("AAD".into()),
            ),
        ];
        for (input, expected) in cases {
            let error = AppInsightsConnectionString::parse(input).unwrap_err();
            assert_eq!(error, expected, "input {input:?}");
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains(KEY), "{shown}");
        }
        for endpoint in ["ftp://example.com", "not a url", "https://"] {
            let error = AppInsightsConnectionString::parse(&format!(
                "InstrumentationKey={KEY};IngestionEndpoint={endpoint}"
            ))
            .unwrap_err();
            assert!(
                matches!(
                    error,
                    AppInsightsConnectionStringError::InvalidEndpoint { .. }
                ),
                "{endpoint}: {error:?}"
            );
            assert!(!format!("{error} {error:?}").contains(KEY));
        }
    }

    #[test]
    fn debug_and_display_redact_the_key() {
        let cs = AppInsightsConnectionString::parse(&format!(
            "InstrumentationKey={KEY};IngestionEndpoint=https://example.com"
        ))
        .unwrap();
        for shown in [format!("{cs:?}"), format!("{cs:#?}"), cs.to_string()] {
            assert!(!shown.contains(KEY), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(shown.contains("https://example.com"), "{shown}");
        }
    }
}
