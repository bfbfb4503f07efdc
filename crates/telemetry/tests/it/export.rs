//! End-to-end export: real exporters posting over HTTP to receivers on
//! 127.0.0.1 that decode what arrives (OTLP protobuf, App Insights JSON).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::metrics::v1::{Metric, metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, span};
use spot_worker_telemetry::{
    CheckpointEstimates, CheckpointOutcome, LeaseOutcome, MessageOutcome, ProtectionState,
    StorageRefusal, Telemetry, TelemetryConfig, TelemetryError, message_span, names,
};
use spot_worker_testkit::otlp::{Collector, Received, WAIT, int_attribute, string_attribute};
use tokio::sync::Notify;
use tracing_subscriber::layer::SubscriberExt as _;

const IKEY: &str = "11111111-2222-3333-4444-555555555555";

fn find_span<'a>(received: &'a Received, name: &str) -> Option<&'a Span> {
    received.spans().find(|span| span.name == name)
}

/// Sum of a counter's points whose attributes include all of `matching`.
fn counter_value(metrics: &[&Metric], name: &str, matching: &[(&str, &str)]) -> Option<i64> {
    let metric = metrics.iter().rev().find(|m| m.name == name)?;
    let Some(metric::Data::Sum(sum)) = &metric.data else {
        panic!("{name} is not a sum: {:?}", metric.data);
    };
    Some(
        sum.data_points
            .iter()
            .filter(|p| {
                matching
                    .iter()
                    .all(|(k, v)| string_attribute(&p.attributes, k) == Some(v))
            })
            .map(|p| match p.value {
                Some(number_data_point::Value::AsInt(i)) => i,
                other => panic!("{name}: unexpected value {other:?}"),
            })
            .sum(),
    )
}

fn record_sample_telemetry(telemetry: &Telemetry) {
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    tracing::subscriber::with_default(subscriber, || {
        let span = message_span("orders", "msg-0001", 3);
        let _entered = span.enter();
        tracing::info!("handling the message");
    });
    let metrics = telemetry.metrics();
    metrics.handler_succeeded("orders", Duration::from_millis(250));
    metrics.handler_succeeded("orders", Duration::from_millis(750));
    metrics.message_settled("orders", MessageOutcome::Succeeded);
    metrics.message_settled("orders", MessageOutcome::Succeeded);
    metrics.message_failed("orders");
    metrics.message_settled("orders", MessageOutcome::Poisoned);
    metrics.message_settled("orders", MessageOutcome::Released);
    metrics.lease_renewed("orders", LeaseOutcome::Ok);
    metrics.lease_renewed("orders", LeaseOutcome::Lost);
    metrics.checkpoint_written(CheckpointOutcome::Conflict, Duration::from_millis(20));
    metrics.eviction_notice("Preempt");
    metrics.drained(Duration::from_secs(12));
    metrics.set_ready(true);
    metrics.set_storage_refused(Some(StorageRefusal::Refused));
    metrics.set_scale_in_protection(ProtectionState::ReleaseStuck);
    metrics.set_pod_deletion_cost_failing(true);
    metrics.observe_checkpoint_estimates(|| CheckpointEstimates {
        interval_seconds: 617.0,
        save_cost_seconds: Some(60.0),
        evictions_per_hour: 0.2,
        late_per_hour: 0.02,
        unsaved_per_hour: 0.01,
        no_outcome_per_hour: 0.004,
        losing_per_hour: 0.034,
    });
    metrics.observe_worker_time(|| ("regular", [12.0, 300.0, 45.0, 3.0]));
}

