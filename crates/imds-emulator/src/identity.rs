//! The managed-identity token endpoint of IMDS
//! (`GET /metadata/identity/oauth2/token`), as a VM with user-assigned
//! identities sees it: `Metadata: true` and `api-version` required, only the
//! identities assigned to the VM answered, a JWT access token whose `aud` is
//! the resource asked for and whose `iss` is the tenant's Entra ID issuer,
//! and `expires_on` / `expires_in` as strings of seconds, as Azure sends
//! them. Refusals are 400 with the OAuth error shape
//! (`{"error": "invalid_request", "error_description": "…"}`), which is what
//! the real endpoint answers (documented in "How to use managed identities
//! for Azure resources on an Azure VM to acquire an access token", section
//! "Error handling").
//!
//! The tokens themselves are made in [`crate::token`]. Lifetime, issuer and
//! audience can be changed at run time (control API
//! `POST /emulator/identity`) to test refresh and refusals.

use std::time::SystemTime;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;

use crate::emulator::Emulator;
use crate::form::url_pairs;
use crate::identities::{IdentityConfig, TokenRequest};
use crate::response;
use crate::token::issue;

/// The path of the token endpoint.
pub const TOKEN_PATH: &str = "/metadata/identity/oauth2/token";

/// The first api-version of the token endpoint; the docs ask for it "or
/// greater", and the Azure SDKs send 2018-02-01 or 2019-08-01.
const OLDEST_API_VERSION: &str = "2018-02-01";

pub(crate) fn routes() -> axum::Router<Emulator> {
    axum::Router::new().route(TOKEN_PATH, get(get_token))
}

/// The real endpoint's checks, in its order; the error is the 400 body.
pub(crate) fn check_token_request(
    config: &IdentityConfig,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<TokenRequest, serde_json::Value> {
    let refuse = |description: &str| serde_json::json!({"error": "invalid_request", "error_description": description});
    // Like every IMDS endpoint: nothing that went through a proxy.
    if headers.contains_key("x-forwarded-for") {
        return Err(refuse(
            "Requests with an X-Forwarded-For header are not allowed",
        ));
    }
    let metadata = headers
        .get("metadata")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
    if !metadata {
        return Err(refuse("Required metadata header not specified"));
    }
    let params: Vec<(String, String)> = query
        .map(|q| {
            url_pairs(q)
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    };
    let Some(version) = param("api-version") else {
        return Err(refuse("Required query variable 'api-version' is missing"));
    };
    if !is_api_version(version) {
        return Err(refuse("Bad request. api-version is invalid"));
    }
    let Some(resource) = param("resource") else {
        return Err(refuse("Required query variable 'resource' is missing"));
    };
    let client_id = match (param("client_id"), config.client_ids.as_slice()) {
        (Some(asked), assigned) if assigned.iter().any(|id| id.eq_ignore_ascii_case(asked)) => {
            asked.to_owned()
        }
        (Some(_), _) | (None, []) => return Err(refuse("Identity not found")),
        (None, [only]) => only.clone(),
        (None, _) => {
            return Err(refuse(
                "Multiple user assigned identities exist, please specify the clientId / \
                 resourceId of the identity in the token request",
            ));
        }
    };
    Ok(TokenRequest {
        client_id,
        resource: resource.to_owned(),
    })
}

/// `YYYY-MM-DD`, no older than the endpoint's first version.
fn is_api_version(version: &str) -> bool {
    let shaped = version.len() == 10
        && version.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        });
    shaped && version >= OLDEST_API_VERSION
}

async fn get_token(
    State(emulator): State<Emulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    // The token endpoint has its own limits (20 requests per second, 5 at a
    // time), separate from Scheduled Events' 5 per second. They are not
    // emulated: the SDK caches a token until 5 minutes before it expires, so
    // only deliberately short-lived tokens make it ask often, and then the
    // point is to see it refresh, not to be throttled.
    emulator.with_state(|state| {
        state.stats.token_gets += 1;
        let config = &state.config.identity;
        match check_token_request(config, &headers, query.as_deref()) {
            Ok(request) => {
                let (body, issued) = issue(config, &request, SystemTime::now());
                state.tokens.push(issued);
                response::json(StatusCode::OK, &body)
            }
            Err(body) => {
                state.stats.bad_requests += 1;
                response::json(StatusCode::BAD_REQUEST, &body)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "00000000-0000-0000-0000-000000000001";

    fn headers(metadata: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = metadata {
            headers.insert("metadata", value.parse().unwrap());
        }
        headers
    }

    fn description(result: Result<TokenRequest, serde_json::Value>) -> String {
        let body = result.unwrap_err();
        assert_eq!(body["error"], "invalid_request", "{body}");
        body["error_description"].as_str().unwrap().to_owned()
    }

    #[test]
    fn requests_are_checked_like_the_real_endpoint() {
        let config = IdentityConfig::user_assigned(CLIENT);
        let good = format!(
            "api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F&client_id={CLIENT}"
        );
        let cases: [(Option<&str>, &str, &str); 6] = [
            (None, &good, "Required metadata header not specified"),
            (
                Some("false"),
                &good,
                "Required metadata header not specified",
            ),
            (
                Some("true"),
                "resource=https://storage.azure.com",
                "Required query variable 'api-version' is missing",
            ),
            (
                Some("true"),
                "api-version=2017-01-01&resource=x",
                "Bad request. api-version is invalid",
            ),
            (
                Some("true"),
                "api-version=2019-08-01",
                "Required query variable 'resource' is missing",
            ),
            (
                Some("true"),
                "api-version=2019-08-01&resource=x&client_id=someone-else",
                "Identity not found",
            ),
        ];
        for (metadata, query, expected) in cases {
            assert_eq!(
                description(check_token_request(
                    &config,
                    &headers(metadata),
                    Some(query)
                )),
                expected,
                "{metadata:?} {query}"
            );
        }
        let request = check_token_request(&config, &headers(Some("true")), Some(&good)).unwrap();
        assert_eq!(
            request,
            TokenRequest {
                client_id: CLIENT.to_owned(),
                resource: "https://storage.azure.com/".to_owned()
            }
        );
    }

    #[test]
    fn without_a_client_id_only_a_single_identity_is_chosen() {
        let query = Some("api-version=2019-08-01&resource=r");
        let none = IdentityConfig::default();
        assert_eq!(
            description(check_token_request(&none, &headers(Some("true")), query)),
            "Identity not found"
        );
        let one = IdentityConfig::user_assigned(CLIENT);
        assert_eq!(
            check_token_request(&one, &headers(Some("true")), query)
                .unwrap()
                .client_id,
            CLIENT
        );
        let two = IdentityConfig {
            client_ids: vec![CLIENT.to_owned(), "other".to_owned()],
            ..IdentityConfig::default()
        };
        assert!(
            description(check_token_request(&two, &headers(Some("true")), query))
                .starts_with("Multiple user assigned identities")
        );
    }
}
