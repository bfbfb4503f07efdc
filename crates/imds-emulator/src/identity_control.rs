//! The control API of the managed-identity endpoint: `GET /emulator/identity`
//! shows the VM's identities, token settings and the tokens issued so far;
//! `POST /emulator/identity` changes them (to assign identities, issue
//! short-lived tokens that test refresh, or tokens storage must refuse).

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;

use crate::control::{answer, bad_request, parse, present, seconds};
use crate::emulator::Emulator;
use crate::response;

pub(crate) fn routes() -> Router<Emulator> {
    Router::new().route("/emulator/identity", get(show).post(change))
}

/// A change of the identity settings; absent fields stay as they are.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityChange {
    client_ids: Option<Vec<String>>,
    tenant_id: Option<String>,
    token_lifetime_secs: Option<f64>,
    /// `null`: back to the tenant's issuer.
    #[serde(default, deserialize_with = "present")]
    issuer: Option<Option<String>>,
    /// `null`: back to the resource asked for.
    #[serde(default, deserialize_with = "present")]
    audience: Option<Option<String>>,
}

async fn change(State(emulator): State<Emulator>, body: Bytes) -> Response {
    answer((|| {
        let change = parse::<IdentityChange>(&body, false)?;
        let mut identity = emulator.config().identity;
        if let Some(client_ids) = change.client_ids {
            identity.client_ids = client_ids;
        }
        if let Some(tenant_id) = change.tenant_id {
            identity.tenant_id = tenant_id;
        }
        if let Some(secs) = change.token_lifetime_secs {
            let lifetime = seconds("token_lifetime_secs", secs)?;
            if lifetime.as_secs() == 0 {
                return Err(bad_request("token_lifetime_secs must be at least 1"));
            }
            identity.token_lifetime = lifetime;
        }
        if let Some(issuer) = change.issuer {
            identity.issuer = issuer;
        }
        if let Some(audience) = change.audience {
            identity.audience = audience;
        }
        emulator.set_identity(identity);
        Ok(identity_json(&emulator))
    })())
}

async fn show(State(emulator): State<Emulator>) -> Response {
    identity_json(&emulator)
}

fn identity_json(emulator: &Emulator) -> Response {
    let identity = emulator.config().identity;
    response::json(
        StatusCode::OK,
        &serde_json::json!({
            "client_ids": identity.client_ids,
            "tenant_id": identity.tenant_id,
            "issuer": identity.issuer(),
            "audience": identity.audience,
            "token_lifetime_secs": identity.token_lifetime.as_secs(),
            "tokens": emulator.tokens(),
        }),
    )
}