/// The points of the f64 gauge `name`, each with its `kind` attribute
/// (empty when it has none); `None` until it is exported.
fn f64_gauge(metrics: &[&Metric], name: &str) -> Option<Vec<(String, f64)>> {
    let metric = metrics.iter().rev().find(|m| m.name == name)?;
    let Some(metric::Data::Gauge(gauge)) = &metric.data else {
        panic!("{name} is not a gauge: {:?}", metric.data);
    };
    Some(
        gauge
            .data_points
            .iter()
            .map(|point| {
                let kind = point
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "kind")
                    .and_then(|kv| kv.value.as_ref())
                    .map(|value| format!("{:?}", value.value))
                    .unwrap_or_default();
                let value = match point.value {
                    Some(number_data_point::Value::AsDouble(value)) => value,
                    other => panic!("{name}: unexpected value {other:?}"),
                };
                (kind, value)
            })
            .collect(),
    )
}

#[tokio::test]
async fn otlp_receives_the_message_span_and_metrics() {
    let collector = Collector::default();
    let running = collector.start();
    let endpoint = running.url.clone();
    let config = TelemetryConfig::default()
        .with_service_name("telemetry-test")
        .with_resource_attribute("service.instance.id", "vm-7")
        .with_otlp_endpoint(format!("{endpoint}/"))
        // Only the flush should export: the test owns the timing.
        .with_metric_export_interval(Duration::from_secs(3600))
        .with_export_timeout(Duration::from_secs(5));
    let telemetry = Telemetry::build(&config).unwrap();
    assert!(telemetry.exports_otlp());
    record_sample_telemetry(&telemetry);

    telemetry.flush(WAIT).await.unwrap();

    let (span, resource_attributes) = collector
        .wait_for("the message span", |r| {
            let span = find_span(r, "process orders")?.clone();
            let resource = r
                .traces
                .iter()
                .flat_map(|t| &t.resource_spans)
                .find_map(|rs| {
                    rs.scope_spans
                        .iter()
                        .any(|ss| ss.spans.iter().any(|s| s.name == "process orders"))
                        .then(|| rs.resource.clone().unwrap_or_default().attributes)
                })?;
            Some((span, resource))
        })
        .await;
    assert_eq!(span.kind, span::SpanKind::Consumer as i32);
    let attrs = &span.attributes;
    assert_eq!(
        string_attribute(attrs, "messaging.system"),
        Some("azure_storage_queue")
    );
    assert_eq!(
        string_attribute(attrs, "messaging.operation.type"),
        Some("process")
    );
    assert_eq!(
        string_attribute(attrs, "messaging.operation.name"),
        Some("process")
    );
    assert_eq!(
        string_attribute(attrs, "messaging.destination.name"),
        Some("orders")
    );
    assert_eq!(
        string_attribute(attrs, "messaging.message.id"),
        Some("msg-0001")
    );
    assert_eq!(
        int_attribute(attrs, "messaging.azure_storage_queue.message.dequeue_count"),
        Some(3)
    );
    assert!(span.events.iter().any(|e| e.name == "handling the message"));
    assert_eq!(
        string_attribute(&resource_attributes, "service.name"),
        Some("telemetry-test")
    );
    assert_eq!(
        string_attribute(&resource_attributes, "service.instance.id"),
        Some("vm-7")
    );

    collector
        .wait_for("all metrics", |r| {
            let metrics = r.all_metrics();
            let queue = [("messaging.destination.name", "orders")];
            let outcome = |value| {
                let attributes = [queue[0], ("outcome", value)];
                counter_value(&metrics, names::MESSAGES_SETTLED, &attributes)
            };
            (outcome("succeeded")? == 2).then_some(())?;
            assert_eq!(
                counter_value(&metrics, names::MESSAGES_FAILED, &queue),
                Some(1)
            );
            assert_eq!(outcome("poisoned"), Some(1));
            assert_eq!(outcome("released"), Some(1));
            assert_eq!(
                counter_value(&metrics, names::LEASE_RENEWALS, &[("result", "lost")]),
                Some(1)
            );
            assert_eq!(
                counter_value(&metrics, names::LEASE_RENEWALS, &[("result", "ok")]),
                Some(1)
            );
            assert_eq!(
                counter_value(
                    &metrics,
                    names::CHECKPOINT_WRITES,
                    &[("result", "conflict")]
                ),
                Some(1)
            );
            assert_eq!(
                counter_value(
                    &metrics,
                    names::EVICTION_NOTICES,
                    &[("spot_worker.scheduled_event.type", "Preempt")]
                ),
                Some(1)
            );

            let histogram = |name: &str| {
                let metric = metrics.iter().find(|m| m.name == name).unwrap();
                assert_eq!(metric.unit, "s", "{name}");
                match &metric.data {
                    Some(metric::Data::Histogram(h)) => h.data_points.clone(),
                    other => panic!("{name} is not a histogram: {other:?}"),
                }
            };
            let process = histogram(names::MESSAGE_PROCESS_DURATION);
            assert_eq!(process.len(), 1);
            assert_eq!(process[0].count, 2);
            assert!((process[0].sum.unwrap() - 1.0).abs() < 1e-9);
            assert!(process[0].explicit_bounds.contains(&0.25));
            let drain = histogram(names::DRAIN_DURATION);
            assert_eq!((drain[0].count, drain[0].sum), (1, Some(12.0)));
            assert_eq!(histogram(names::CHECKPOINT_WRITE_DURATION)[0].count, 1);

            let ready = metrics.iter().find(|m| m.name == names::READY).unwrap();
            let Some(metric::Data::Gauge(gauge)) = &ready.data else {
                panic!("ready is not a gauge: {:?}", ready.data);
            };
            assert_eq!(
                gauge.data_points[0].value,
                Some(number_data_point::Value::AsInt(1))
            );

            // A paused intake shows by reason, the other reason at 0.
            let refused = metrics
                .iter()
                .find(|m| m.name == names::STORAGE_REFUSED)
                .unwrap();
            let Some(metric::Data::Gauge(gauge)) = &refused.data else {
                panic!("storage.refused is not a gauge: {:?}", refused.data);
            };
            let by_reason: Vec<(String, Option<number_data_point::Value>)> = gauge
                .data_points
                .iter()
                .map(|point| {
                    let reason = point
                        .attributes
                        .iter()
                        .find(|kv| kv.key == "reason")
                        .and_then(|kv| kv.value.as_ref())
                        .map(|value| format!("{:?}", value.value))
                        .unwrap_or_default();
                    (reason, point.value)
                })
                .collect();
            assert_eq!(by_reason.len(), 2, "{by_reason:?}");
            for (reason, value) in &by_reason {
                let expected = i64::from(reason.contains("\"refused\""));
                assert_eq!(
                    *value,
                    Some(number_data_point::Value::AsInt(expected)),
                    "{by_reason:?}"
                );
            }

            // A release that cannot clear shows as its state, the others
            // at 0; a failing deletion cost as 1.
            let protection = metrics
                .iter()
                .find(|m| m.name == names::SCALE_IN_PROTECTION)
                .unwrap();
            let Some(metric::Data::Gauge(gauge)) = &protection.data else {
                panic!("scale_in.protection is not a gauge: {:?}", protection.data);
            };
            let mut by_state: Vec<(String, Option<number_data_point::Value>)> = gauge
                .data_points
                .iter()
                .map(|point| {
                    let state = point
                        .attributes
                        .iter()
                        .find(|kv| kv.key == "state")
                        .and_then(|kv| kv.value.as_ref())
                        .map(|value| format!("{:?}", value.value))
                        .unwrap_or_default();
                    (state, point.value)
                })
                .collect();
            by_state.sort_by(|a, b| a.0.cmp(&b.0));
            let as_int = |v: i64| Some(number_data_point::Value::AsInt(v));
            assert_eq!(by_state.len(), 4, "{by_state:?}");
            for (state, value) in &by_state {
                let expected = i64::from(state.contains("\"release_stuck\""));
                assert_eq!(*value, as_int(expected), "{by_state:?}");
            }
            let failing = metrics
                .iter()
                .find(|m| m.name == names::POD_DELETION_COST_FAILING)
                .unwrap();
            let Some(metric::Data::Gauge(gauge)) = &failing.data else {
                panic!(
                    "pod_deletion_cost.failing is not a gauge: {:?}",
                    failing.data
                );
            };
            assert_eq!(gauge.data_points[0].value, as_int(1));

            // The checkpoint interval and what it rests on, read at export.
            let interval = f64_gauge(&metrics, names::CHECKPOINT_INTERVAL)?;
            assert_eq!(interval, [(String::new(), 617.0)]);
            let cost = f64_gauge(&metrics, names::CHECKPOINT_COST)?;
            assert_eq!(cost, [(String::new(), 60.0)]);
            let rates = f64_gauge(&metrics, names::INTERRUPTION_RATE)?;
            assert_eq!(rates.len(), 5, "{rates:?}");
            let losing = rates.iter().find(|(kind, _)| kind.contains("\"losing\""));
            assert_eq!(losing.map(|(_, rate)| *rate), Some(0.034), "{rates:?}");
            let unsaved = rates.iter().find(|(kind, _)| kind.contains("\"unsaved\""));
            assert_eq!(unsaved.map(|(_, rate)| *rate), Some(0.01), "{rates:?}");

            // This worker's paid time, by phase, in its lane.
            let worker_time = metrics
                .iter()
                .rev()
                .find(|m| m.name == names::WORKER_TIME)?;
            let Some(metric::Data::Sum(sum)) = &worker_time.data else {
                panic!("worker.time is not a sum: {:?}", worker_time.data);
            };
            let mut by_phase: Vec<(String, f64)> = sum
                .data_points
                .iter()
                .map(|point| {
                    assert_eq!(string_attribute(&point.attributes, "lane"), Some("regular"));
                    let phase = string_attribute(&point.attributes, "phase").unwrap_or_default();
                    let Some(number_data_point::Value::AsDouble(seconds)) = point.value else {
                        panic!("worker.time: {:?}", point.value);
                    };
                    (phase.to_owned(), seconds)
                })
                .collect();
            by_phase.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(
                by_phase,
                [
                    ("busy".to_owned(), 300.0),
                    ("draining".to_owned(), 3.0),
                    ("idle".to_owned(), 45.0),
                    ("starting".to_owned(), 12.0)
                ]
            );

            // Bounded cardinality: message ids never reach metric attributes.
            for metric in &metrics {
                let text = format!("{:?}", metric.data);
                assert!(
                    !text.contains("msg-0001"),
                    "{} carries a message id",
                    metric.name
                );
                assert!(!text.contains("messaging.message.id"), "{}", metric.name);
            }
            Some(())
        })
        .await;

    telemetry.shutdown(WAIT).await.unwrap();
}

