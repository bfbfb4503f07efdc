//! A telemetry collector for tests: OTLP/HTTP (`/v1/traces`, `/v1/metrics`,
//! protobuf) and Application Insights (`/v2/track`, JSON, gzip or not) on
//! 127.0.0.1, decoding everything it receives so a test can wait for what
//! it expects.
//!
//! It runs on a thread and runtime of its own: dropping a `Telemetry` makes a
//! blocking final export on the caller's thread, which a collector sharing
//! that (possibly only) runtime thread could not answer.

use std::io::Read as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long [`Collector::wait_for`] waits: generous, for a loaded machine.
pub const WAIT: Duration = Duration::from_secs(15);

/// Everything the collector decoded, in arrival order.
#[derive(Default)]
pub struct Received {
    /// OTLP trace exports.
    pub traces: Vec<ExportTraceServiceRequest>,
    /// OTLP metric exports.
    pub metrics: Vec<ExportMetricsServiceRequest>,
    /// (path, decoded JSON body) of each Application Insights post.
    pub app_insights: Vec<(String, serde_json::Value)>,
    /// Requests it could not decode or did not expect; any fails the wait.
    pub bad_requests: Vec<String>,
}

impl Received {
    /// Every span of every trace export.
    pub fn spans(&self) -> impl Iterator<Item = &Span> {
        self.traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
    }

    /// Every metric of every export, in arrival order.
    pub fn all_metrics(&self) -> Vec<&Metric> {
        self.metrics
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .collect()
    }
}

/// The collector's shared state; clones see the same data.
#[derive(Clone, Default)]
pub struct Collector {
    received: Arc<Mutex<Received>>,
    changed: Arc<Notify>,
}

/// A running collector: its base URL; dropping it stops the server.
pub struct RunningCollector {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    _stop: DropGuard,
}

impl Collector {
    /// Starts serving on a free loopback port, on a thread of its own.
    ///
    /// # Panics
    /// If no loopback port can be bound (a test-environment failure).
    pub fn start(&self) -> RunningCollector {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .route("/v2/track", post(track))
            .fallback(unexpected)
            .with_state(self.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        std::thread::Builder::new()
            .name("otlp-collector".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the collector");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("a tokio listener for the collector");
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await;
                });
            })
            .expect("a thread for the collector");
        RunningCollector {
            url,
            _stop: stop.drop_guard(),
        }
    }

    /// What has arrived so far.
    pub fn received(&self) -> MutexGuard<'_, Received> {
        // Nothing panics while holding the lock: the data stays consistent.
        self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, update: impl FnOnce(&mut Received)) {
        update(&mut self.received());
        self.changed.notify_waiters();
    }

    /// Waits (at most [`WAIT`]) until `check` finds what it looks for,
    /// re-checking on every request rather than on a timer.
    ///
    /// # Panics
    /// On timeout, or if the collector rejected a request.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&Received) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            // Registered before checking, so a request landing in between
            // still wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let received = self.received();
                let bad = &received.bad_requests;
                assert!(bad.is_empty(), "the collector rejected requests: {bad:?}");
                if let Some(found) = check(&received) {
                    return found;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out after {WAIT:?} waiting for {what}");
            }
        }
    }
}

async fn traces(State(collector): State<Collector>, body: Bytes) -> StatusCode {
    decode(&collector, body, |r, request| r.traces.push(request))
}

async fn metrics(State(collector): State<Collector>, body: Bytes) -> StatusCode {
    decode(&collector, body, |r, request| r.metrics.push(request))
}

/// Decodes an OTLP protobuf body; anything undecodable fails the test.
fn decode<M: prost::Message + Default>(
    collector: &Collector,
    body: Bytes,
    store: impl FnOnce(&mut Received, M),
) -> StatusCode {
    match M::decode(body) {
        Ok(request) => {
            collector.record(|r| store(r, request));
            StatusCode::OK
        }
        Err(error) => {
            let problem = format!("undecodable OTLP body: {error}");
            collector.record(|r| r.bad_requests.push(problem));
            StatusCode::BAD_REQUEST
        }
    }
}

/// Application Insights' track endpoint: a JSON array, gzipped or not,
/// answered as the service does.
async fn track(
    State(collector): State<Collector>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let gzip = headers
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes() == b"gzip");
    let mut json = Vec::new();
    let decoded = if gzip {
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut json)
            .map(drop)
            .map_err(|e| e.to_string())
    } else {
        json.extend_from_slice(&body);
        Ok(())
    };
    let parsed = decoded.and_then(|()| {
        serde_json::from_slice::<serde_json::Value>(&json).map_err(|e| e.to_string())
    });
    match parsed {
        Ok(value) => {
            let items = value.as_array().map_or(1, Vec::len);
            collector.record(|r| r.app_insights.push((uri.path().to_owned(), value)));
            (
                StatusCode::OK,
                format!(r#"{{"itemsReceived":{items},"itemsAccepted":{items},"errors":[]}}"#),
            )
        }
        Err(error) => {
            let problem = format!("bad App Insights body: {error}");
            collector.record(|r| r.bad_requests.push(problem));
            (StatusCode::BAD_REQUEST, String::new())
        }
    }
}

async fn unexpected(State(collector): State<Collector>, uri: Uri) -> StatusCode {
    collector.record(|r| r.bad_requests.push(format!("unexpected path {uri}")));
    StatusCode::NOT_FOUND
}

/// The value of attribute `key`, if present.
pub fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    let kv = attributes.iter().find(|kv| kv.key == key)?;
    kv.value.as_ref()?.value.as_ref()
}

/// The string value of attribute `key`, if present and a string.
pub fn string_attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attribute(attributes, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The integer value of attribute `key`, if present and an integer.
pub fn int_attribute(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}
