//! The emulated IMDS endpoints: Scheduled Events (GET and the approval
//! POST) and instance metadata, with the real service's request checks,
//! rate limit and error bodies, plus the injected faults.

use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{FromRequestParts, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Router, extract::ConnectInfo};
use serde::Deserialize;

use crate::config::EmulatorConfig;
use crate::emulator::Emulator;
use crate::fault::Fault;
use crate::killable::KillSwitch;
use crate::response;
use crate::state::{State as EmulatorState, Stats};

/// The Scheduled Events api-versions the real service accepts.
pub const SCHEDULED_EVENTS_API_VERSIONS: &[&str] = &[
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
];
const SCHEDULED_EVENTS_NEWEST: &[&str] = &["2020-07-01", "2019-08-01", "2019-04-01"];

/// The instance metadata api-versions the emulator accepts.
pub const INSTANCE_API_VERSIONS: &[&str] = &[
    "2017-04-02",
    "2017-08-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
];
const INSTANCE_NEWEST: &[&str] = &["2023-07-01", "2021-12-13", "2021-11-15"];

pub(crate) fn routes() -> Router<Emulator> {
    Router::new()
        .route(
            "/metadata/scheduledevents",
            get(get_scheduled_events).post(post_scheduled_events),
        )
        .route("/metadata/instance", get(get_instance))
}

/// One IMDS endpoint's accepted versions and request counter.
struct Endpoint {
    versions: &'static [&'static str],
    newest: &'static [&'static str],
    count: fn(&mut Stats),
}

const SCHEDULED_EVENTS_GET: Endpoint = Endpoint {
    versions: SCHEDULED_EVENTS_API_VERSIONS,
    newest: SCHEDULED_EVENTS_NEWEST,
    count: |stats| stats.scheduledevents_gets += 1,
};
const SCHEDULED_EVENTS_POST: Endpoint = Endpoint {
    versions: SCHEDULED_EVENTS_API_VERSIONS,
    newest: SCHEDULED_EVENTS_NEWEST,
    count: |stats| stats.posts += 1,
};
const INSTANCE_GET: Endpoint = Endpoint {
    versions: INSTANCE_API_VERSIONS,
    newest: INSTANCE_NEWEST,
    count: |stats| stats.instance_gets += 1,
};

/// The rate limit's answer, shared with the unknown-path fallback.
pub(crate) fn throttled() -> Response {
    response::error(StatusCode::TOO_MANY_REQUESTS, "Too many requests")
}

/// Why an IMDS request is not answered normally.
enum Refusal {
    /// Over the rate limit: 429.
    Throttled,
    /// Failed the request checks: 400 with this body.
    BadRequest(serde_json::Value),
}

impl Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Throttled => throttled(),
            Refusal::BadRequest(body) => response::json(StatusCode::BAD_REQUEST, &body),
        }
    }
}

/// Applies the rate limit and the real service's request checks; returns
/// the request's api-version.
fn admit(
    emulator: &Emulator,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<&'static str, Refusal> {
    emulator.with_state(|state| {
        if !state.admit(Instant::now()) {
            return Err(Refusal::Throttled);
        }
        (endpoint.count)(&mut state.stats);
        check_request(endpoint, headers, query).map_err(|body| {
            state.stats.bad_requests += 1;
            Refusal::BadRequest(body)
        })
    })
}

/// The real service's checks; the error is the 400 body.
fn check_request(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<&'static str, serde_json::Value> {
    // IMDS refuses anything that went through a proxy.
    if headers.contains_key("x-forwarded-for") {
        return Err(serde_json::json!({
            "error": "Bad request. Requests with an X-Forwarded-For header are not allowed",
        }));
    }
    let metadata = headers
        .get("metadata")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
    if !metadata {
        return Err(serde_json::json!({
            "error": "Bad request. Required metadata header not specified",
        }));
    }
    let requested = query.and_then(|query| {
        query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(key, _)| *key == "api-version")
            .map(|(_, value)| value)
    });
    let version_error =
        |message: &str| serde_json::json!({"error": message, "newest-versions": endpoint.newest});
    match requested {
        None | Some("") => Err(version_error(
            "Bad request. api-version was not specified in the request. \
             For more information refer to aka.ms/azureimds",
        )),
        Some(requested) => endpoint
            .versions
            .iter()
            .find(|version| **version == requested)
            .copied()
            .ok_or_else(|| {
                version_error(
                    "Bad request. api-version is invalid or was not specified in the request. \
                     For more information refer to aka.ms/azureimds",
                )
            }),
    }
}

/// The connection's kill switch, if it is served by the emulator's listener.
pub(crate) struct Connection(Option<KillSwitch>);

impl<S: Send + Sync> FromRequestParts<S> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<KillSwitch>>()
                .map(|info| info.0.clone()),
        ))
    }
}