#[tokio::test]
async fn app_insights_and_otlp_both_receive_telemetry() {
    let collector = Collector::default();
    let running = collector.start();
    let endpoint = running.url.clone();
    let config = TelemetryConfig::default()
        .with_service_name("telemetry-test")
        .with_otlp_endpoint(&endpoint)
        .with_app_insights_connection_string(format!(
            "InstrumentationKey={IKEY};IngestionEndpoint={endpoint}/;LiveEndpoint=https://example.invalid/"
        ))
        .with_metric_export_interval(Duration::from_secs(3600))
        .with_export_timeout(Duration::from_secs(5));
    let telemetry = Telemetry::build(&config).unwrap();
    assert!(telemetry.exports_otlp() && telemetry.exports_app_insights());
    assert!(!format!("{telemetry:?} {config:?}").contains(IKEY));
    record_sample_telemetry(&telemetry);

    telemetry.flush(WAIT).await.unwrap();

    collector
        .wait_for("the span and a metric in App Insights", |r| {
            let mut span = false;
            let mut metric = false;
            for (path, body) in &r.app_insights {
                assert_eq!(path, "/v2/track");
                for envelope in body.as_array().unwrap() {
                    assert_eq!(envelope["iKey"], IKEY, "{envelope}");
                    let text = envelope.to_string();
                    span |= envelope["data"]["baseType"] == "RequestData"
                        && text.contains("process orders")
                        && text.contains("msg-0001");
                    metric |= envelope["data"]["baseType"] == "MetricData"
                        && text.contains(names::MESSAGES_SETTLED);
                }
            }
            (span && metric).then_some(())
        })
        .await;
    collector
        .wait_for("the span over OTLP too", |r| {
            find_span(r, "process orders").map(drop)
        })
        .await;

    telemetry.shutdown(WAIT).await.unwrap();
}

