//! The control API under `/emulator/`: JSON endpoints with which operators,
//! the CLI and tests create events, inject faults, play scenarios and
//! inspect the emulator. Unlike the IMDS endpoints it needs no `Metadata`
//! header and is not rate-limited.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::emulator::{CURRENT_API_VERSION, Emulator};
use crate::error::EmulatorError;
use crate::event::{EmulatedSource, EmulatedStatus, EventSpec};
use crate::fault::Fault;
use crate::response;
use crate::scenario::{Action, Scenario};

pub(crate) fn routes() -> Router<Emulator> {
    Router::new()
        .route("/emulator/events", post(create_event))
        .route("/emulator/events/{id}", delete(cancel_event))
        .route("/emulator/events/{id}/start", post(start_event))
        .route("/emulator/events/{id}/complete", post(complete_event))
        .route("/emulator/faults", post(inject_fault).delete(clear_faults))
        .route("/emulator/config", post(configure))
        .route("/emulator/scenarios", get(list_scenarios))
        .route("/emulator/scenarios/{name}", post(play_scenario))
        .route("/emulator/state", get(state))
        .route("/emulator/reset", post(reset))
}

/// A refused control request, answered as `{"error": message}`.
pub(crate) struct Refusal(StatusCode, String);

pub(crate) type Answer = Result<Response, Refusal>;

impl From<Refusal> for Response {
    fn from(Refusal(status, message): Refusal) -> Self {
        response::error(status, message)
    }
}

impl From<EmulatorError> for Refusal {
    fn from(error: EmulatorError) -> Self {
        let status = match error {
            EmulatorError::UnknownEvent(_) | EmulatorError::UnknownKey(_) => StatusCode::NOT_FOUND,
            EmulatorError::AlreadyStarted(_) => StatusCode::CONFLICT,
            EmulatorError::InvalidSpec(_) => StatusCode::BAD_REQUEST,
        };
        Refusal(status, error.to_string())
    }
}

pub(crate) fn bad_request(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message.into())
}

pub(crate) fn answer(result: Answer) -> Response {
    result.unwrap_or_else(Response::from)
}

/// Parses a JSON body; an empty body counts as `{}` where `empty_ok`.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8], empty_ok: bool) -> Result<T, Refusal> {
    let body = if empty_ok && body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|error| bad_request(format!("invalid request body: {error}")))
}

/// Seconds from JSON as a duration, refusing negative or absurd values.
pub(crate) fn seconds(field: &str, secs: f64) -> Result<Duration, Refusal> {
    if !(0.0..=366.0 * 24.0 * 3600.0).contains(&secs) {
        return Err(bad_request(format!(
            "{field} must be between 0 and one year"
        )));
    }
    Duration::try_from_secs_f64(secs).map_err(|error| bad_request(format!("{field}: {error}")))
}

