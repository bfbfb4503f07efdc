//! The worker's own telemetry reaches an OTLP collector when an endpoint is
//! configured (the `OTEL_EXPORTER_OTLP_ENDPOINT` path): a real [`Worker`]
//! over in-memory queues processes three messages (one fails) and a local
//! OTLP/HTTP receiver decodes the `process {queue}` spans and the worker's
//! metrics that arrive. An evicted job (its handler cancelled by the drain,
//! its message released) is reported as released: not as a failure, and
//! its span is not an error.
//!
//! Nothing here records telemetry by hand: every span and data point comes
//! from the runtime's instrumentation around the handler and the queues.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::metrics::v1::{Metric, NumberDataPoint, metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, span, status};
use spot_worker::storage::{InMemoryQueue, MessageId, MessageQueue};
use spot_worker::telemetry::{Telemetry, TelemetryConfig, names};
use spot_worker::{HandlerError, Job, MessageHandler, Worker, WorkerConfig, handler_fn};
use spot_worker_testkit::otlp::{Collector, Received, WAIT, string_attribute};
use tokio::sync::mpsc;
use tracing_subscriber::layer::SubscriberExt as _;

const QUEUE: &str = "telemetry-jobs";
const FAILING_BODY: &str = "reject me";

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

fn process_spans(received: &Received) -> Vec<Span> {
    let name = format!("process {QUEUE}");
    received
        .spans()
        .filter(|span| span.name == name)
        .cloned()
        .collect()
}

/// The most recent export of `name`: temporality is cumulative, so it holds
/// the totals.
fn latest<'a>(metrics: &[&'a Metric], name: &str) -> Option<&'a Metric> {
    metrics.iter().rev().find(|m| m.name == name).copied()
}

fn int_value(point: &NumberDataPoint) -> i64 {
    match point.value {
        Some(number_data_point::Value::AsInt(i)) => i,
        other => panic!("not an integer point: {other:?}"),
    }
}

/// A counter's latest total for this test's queue.
fn queue_counter(metrics: &[&Metric], name: &str) -> Option<i64> {
    outcome_counter(metrics, name, None)
}

/// The latest total of `spot_worker.messages.settled` with `outcome`.
fn settled(metrics: &[&Metric], outcome: &str) -> Option<i64> {
    outcome_counter(metrics, names::MESSAGES_SETTLED, Some(outcome))
}

/// A counter's latest total for this test's queue (and `outcome`, if any).
fn outcome_counter(metrics: &[&Metric], name: &str, outcome: Option<&str>) -> Option<i64> {
    let Some(metric::Data::Sum(sum)) = &latest(metrics, name)?.data else {
        panic!("{name} is not a sum");
    };
    let for_queue = |p: &&NumberDataPoint| {
        string_attribute(&p.attributes, "messaging.destination.name") == Some(QUEUE)
            && outcome.is_none_or(|o| string_attribute(&p.attributes, "outcome") == Some(o))
    };
    Some(
        sum.data_points
            .iter()
            .filter(for_queue)
            .map(int_value)
            .sum(),
    )
}

/// Every value the readiness gauge was exported with, in arrival order.
fn ready_values(received: &Received) -> Vec<i64> {
    let metrics = received.all_metrics();
    let gauges = metrics.iter().filter(|m| m.name == names::READY);
    gauges
        .flat_map(|m| match &m.data {
            Some(metric::Data::Gauge(gauge)) => gauge.data_points.iter().map(int_value),
            other => panic!("{} is not a gauge: {other:?}", names::READY),
        })
        .collect()
}

/// Accepts every message except [`FAILING_BODY`], reporting each id it saw.
fn handler(seen: mpsc::UnboundedSender<MessageId>) -> impl MessageHandler {
    handler_fn(move |job: Job| {
        let seen = seen.clone();
        async move {
            let failing = job.text()? == FAILING_BODY;
            let _ = seen.send(job.id().clone());
            if failing {
                return Err(HandlerError::from("rejected on purpose"));
            }
            Ok(())
        }
    })
}

fn worker_config() -> WorkerConfig {
    let mut config = WorkerConfig {
        queue: QUEUE.to_owned(),
        health_addr: "127.0.0.1:0".parse().unwrap(),
        concurrency: 3,
        // The failure is final at once: it is poisoned, never retried, so
        // the counts below are exact whatever the timing.
        max_failures: 1,
        ..WorkerConfig::default()
    };
    config.imds.enabled = false; // not on an Azure VM
    config.drain.handle_signals = false;
    config.drain.watchdog = false;
    config
}