#[tokio::test]
async fn init_installs_the_global_subscriber_and_meter_provider() {
    // A bad filter is rejected before anything global is installed.
    let error = spot_worker_telemetry::init(TelemetryConfig::default().with_log_filter("x=loud"))
        .unwrap_err();
    assert!(
        matches!(error, TelemetryError::InvalidLogFilter(_)),
        "{error:?}"
    );

    let collector = Collector::default();
    let running = collector.start();
    let endpoint = running.url.clone();
    let config = TelemetryConfig::default()
        .with_service_name("init-test")
        .with_json_logs(true)
        .with_otlp_endpoint(endpoint)
        .with_metric_export_interval(Duration::from_secs(3600));
    let telemetry = spot_worker_telemetry::init(config.clone()).unwrap();

    // No `with_default`: these go through the global subscriber.
    drop(message_span("global-queue", "msg-global", 1));
    drop(tracing::debug_span!("below_the_default_info_filter"));
    telemetry.metrics().message_failed("global-queue");
    telemetry.shutdown(WAIT).await.unwrap();

    collector
        .wait_for("the globally recorded span", |r| {
            find_span(r, "process global-queue").map(drop)
        })
        .await;
    collector
        .wait_for("the globally recorded metric", |r| {
            let metrics = r.all_metrics();
            let queue = [("messaging.destination.name", "global-queue")];
            (counter_value(&metrics, names::MESSAGES_FAILED, &queue)? == 1).then_some(())
        })
        .await;
    assert!(find_span(&collector.received(), "below_the_default_info_filter").is_none());

    let again = spot_worker_telemetry::init(config);
    assert!(
        matches!(again, Err(TelemetryError::AlreadyInitialized(_))),
        "{again:?}"
    );
}

