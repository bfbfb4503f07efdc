//! Managed-identity access tokens as the emulated Entra ID issues them: a
//! JWT whose claims are what storage services check (`aud`, `iss`, `iat`,
//! `nbf`, `exp`, plus `appid`, `tid`, ...), and the token endpoint's JSON
//! answer with `expires_on` / `expires_in` as strings of seconds, as Azure
//! sends them. The JWT is unsigned (`alg: none`): Azurite's `--oauth basic`
//! does not check signatures, and an emulator has no Entra ID key.

use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use crate::identities::{IdentityConfig, TokenRequest};

/// A token the endpoint handed out, for tests and the control API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IssuedToken {
    /// The identity it is for.
    pub client_id: String,
    /// The resource asked for.
    pub resource: String,
    /// `exp`, in seconds since the epoch.
    pub expires_on: u64,
}

/// The token answer for `request` at `now`: the JSON body and what was issued.
pub(crate) fn issue(
    config: &IdentityConfig,
    request: &TokenRequest,
    now: SystemTime,
) -> (serde_json::Value, IssuedToken) {
    let iat = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let lifetime = config.token_lifetime.as_secs();
    let exp = iat.saturating_add(lifetime);
    let issuer = config.issuer();
    let claims = serde_json::json!({
        "aud": config.audience.clone().unwrap_or_else(|| request.resource.clone()),
        "iss": issuer,
        "iat": iat,
        "nbf": iat,
        "exp": exp,
        "appid": request.client_id,
        "appidacr": "2",
        "idp": issuer,
        "tid": config.tenant_id,
        "uti": uuid::Uuid::new_v4().simple().to_string(),
        "ver": "1.0",
    });
    let header = serde_json::json!({"alg": "none", "typ": "JWT"});
    let token = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let body = serde_json::json!({
        "access_token": token,
        "refresh_token": "",
        "client_id": request.client_id,
        "expires_in": lifetime.to_string(),
        "expires_on": exp.to_string(),
        "ext_expires_in": lifetime.to_string(),
        "not_before": iat.to_string(),
        "resource": request.resource,
        "token_type": "Bearer",
    });
    let issued = IssuedToken {
        client_id: request.client_id.clone(),
        resource: request.resource.clone(),
        expires_on: exp,
    };
    (body, issued)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const CLIENT: &str = "00000000-0000-0000-0000-000000000001";

    #[test]
    fn tokens_carry_the_claims_storage_checks() {
        let config = IdentityConfig {
            token_lifetime: Duration::from_secs(60),
            ..IdentityConfig::user_assigned(CLIENT)
        };
        let request = TokenRequest {
            client_id: CLIENT.to_owned(),
            resource: "https://storage.azure.com".to_owned(),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (body, issued) = issue(&config, &request, now);
        assert_eq!(body["token_type"], "Bearer");
        assert_eq!(
            body["expires_on"], "1700000060",
            "a string, as Azure sends it"
        );
        assert_eq!(body["expires_in"], "60");
        assert_eq!(issued.expires_on, 1_700_000_060);
        let token = body["access_token"].as_str().unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["aud"], "https://storage.azure.com");
        assert_eq!(
            claims["iss"],
            "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/"
        );
        assert_eq!(claims["iat"], 1_700_000_000);
        assert_eq!(claims["nbf"], 1_700_000_000);
        assert_eq!(claims["exp"], 1_700_000_060);
        assert_eq!(claims["appid"], CLIENT);
        // Overrides, for refusal tests.
        let wrong = IdentityConfig {
            issuer: Some("https://issuer.invalid/".to_owned()),
            audience: Some("https://vault.azure.net".to_owned()),
            ..config
        };
        let (body, _) = issue(&wrong, &request, now);
        let token = body["access_token"].as_str().unwrap();
        let claims: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["iss"], "https://issuer.invalid/");
        assert_eq!(claims["aud"], "https://vault.azure.net");
    }
}