// Current-thread: the worker's tasks all run on this thread, where the
// subscriber carrying the OpenTelemetry layer is the default. `init()`
// would install globals instead, which a test binary can do only once.
#[tokio::test(flavor = "current_thread")]
async fn the_workers_spans_and_metrics_reach_the_otlp_collector() {
    let collector = Collector::default();
    let running = collector.start();
    let endpoint = running.url.clone();
    let config = TelemetryConfig::default()
        .with_otlp_endpoint(endpoint)
        // Frequent periodic exports, so readiness is seen while running.
        .with_metric_export_interval(Duration::from_millis(100))
        .with_export_timeout(Duration::from_secs(5));
    let telemetry = Telemetry::build(&config).unwrap();
    assert!(telemetry.exports_otlp());
    let layer = telemetry.layer().expect("spans are exported over OTLP");
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let queue = InMemoryQueue::new(QUEUE);
    let mut good = Vec::new();
    for body in ["first", "second"] {
        good.push(queue.send(body, Duration::ZERO).await.unwrap());
    }
    let bad = queue.send(FAILING_BODY, Duration::ZERO).await.unwrap();
    let ids = [good[0].as_str(), good[1].as_str(), bad.as_str()];

    let poison = Arc::new(InMemoryQueue::new(&format!("{QUEUE}-poison")));
    let worker =
        Worker::new(worker_config(), Arc::new(queue.clone()), poison).with_telemetry(telemetry);
    let stop = worker.shutdown_token();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let running = tokio::spawn(worker.run(handler(seen_tx)));

    let mut handled = Vec::new();
    for _ in 0..3 {
        handled.push(within("the handler", seen.recv()).await.unwrap());
    }
    handled.sort();
    let mut expected = vec![good[0].clone(), good[1].clone(), bad.clone()];
    expected.sort();
    assert_eq!(handled, expected, "each message handled once");
    // A periodic export while the gate is open shows the worker ready.
    collector
        .wait_for("spot_worker.ready = 1", |r| {
            ready_values(r).contains(&1).then_some(())
        })
        .await;

    // run() flushes the telemetry itself (bounded) before returning.
    stop.cancel();
    let report = within("the drain", running).await.unwrap().unwrap();
    assert_eq!(report.stats.succeeded, 2, "{:?}", report.stats);
    assert_eq!(report.stats.poisoned, 1, "{:?}", report.stats);
    assert!(queue.is_empty());

    let spans = collector
        .wait_for("three process spans", |r| {
            let spans = process_spans(r);
            (spans.len() >= 3).then_some(spans)
        })
        .await;
    assert_process_spans(&spans, &ids, bad.as_str());

    collector
        .wait_for("the final metrics", |r| {
            let metrics = r.all_metrics();
            latest(&metrics, names::MESSAGES_SETTLED)?;
            // Readiness drops before the final flush: its point comes last.
            (ready_values(r).last() == Some(&0)).then_some(())
        })
        .await;
    let received = collector.received();
    assert_metrics(&received.all_metrics(), &ids);
}

/// One span per message, following the messaging conventions; only the
/// failed message's span is marked as an error.
fn assert_process_spans(spans: &[Span], ids: &[&str], failed_id: &str) {
    assert_eq!(spans.len(), 3, "one span per delivery: {spans:#?}");
    let mut span_ids = Vec::new();
    for span in spans {
        let attrs = &span.attributes;
        let attr = |key| string_attribute(attrs, key);
        assert_eq!(span.kind, span::SpanKind::Consumer as i32, "{span:?}");
        assert_eq!(attr("messaging.system"), Some("azure_storage_queue"));
        assert_eq!(attr("messaging.operation.type"), Some("process"));
        assert_eq!(attr("messaging.destination.name"), Some(QUEUE));
        let id = attr("messaging.message.id").expect("a message id");
        assert!(ids.contains(&id), "{id} is not one of {ids:?}");
        span_ids.push(id);
        let status = span.status.as_ref().map_or(0, |s| s.code);
        if id == failed_id {
            assert_eq!(attr("error.type"), Some("handler"), "{span:?}");
            assert_eq!(status, status::StatusCode::Error as i32, "{span:?}");
        } else {
            assert_eq!(attr("error.type"), None, "{span:?}");
            assert_ne!(status, status::StatusCode::Error as i32, "{span:?}");
        }
    }
    span_ids.sort_unstable();
    span_ids.dedup();
    assert_eq!(span_ids.len(), 3, "a span for each message");
}

