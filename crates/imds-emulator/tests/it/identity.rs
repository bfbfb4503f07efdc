//! The managed-identity token endpoint over HTTP, as a VM's clients use it:
//! only the assigned identity answered, Azure's error shape otherwise, and
//! token lifetime, issuer and audience changed through the control API.

use crate::common;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use reqwest::StatusCode;
use serde_json::Value;
use spot_worker_imds_emulator::{EmulatorConfig, IdentityConfig};

const CLIENT: &str = "00000000-0000-0000-0000-000000000001";

async fn token(http: &Http, client_id: &str) -> Answer {
    answer(
        http.client
            .get(format!(
                "{}/metadata/identity/oauth2/token?api-version=2018-02-01\
                 &resource=https%3A%2F%2Fstorage.azure.com%2F&client_id={client_id}",
                http.base
            ))
            .header("Metadata", "true"),
    )
    .await
}

/// The claims of the token `http`'s emulator issues to [`CLIENT`] now.
async fn claims_issued(http: &Http) -> Value {
    let body = token(http, CLIENT).await.json();
    claims(body["access_token"].as_str().expect("a token"))
}

fn claims(access_token: &str) -> Value {
    let payload = access_token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

#[tokio::test]
async fn only_the_assigned_identity_gets_a_token() {
    let emulator = with_config(EmulatorConfig {
        identity: IdentityConfig::user_assigned(CLIENT),
        ..EmulatorConfig::default()
    })
    .await;
    let http = Http::to(&emulator);

    let good = token(&http, CLIENT).await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.text);
    assert!(good.content_type.starts_with("application/json"));
    let body = good.json();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["resource"], "https://storage.azure.com/");
    let expires_on: u64 = body["expires_on"].as_str().unwrap().parse().unwrap();
    let claims = claims(body["access_token"].as_str().unwrap());
    assert_eq!(claims["aud"], "https://storage.azure.com/");
    assert!(
        claims["iss"]
            .as_str()
            .unwrap()
            .starts_with("https://sts.windows.net/")
    );
    assert_eq!(claims["exp"].as_u64(), Some(expires_on));
    assert!(claims["iat"].as_u64().is_some() && claims["nbf"].as_u64().is_some());

    let wrong = token(&http, "11111111-1111-1111-1111-111111111111").await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        wrong.json(),
        serde_json::json!({"error": "invalid_request", "error_description": "Identity not found"})
    );

    let no_header = http
        .get("/metadata/identity/oauth2/token?api-version=2018-02-01&resource=x")
        .await;
    assert_eq!(no_header.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        no_header.json()["error_description"],
        "Required metadata header not specified"
    );

    let issued = emulator.tokens();
    assert_eq!(issued.len(), 1, "refusals issue nothing");
    assert_eq!(issued[0].client_id, CLIENT);
    assert_eq!(issued[0].expires_on, expires_on);
    assert_eq!(emulator.stats().token_gets, 3);
}

#[tokio::test]
async fn the_control_api_sets_lifetime_issuer_and_audience() {
    let (_emulator, http) = unlimited_over_http().await;
    // No identity by default.
    assert_eq!(token(&http, CLIENT).await.status, StatusCode::BAD_REQUEST);
    let changed = http
        .control(
            "/emulator/identity",
            serde_json::json!({"client_ids": [CLIENT], "token_lifetime_secs": 5}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text);
    assert_eq!(changed.json()["token_lifetime_secs"], 5);

    let body = token(&http, CLIENT).await.json();
    assert_eq!(body["expires_in"], "5");
    let claims_short = claims(body["access_token"].as_str().unwrap());
    assert_eq!(
        claims_short["exp"].as_u64().unwrap() - claims_short["iat"].as_u64().unwrap(),
        5
    );

    let elsewhere = serde_json::json!({
        "issuer": "https://issuer.invalid/",
        "audience": "https://vault.azure.net",
    });
    http.control("/emulator/identity", elsewhere).await;
    let refused_by_storage = claims_issued(&http).await;
    assert_eq!(refused_by_storage["iss"], "https://issuer.invalid/");
    assert_eq!(refused_by_storage["aud"], "https://vault.azure.net");

    // null restores the defaults; unknown fields and a zero lifetime are refused.
    http.control(
        "/emulator/identity",
        serde_json::json!({"issuer": null, "audience": null}),
    )
    .await;
    let restored = claims_issued(&http).await;
    assert_eq!(restored["aud"], "https://storage.azure.com/");
    for bad in [
        serde_json::json!({"token_lifetime_secs": 0}),
        serde_json::json!({"lifetime": 5}),
    ] {
        let refused = http.control("/emulator/identity", bad.clone()).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let shown = http.get("/emulator/identity").await.json();
    assert_eq!(shown["tokens"].as_array().unwrap().len(), 3);
}