/// The real service lets a Terminate notice be configured from 5 to 15 min.
fn check_terminate_notice(notice: Duration) -> Result<(), Refusal> {
    if (300..=900).contains(&notice.as_secs()) && notice.subsec_nanos() == 0 {
        Ok(())
    } else {
        Err(bad_request(
            "a Terminate notice must be between 300 and 900 seconds (5 to 15 minutes)",
        ))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEvent {
    event_type: String,
    event_id: Option<String>,
    resources: Option<Vec<String>>,
    notice_secs: Option<f64>,
    status: Option<EmulatedStatus>,
    source: Option<EmulatedSource>,
    duration_secs: Option<i64>,
    description: Option<String>,
    complete_after_secs: Option<f64>,
}

impl NewEvent {
    fn into_spec(self) -> Result<EventSpec, Refusal> {
        let mut spec = EventSpec::new(self.event_type);
        if let Some(id) = self.event_id {
            spec = spec.id(id);
        }
        if let Some(resources) = self.resources {
            spec = spec.resources(resources);
        }
        if let Some(notice) = self.notice_secs {
            spec = spec.notice(seconds("notice_secs", notice)?);
        }
        if self.status == Some(EmulatedStatus::Started) {
            spec = spec.started();
        } else if spec.event_type() == "Terminate" {
            check_terminate_notice(spec.resolved_notice())?;
        }
        if self.source == Some(EmulatedSource::User) {
            spec = spec.source_user();
        }
        if let Some(duration) = self.duration_secs {
            spec = spec.duration_secs(duration);
        }
        if let Some(description) = self.description {
            spec = spec.description(description);
        }
        if let Some(after) = self.complete_after_secs {
            spec = spec.complete_after(seconds("complete_after_secs", after)?);
        }
        Ok(spec)
    }
}

async fn create_event(State(emulator): State<Emulator>, body: Bytes) -> Response {
    answer((|| {
        let spec = parse::<NewEvent>(&body, false)?.into_spec()?;
        let scheduled = emulator.schedule(spec)?;
        Ok(response::json(
            StatusCode::CREATED,
            &serde_json::json!({"incarnation": scheduled.incarnation, "event": scheduled.wire}),
        ))
    })())
}

/// The answer to a successful change of one event.
fn changed(emulator: &Emulator) -> Response {
    response::json(
        StatusCode::OK,
        &serde_json::json!({"incarnation": emulator.incarnation()}),
    )
}

/// The answer to a change of one event: the new incarnation, or why it
/// was refused.
fn changed_by(emulator: &Emulator, change: Result<(), EmulatorError>) -> Response {
    answer(change.map(|()| changed(emulator)).map_err(Refusal::from))
}

async fn start_event(State(emulator): State<Emulator>, Path(id): Path<String>) -> Response {
    changed_by(&emulator, emulator.start_event(&id))
}

async fn complete_event(State(emulator): State<Emulator>, Path(id): Path<String>) -> Response {
    changed_by(&emulator, emulator.complete_event(&id))
}

async fn cancel_event(State(emulator): State<Emulator>, Path(id): Path<String>) -> Response {
    changed_by(&emulator, emulator.cancel_event(&id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewFault {
    kind: String,
    status: Option<u16>,
    millis: Option<u64>,
    count: Option<u32>,
}

impl NewFault {
    fn into_fault(self) -> Result<(Fault, u32), Refusal> {
        let fault = match self.kind.as_str() {
            "status" => {
                let status = self
                    .status
                    .ok_or_else(|| bad_request("a status fault needs \"status\""))?;
                Fault::Status(
                    StatusCode::from_u16(status)
                        .map_err(|_| bad_request(format!("{status} is not an HTTP status")))?,
                )
            }
            "malformed" => Fault::Malformed,
            "drop" => Fault::Drop,
            "delay" => Fault::Delay(Duration::from_millis(
                self.millis
                    .ok_or_else(|| bad_request("a delay fault needs \"millis\""))?,
            )),
            other => {
                return Err(bad_request(format!(
                    "unknown fault kind {other:?}; use status, malformed, drop or delay"
                )));
            }
        };
        Ok((fault, self.count.unwrap_or(1)))
    }
}

async fn inject_fault(State(emulator): State<Emulator>, body: Bytes) -> Response {
    answer((|| {
        let (fault, count) = parse::<NewFault>(&body, false)?.into_fault()?;
        emulator.inject_faults(fault, count);
        Ok(pending_faults(&emulator))
    })())
}

async fn clear_faults(State(emulator): State<Emulator>) -> Response {
    emulator.clear_faults();
    pending_faults(&emulator)
}

fn pending_faults(emulator: &Emulator) -> Response {
    let pending = emulator.with_state(|state| state.faults.to_json());
    response::json(
        StatusCode::OK,
        &serde_json::json!({"pending_faults": pending}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigChange {
    first_call_delay_ms: Option<u64>,
    /// Absent: unchanged; `null`: no limit.
    #[serde(default, deserialize_with = "present")]
    rate_limit_per_sec: Option<Option<u32>>,
    /// `/metadata/instance` answers 404 with an HTML page.
    instance_metadata_missing: Option<bool>,
}

/// Tells a present `null` (`Some(None)`) from an absent field (`None`).
pub(crate) fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

async fn configure(State(emulator): State<Emulator>, body: Bytes) -> Response {
    answer((|| {
        let change = parse::<ConfigChange>(&body, false)?;
        if change.rate_limit_per_sec == Some(Some(0)) {
            return Err(bad_request(
                "rate_limit_per_sec must be at least 1; use null to disable the limit",
            ));
        }
        if let Some(limit) = change.rate_limit_per_sec {
            emulator.set_rate_limit(limit);
        }
        if let Some(millis) = change.first_call_delay_ms {
            emulator.set_first_call_delay(Duration::from_millis(millis));
        }
        if let Some(missing) = change.instance_metadata_missing {
            emulator.set_instance_metadata_missing(missing);
        }
        Ok(config_json(&emulator))
    })())
}

fn config_json(emulator: &Emulator) -> Response {
    let config = emulator.config();
    response::json(
        StatusCode::OK,
        &serde_json::json!({
            "vm_name": config.vm_name,
            "scale_set_name": config.scale_set_name,
            "rate_limit_per_sec": config.rate_limit_per_sec,
            "first_call_delay_ms": u64::try_from(config.first_call_delay.as_millis()).unwrap_or(u64::MAX),
            "instance_metadata_missing": emulator.instance_metadata_missing(),
        }),
    )
}

async fn list_scenarios(State(emulator): State<Emulator>) -> Response {
    let scenarios: Vec<_> = Scenario::builtins(&emulator.config())
        .iter()
        .map(Scenario::to_json)
        .collect();
    response::json(StatusCode::OK, &serde_json::json!({"scenarios": scenarios}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Play {
    speed: Option<f64>,
    notice_secs: Option<f64>,
}

async fn play_scenario(
    State(emulator): State<Emulator>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    answer((|| {
        let play = parse::<Play>(&body, true)?;
        let mut scenario = Scenario::builtin(&name, &emulator.config()).ok_or_else(|| {
            Refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "no scenario {name:?}; known: {}",
                    Scenario::BUILTIN.join(", ")
                ),
            )
        })?;
        let speed = play.speed.unwrap_or(1.0);
        if !(speed.is_finite() && (0.001..=1_000_000.0).contains(&speed)) {
            return Err(bad_request("speed must be between 0.001 and 1000000"));
        }
        if let Some(notice) = play.notice_secs {
            let notice = seconds("notice_secs", notice)?;
            let schedules_terminate = scenario.steps.iter().any(|step| {
                matches!(&step.action, Action::Schedule { spec, .. } if spec.event_type() == "Terminate")
            });
            if schedules_terminate {
                check_terminate_notice(notice)?;
            }
            scenario = scenario.with_notice(notice);
        }
        let listing = scenario.to_json();
        // Detached: the player stops by itself or on reset.
        drop(emulator.play(scenario, speed));
        Ok(response::json(
            StatusCode::ACCEPTED,
            &serde_json::json!({"scenario": listing, "speed": speed}),
        ))
    })())
}

async fn state(State(emulator): State<Emulator>) -> Response {
    let state = emulator.with_state(|state| {
        serde_json::json!({
            "incarnation": state.incarnation(),
            "events": state.wire_events(CURRENT_API_VERSION),
            "approvals": state.approvals.iter().map(|a| a.to_json()).collect::<Vec<_>>(),
            "stats": state.stats,
            "pending_faults": state.faults.to_json(),
        })
    });
    response::json(StatusCode::OK, &state)
}

async fn reset(State(emulator): State<Emulator>) -> Response {
    emulator.reset();
    changed(&emulator)
}
