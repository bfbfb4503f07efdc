//! Microsoft Entra ID's token endpoint as workload identity uses it
//! (`POST /{tenant}/oauth2/v2.0/token`, the client-credentials grant with a
//! client assertion): a pod presents its projected service-account token,
//! and gets a storage token for the identity whose federated credential
//! trusts that token's issuer, subject and audience. This is what an AKS pod
//! reaches at `AZURE_AUTHORITY_HOST`; served here so the worker's workload
//! identity is tested against an independent implementation of the exchange.
//!
//! The checks are Entra ID's, in its order, with its error codes
//! (`AADSTS…`): the tenant, the form, the application, the assertion's shape
//! and time, and a federated credential matching it. Refusals are 400 (401
//! for the assertion) with the v2 error shape (`error`,
//! `error_description`, `error_codes`). The assertion's signature is not
//! checked: the emulator has no cluster key, as it has no Entra ID key for
//! the tokens it issues ([`crate::token`]).

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::emulator::Emulator;
use crate::form::url_pairs;
use crate::identities::{FederatedCredential, IdentityConfig, TokenRequest};
use crate::response;
use crate::token::issue;

const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

pub(crate) fn routes() -> axum::Router<Emulator> {
    axum::Router::new().route("/{tenant}/oauth2/v2.0/token", post(exchange))
}

/// A refusal: the HTTP status and the v2 error body.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) body: serde_json::Value,
}

fn refuse(status: StatusCode, error: &str, code: u32, description: String) -> Refusal {
    Refusal {
        status,
        body: serde_json::json!({
            "error": error,
            "error_description": format!("AADSTS{code}: {description}"),
            "error_codes": [code],
        }),
    }
}

/// The claims of a projected service-account token that the exchange checks.
#[derive(Debug, serde::Deserialize)]
struct Assertion {
    iss: String,
    sub: String,
    #[serde(deserialize_with = "one_or_many")]
    aud: Vec<String>,
    exp: u64,
    #[serde(default)]
    nbf: Option<u64>,
}

/// `aud` is a string or an array of strings in JWTs.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        Aud::One(one) => vec![one],
        Aud::Many(many) => many,
    })
}

/// Entra ID's checks of a client-assertion token request, in its order.
pub(crate) fn check_exchange(
    config: &IdentityConfig,
    tenant: &str,
    form: &str,
    now: SystemTime,
) -> Result<TokenRequest, Refusal> {
    if !tenant.eq_ignore_ascii_case(&config.tenant_id) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            90002,
            format!("Tenant '{tenant}' not found."),
        ));
    }
    let pairs: Vec<(&str, String)> = url_pairs(form).collect();
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    };
    let missing = |name: &str| {
        refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            900144,
            format!("The request body must contain the following parameter: '{name}'."),
        )
    };
    if field("grant_type") != Some("client_credentials") {
        return Err(missing("grant_type"));
    }
    let client_id = field("client_id").ok_or_else(|| missing("client_id"))?;
    let scope = field("scope").ok_or_else(|| missing("scope"))?;
    if field("client_assertion_type") != Some(ASSERTION_TYPE) {
        return Err(missing("client_assertion_type"));
    }
    let assertion = field("client_assertion").ok_or_else(|| missing("client_assertion"))?;
    let trusted: Vec<&FederatedCredential> = config
        .federated
        .iter()
        .filter(|f| f.client_id.eq_ignore_ascii_case(client_id))
        .collect();
    if trusted.is_empty() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            700016,
            format!(
                "Application with identifier '{client_id}' was not found in the directory '{tenant}'."
            ),
        ));
    }
    let claims = decode(assertion).ok_or_else(|| {
        refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            50027,
            "JWT token is invalid or is malformed.".to_owned(),
        )
    })?;
    let now_secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    if claims.exp <= now_secs || claims.nbf.is_some_and(|nbf| nbf > now_secs) {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            700024,
            "Client assertion is not within its valid time range.".to_owned(),
        ));
    }
    let matches = |f: &&FederatedCredential| {
        f.issuer == claims.iss && f.subject == claims.sub && claims.aud.contains(&f.audience)
    };
    if !trusted.iter().any(matches) {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            700213,
            format!(
                "No matching federated identity record found for presented assertion subject \
                 '{}'. Check your federated identity credential Subject, Audience and Issuer \
                 against the presented assertion.",
                claims.sub
            ),
        ));
    }
    Ok(TokenRequest {
        client_id: client_id.to_owned(),
        // `https://storage.azure.com/.default` asks for storage's token.
        resource: scope.trim_end_matches(".default").to_owned(),
    })
}