fn assert_metrics(metrics: &[&Metric], ids: &[&str]) {
    let counter = |name| queue_counter(metrics, name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(settled(metrics, "succeeded"), Some(2));
    // The handler's failure is counted, and poisoned (max_failures 1).
    assert_eq!(counter(names::MESSAGES_FAILED), 1);
    assert_eq!(settled(metrics, "poisoned"), Some(1));
    assert_eq!(settled(metrics, "released"), Some(0));

    let duration = latest(metrics, names::MESSAGE_PROCESS_DURATION).expect("process duration");
    let Some(metric::Data::Histogram(histogram)) = &duration.data else {
        panic!("{} is not a histogram", duration.name);
    };
    let [point] = histogram.data_points.as_slice() else {
        panic!("one series, for the one queue: {histogram:?}");
    };
    assert_eq!(
        string_attribute(&point.attributes, "messaging.destination.name"),
        Some(QUEUE)
    );
    assert_eq!(point.count, 2, "successful messages only");
    assert!(latest(metrics, names::READY).is_some());

    // Bounded cardinality: no data point of any export names a message.
    for metric in metrics {
        let text = format!("{:?}", metric.data);
        assert!(!text.contains("messaging.message.id"), "{}", metric.name);
        for id in ids {
            assert!(
                !text.contains(id),
                "{} carries message id {id}",
                metric.name
            );
        }
    }
}

// Current-thread for the same reason as above.
#[tokio::test(flavor = "current_thread")]
async fn an_evicted_job_is_released_not_failed_in_telemetry() {
    let collector = Collector::default();
    let running = collector.start();
    let config = TelemetryConfig::default()
        .with_otlp_endpoint(running.url.clone())
        .with_metric_export_interval(Duration::from_millis(100))
        .with_export_timeout(Duration::from_secs(5));
    let telemetry = Telemetry::build(&config).unwrap();
    let layer = telemetry.layer().expect("spans are exported over OTLP");
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let queue = InMemoryQueue::new(QUEUE);
    let id = queue.send("long job", Duration::ZERO).await.unwrap();
    let poison = Arc::new(InMemoryQueue::new(&format!("{QUEUE}-poison")));
    let worker =
        Worker::new(worker_config(), Arc::new(queue.clone()), poison).with_telemetry(telemetry);
    let stop = worker.shutdown_token();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    // Like examples/primes.rs when evicted: stops when told to and returns
    // an error saying so.
    let handler = handler_fn(move |job: Job| {
        let started = started_tx.clone();
        async move {
            let _ = started.send(());
            job.cancellation().cancelled().await;
            Err::<(), HandlerError>("interrupted".into())
        }
    });
    let running = tokio::spawn(worker.run(handler));
    within("the handler", started.recv()).await.unwrap();
    // The drain (as on a Spot eviction notice) cancels the job.
    stop.cancel();
    let report = within("the drain", running).await.unwrap().unwrap();
    assert_eq!(report.stats.released, 1, "{:?}", report.stats);
    assert_eq!(report.stats.retried + report.stats.poisoned, 0);
    assert_eq!(queue.len(), 1, "the message is back in the queue");

    let spans = collector
        .wait_for("the process span", |r| {
            let spans = process_spans(r);
            (!spans.is_empty()).then_some(spans)
        })
        .await;
    let [span] = spans.as_slice() else {
        panic!("one delivery, one span: {spans:#?}");
    };
    assert_eq!(
        string_attribute(&span.attributes, "messaging.message.id"),
        Some(id.as_str())
    );
    assert_eq!(
        string_attribute(&span.attributes, "error.type"),
        None,
        "{span:?}"
    );
    let status = span.status.as_ref().map_or(0, |s| s.code);
    assert_ne!(status, status::StatusCode::Error as i32, "{span:?}");

    collector
        .wait_for("the released outcome", |r| {
            (settled(&r.all_metrics(), "released")? == 1).then_some(())
        })
        .await;
    let received = collector.received();
    let metrics = received.all_metrics();
    assert_eq!(settled(&metrics, "released"), Some(1));
    assert_eq!(
        queue_counter(&metrics, names::MESSAGES_FAILED).unwrap_or(0),
        0,
        "an eviction is not a failure"
    );
    for outcome in ["succeeded", "retried", "poisoned"] {
        assert_eq!(settled(&metrics, outcome), Some(0), "{outcome}");
    }
}