/// A collector that accepts connections and never answers.
async fn silent_collector() -> (String, Arc<AtomicUsize>, Arc<Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let notify = Arc::new(Notify::new());
    let (count, wake) = (Arc::clone(&accepted), Arc::clone(&notify));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
            count.fetch_add(1, Ordering::SeqCst);
            wake.notify_waiters();
        }
    });
    (format!("http://{address}"), accepted, notify)
}

async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let output = future.await;
    (output, started.elapsed())
}

#[tokio::test]
async fn flush_and_shutdown_are_bounded_when_the_collector_never_answers() {
    let (endpoint, accepted, connected) = silent_collector().await;
    let config = TelemetryConfig::default()
        .with_otlp_endpoint(endpoint)
        .with_metric_export_interval(Duration::from_secs(3600))
        // Far longer than the test may take: only our bound can end the wait.
        .with_export_timeout(Duration::from_secs(60));
    let telemetry = Telemetry::build(&config).unwrap();
    record_sample_telemetry(&telemetry);

    let budget = Duration::from_secs(1);
    let (result, elapsed) = timed(telemetry.flush(budget)).await;
    assert!(
        matches!(
            result,
            Err(TelemetryError::Timeout {
                operation: "flush",
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        elapsed < budget + Duration::from_secs(2),
        "flush took {elapsed:?}"
    );

    // The exporter really did reach the collector and is stuck waiting on it.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let notified = connected.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if accepted.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::timeout_at(deadline, notified)
            .await
            .expect("the exporter never connected");
    }

    let (result, elapsed) = timed(telemetry.shutdown(budget)).await;
    assert!(
        matches!(
            result,
            Err(TelemetryError::Timeout {
                operation: "shutdown",
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        elapsed < budget + Duration::from_secs(2),
        "shutdown took {elapsed:?}"
    );
}
