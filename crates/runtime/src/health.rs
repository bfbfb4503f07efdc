//! Liveness and readiness over HTTP, for the scale set's Application Health
//! extension and for operators.
//!
//! `GET /healthz` answers 200 while the process can answer at all.
//! `GET /readyz` answers 200 only when every warmup gate has passed and no
//! shutdown has begun, 503 otherwise; both carry a JSON body saying which
//! gates passed, so a failing probe explains itself.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where one warmup gate stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum Gate {
    /// Not checked yet.
    Pending,
    /// Being checked; the detail says what failed last, if anything.
    Waiting(String),
    /// Passed.
    Passed,
    /// Not used by this worker.
    Skipped,
}

impl Gate {
    fn is_open(&self) -> bool {
        matches!(self, Gate::Passed | Gate::Skipped)
    }
}

/// The worker's readiness, as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// Scheduled Events watcher: identified this VM and polled successfully.
    pub imds: Gate,
    /// Queues and checkpoint container reachable and writable.
    pub storage: Gate,
    /// The application's own warmup.
    pub warmup: Gate,
    /// Why the worker is shutting down, once it is.
    pub shutting_down: Option<String>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            imds: Gate::Pending,
            storage: Gate::Pending,
            warmup: Gate::Pending,
            shutting_down: None,
        }
    }
}

impl Readiness {
    /// Whether the worker may take work: every gate open, no shutdown.
    pub fn is_ready(&self) -> bool {
        self.gates_open() && self.shutting_down.is_none()
    }

    /// Whether every gate is open.
    pub fn gates_open(&self) -> bool {
        self.imds.is_open() && self.storage.is_open() && self.warmup.is_open()
    }

    /// The gates not yet open, by name.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        [
            ("imds", &self.imds),
            ("storage", &self.storage),
            ("warmup", &self.warmup),
        ]
        .into_iter()
        .filter(|(_, gate)| !gate.is_open())
        .map(|(name, _)| name)
        .collect()
    }
}

#[derive(Serialize)]
struct ReadinessBody<'a> {
    ready: bool,
    #[serde(flatten)]
    readiness: &'a Readiness,
}

/// Serves `/healthz` and `/readyz` on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    readiness: watch::Receiver<Readiness>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"alive": true})) }),
        )
        .route("/readyz", get(ready))
        .with_state(readiness);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

async fn ready(State(readiness): State<watch::Receiver<Readiness>>) -> Response {
    let readiness = readiness.borrow().clone();
    let ready = readiness.is_ready();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = ReadinessBody {
        ready,
        readiness: &readiness,
    };
    (
        status,
        axum::Json(serde_json::to_value(&body).unwrap_or_default()),
    )
        .into_response()
}

/// Binds the health endpoint's address.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_gate_is_open_and_not_stopping() {
        let mut r = Readiness::default();
        assert!(!r.is_ready());
        assert_eq!(r.waiting_for(), ["imds", "storage", "warmup"]);
        r.imds = Gate::Skipped;
        r.storage = Gate::Passed;
        r.warmup = Gate::Waiting("cache cold".into());
        assert_eq!(r.waiting_for(), ["warmup"]);
        r.warmup = Gate::Passed;
        assert!(r.is_ready());
        r.shutting_down = Some("Preempt".into());
        assert!(!r.is_ready());
    }

    #[test]
    fn serializes_gates_with_their_detail() {
        let r = Readiness {
            imds: Gate::Waiting("IMDS request timed out".into()),
            ..Readiness::default()
        };
        let body = serde_json::to_value(ReadinessBody {
            ready: false,
            readiness: &r,
        })
        .unwrap();
        assert_eq!(body["ready"], false);
        assert_eq!(body["imds"]["state"], "waiting");
        assert_eq!(body["imds"]["detail"], "IMDS request timed out");
        assert_eq!(body["storage"]["state"], "pending");
        assert_eq!(body["shutting_down"], serde_json::Value::Null);
    }
}