/// The claims of a JWT, if it is one (three dot-separated parts, the
/// middle one base64url JSON with the claims checked).
fn decode(token: &str) -> Option<Assertion> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

async fn exchange(
    State(emulator): State<Emulator>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Response {
    let form = String::from_utf8_lossy(&body);
    emulator.with_state(|state| {
        state.stats.token_gets += 1;
        let config = &state.config.identity;
        match check_exchange(config, &tenant, &form, SystemTime::now()) {
            Ok(request) => {
                let (v1, issued) = issue(config, &request, SystemTime::now());
                state.tokens.push(issued);
                // The v2 endpoint's shape: lifetimes as numbers.
                let lifetime = config.token_lifetime.as_secs();
                let body = serde_json::json!({
                    "token_type": "Bearer",
                    "expires_in": lifetime,
                    "ext_expires_in": lifetime,
                    "access_token": v1["access_token"],
                });
                response::json(StatusCode::OK, &body)
            }
            Err(refusal) => {
                state.stats.bad_requests += 1;
                response::json(refusal.status, &refusal.body)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identities::TOKEN_EXCHANGE_AUDIENCE;

    const CLIENT: &str = "00000000-0000-0000-0000-000000000001";
    const ISSUER: &str = "https://oidc.prod-aks.azure.com/tenant/cluster/";

    fn jwt(claims: serde_json::Value) -> String {
        format!(
            "{}.{}.c2ln",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256"}"#),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }

    fn config() -> IdentityConfig {
        IdentityConfig {
            federated: vec![FederatedCredential::for_service_account(
                CLIENT,
                ISSUER,
                "spot-worker",
                "spot-worker",
            )],
            ..IdentityConfig::default()
        }
    }

    fn form(client_id: &str, assertion: &str) -> String {
        format!(
            "client_assertion={assertion}&client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer\
             &client_id={client_id}&grant_type=client_credentials&scope=https%3A%2F%2Fstorage.azure.com%2F.default"
        )
    }

    #[test]
    fn a_trusted_service_account_token_is_exchanged_and_others_are_refused_with_entras_codes() {
        let config = config();
        let tenant = config.tenant_id.clone();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let good = jwt(serde_json::json!({
            "iss": ISSUER, "sub": "system:serviceaccount:spot-worker:spot-worker",
            "aud": [TOKEN_EXCHANGE_AUDIENCE], "exp": 1_700_003_600u64, "nbf": 1_699_999_000u64,
        }));
        let request = check_exchange(&config, &tenant, &form(CLIENT, &good), now).unwrap();
        assert_eq!(request.client_id, CLIENT);
        assert_eq!(request.resource, "https://storage.azure.com/");

        let expired = jwt(serde_json::json!({
            "iss": ISSUER, "sub": "system:serviceaccount:spot-worker:spot-worker",
            "aud": TOKEN_EXCHANGE_AUDIENCE, "exp": 1_699_999_999u64,
        }));
        let other_account = jwt(serde_json::json!({
            "iss": ISSUER, "sub": "system:serviceaccount:default:default",
            "aud": TOKEN_EXCHANGE_AUDIENCE, "exp": 1_700_003_600u64,
        }));
        // (tenant, client id, assertion, status, error code)
        let table = [
            ("other-tenant", CLIENT, good.as_str(), 400, 90002),
            (tenant.as_str(), "someone-else", good.as_str(), 400, 700016),
            (tenant.as_str(), CLIENT, "not-a-jwt", 401, 50027),
            (tenant.as_str(), CLIENT, expired.as_str(), 401, 700024),
            (tenant.as_str(), CLIENT, other_account.as_str(), 401, 700213),
        ];
        for (tenant, client, assertion, status, code) in table {
            let refusal =
                check_exchange(&config, tenant, &form(client, assertion), now).unwrap_err();
            assert_eq!(refusal.status.as_u16(), status, "{code}");
            assert_eq!(refusal.body["error_codes"][0], code, "{}", refusal.body);
        }
        let incomplete =
            check_exchange(&config, &tenant, "grant_type=client_credentials", now).unwrap_err();
        assert_eq!(incomplete.body["error_codes"][0], 900144);
    }
}
