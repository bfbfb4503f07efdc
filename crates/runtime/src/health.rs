//! Liveness and readiness over HTTP, for the scale set's Application Health
//! extension and for operators.
//!
//! `GET /healthz` answers 200 while the process can answer at all.
//! `GET /readyz` answers 200 only when every warmup gate has passed and no
//! shutdown has begun, 503 otherwise; both carry a JSON body saying which
//! gates passed, so a failing probe explains itself, and the conditions
//! that leave the worker ready but need an operator (`degraded`: a VM
//! whose scale-in protection cannot be released, a pod whose deletion cost
//! cannot be written), which do not make it unready since it still works.
//!
//! Nothing here may keep a drained process alive: a client gets
//! [`HEADER_READ_TIMEOUT`] to send its request headers, and once stopped the
//! server gives open connections [`SHUTDOWN_GRACE`] and then drops them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request's headers: a probe sends
/// them at once; a client that sends half a request is cut off.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long open connections may finish once the server is stopped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

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
    /// Conditions that do not stop the worker from working (it stays
    /// ready) but will not clear by themselves, by what they concern
    /// ([`DEGRADED_SCALE_IN_PROTECTION`], [`DEGRADED_POD_DELETION_COST`]),
    /// each with its reason. Absent from `/readyz` while there are none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub degraded: BTreeMap<&'static str, String>,
}

/// The `degraded` key of a VM whose scale-in protection should be released
/// but cannot be.
pub const DEGRADED_SCALE_IN_PROTECTION: &str = "scale_in_protection";
/// The `degraded` key of a pod whose deletion cost cannot be written.
pub const DEGRADED_POD_DELETION_COST: &str = "pod_deletion_cost";

/// Sets (`Some`) or clears (`None`) the `degraded` reason `key` in
/// `readiness`, telling its watchers only when it changed.
pub fn set_degraded(
    readiness: &watch::Sender<Readiness>,
    key: &'static str,
    reason: Option<String>,
) {
    readiness.send_if_modified(|r| match reason {
        Some(reason) => r.degraded.insert(key, reason.clone()).as_ref() != Some(&reason),
        None => r.degraded.remove(key).is_some(),
    });
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            imds: Gate::Pending,
            storage: Gate::Pending,
            warmup: Gate::Pending,
            shutting_down: None,
            degraded: BTreeMap::new(),
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

/// Serves `/healthz` and `/readyz` on `listener` until `stop` is cancelled,
/// then returns within [`SHUTDOWN_GRACE`] whatever its clients do.
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
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: wait a little, keep serving.
                tracing::warn!(%error, "health endpoint: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let stop = stop.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    let finished = async { while connections.join_next().await.is_some() {} };
    // Whatever is still open after the grace is dropped with the set.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, finished).await;
    Ok(())
}

/// Stops the server started on `task` and waits for it, at most a little
/// longer than [`SHUTDOWN_GRACE`].
pub(crate) async fn stop(task: JoinHandle<()>, stop: &CancellationToken) {
    stop.cancel();
    let abort = task.abort_handle();
    if tokio::time::timeout(SHUTDOWN_GRACE * 2, task)
        .await
        .is_err()
    {
        tracing::warn!("the health endpoint did not stop in time; dropping it");
        abort.abort();
    }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::Instant;

    /// Reads until the server closes the connection.
    async fn until_closed(client: &mut TcpStream) {
        let mut buf = [0u8; 1024];
        while let Ok(n) = client.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    }

    #[tokio::test]
    async fn half_sent_requests_are_cut_off_and_never_hold_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let readiness = watch::channel(Readiness::default()).1;
        let server = tokio::spawn(serve(listener, readiness, stop.clone()));

        // Half a request line, then silence: closed after the header timeout.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /readyz HT").await.unwrap();
        let sent = Instant::now();
        tokio::time::timeout(HEADER_READ_TIMEOUT * 6, until_closed(&mut slow))
            .await
            .expect("the server closes a connection that never finishes its headers");
        assert!(sent.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_millis(500));

        // Stopping returns within the grace, whatever is still open.
        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"GET /he").await.unwrap();
        let stopping = Instant::now();
        stop.cancel();
        tokio::time::timeout(SHUTDOWN_GRACE * 10, server)
            .await
            .expect("the server stops despite an open connection")
            .unwrap()
            .unwrap();
        assert!(
            stopping.elapsed() < SHUTDOWN_GRACE * 3,
            "{:?}",
            stopping.elapsed()
        );
    }

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
        assert_eq!(body.get("degraded"), None, "absent while there is none");
    }

    #[test]
    fn a_degraded_reason_is_shown_but_leaves_the_worker_ready() {
        let (readiness, mut watcher) = watch::channel(Readiness {
            imds: Gate::Passed,
            storage: Gate::Passed,
            warmup: Gate::Skipped,
            ..Readiness::default()
        });
        watcher.mark_unchanged();
        set_degraded(
            &readiness,
            DEGRADED_SCALE_IN_PROTECTION,
            Some("release failing".into()),
        );
        assert!(watcher.has_changed().unwrap());
        watcher.mark_unchanged();
        set_degraded(
            &readiness,
            DEGRADED_SCALE_IN_PROTECTION,
            Some("release failing".into()),
        );
        assert!(!watcher.has_changed().unwrap(), "the same reason again");
        let r = readiness.borrow().clone();
        assert!(r.is_ready(), "degraded is still ready");
        let body = serde_json::to_value(ReadinessBody {
            ready: r.is_ready(),
            readiness: &r,
        })
        .unwrap();
        assert_eq!(body["degraded"]["scale_in_protection"], "release failing");
        set_degraded(&readiness, DEGRADED_SCALE_IN_PROTECTION, None);
        assert!(watcher.has_changed().unwrap());
        assert!(readiness.borrow().degraded.is_empty());
    }
}