async fn get_scheduled_events(
    State(emulator): State<Emulator>,
    connection: Connection,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let version = match admit(&emulator, &SCHEDULED_EVENTS_GET, &headers, query.as_deref()) {
        Ok(version) => version,
        Err(refusal) => return refusal.into_response(),
    };
    let (first_call_delay, fault) = emulator.with_state(|state| {
        let delay = if std::mem::take(&mut state.first_get_pending) {
            state.config.first_call_delay
        } else {
            Duration::ZERO
        };
        let fault = state.faults.next();
        if fault.is_some() {
            state.stats.faults_served += 1;
        }
        (delay, fault)
    });
    if !first_call_delay.is_zero() {
        tokio::time::sleep(first_call_delay).await;
    }
    match fault {
        None => {}
        Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
        Some(Fault::Status(status)) => {
            return response::error(
                status,
                status.canonical_reason().unwrap_or("Injected failure"),
            );
        }
        Some(Fault::Malformed) => {
            let document = emulator.with_state(|state| state.document_string(version));
            // Cut in half: never valid JSON, since the closing brace is gone.
            let mut bytes = document.into_bytes();
            bytes.truncate(bytes.len() / 2);
            return response::json_body(StatusCode::OK, bytes);
        }
        Some(Fault::Drop) => {
            return match connection.0 {
                Some(switch) => {
                    switch.kill();
                    // Never sent: the connection fails before hyper can write.
                    response::error(StatusCode::INTERNAL_SERVER_ERROR, "dropped")
                }
                None => response::error(
                    StatusCode::BAD_GATEWAY,
                    "the drop fault needs the emulator's own server",
                ),
            };
        }
    }
    let document = emulator.with_state(|state| state.document_string(version));
    response::json_body(StatusCode::OK, document)
}

#[derive(Deserialize)]
struct StartRequests {
    #[serde(rename = "StartRequests")]
    start_requests: Vec<StartRequest>,
}

#[derive(Deserialize)]
struct StartRequest {
    #[serde(rename = "EventId")]
    event_id: String,
}

async fn post_scheduled_events(
    State(emulator): State<Emulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let version = match admit(
        &emulator,
        &SCHEDULED_EVENTS_POST,
        &headers,
        query.as_deref(),
    ) {
        Ok(version) => version,
        Err(refusal) => return refusal.into_response(),
    };
    // Parsed by hand: clients such as `curl -d` send a form content type.
    let ids: Vec<String> = match serde_json::from_slice::<StartRequests>(&body) {
        Ok(requests) => requests
            .start_requests
            .into_iter()
            .map(|request| request.event_id)
            .collect(),
        Err(error) => {
            emulator.with_state(|state| state.stats.bad_requests += 1);
            return response::error(
                StatusCode::BAD_REQUEST,
                format!(
                    "Bad request. The request body is not a valid StartRequests document: {error}"
                ),
            );
        }
    };
    emulator.with_state(
        |state| match state.approve(&ids, version, SystemTime::now()) {
            Ok(()) => response::json_body(StatusCode::OK, ""),
            Err(unknown) => {
                state.stats.bad_requests += 1;
                response::error(
                    StatusCode::BAD_REQUEST,
                    format!("Bad request. EventId {unknown} is not a current scheduled event"),
                )
            }
        },
    )
}

async fn get_instance(
    State(emulator): State<Emulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(refusal) = admit(&emulator, &INSTANCE_GET, &headers, query.as_deref()) {
        return refusal.into_response();
    }
    let document =
        emulator.with_state(|state| (!state.instance_missing).then(|| instance_document(state)));
    match document {
        Some(document) => response::json(StatusCode::OK, &document),
        None => response::html(StatusCode::NOT_FOUND, NOT_FOUND_PAGE),
    }
}

/// A web framework's stock 404 page (Flask's), as a server without
/// `/metadata/instance` answers: several lines, longer than any excerpt.
const NOT_FOUND_PAGE: &str = "<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n\
<h1>Not Found</h1>\n<p>The requested URL was not found on the server. If you entered the URL \
manually please check your spelling and try again.</p>\n";

/// The instance metadata of the emulated Spot VM.
fn instance_document(state: &EmulatorState) -> serde_json::Value {
    let config: &EmulatorConfig = &state.config;
    serde_json::json!({
        "compute": {
            "azEnvironment": "AzurePublicCloud",
            "evictionPolicy": "Delete",
            "isHostCompatibilityLayerVm": "false",
            "licenseType": "",
            "location": config.location,
            "name": config.vm_name,
            "offer": "ubuntu-24_04-lts",
            "osType": "Linux",
            "placementGroupId": "",
            "platformFaultDomain": "0",
            "platformUpdateDomain": "0",
            "priority": "Spot",
            "provider": "Microsoft.Compute",
            "publisher": "canonical",
            "resourceGroupName": config.resource_group,
            "resourceId": config.resource_id(),
            "sku": "server",
            "subscriptionId": config.subscription_id,
            "tags": "",
            "version": "24.04.202501010",
            "vmId": state.vm_id,
            "vmScaleSetName": config.scale_set_name.clone().unwrap_or_default(),
            "vmSize": config.vm_size,
            "zone": "",
        },
        "network": {
            "interface": [],
        },
    })
}
