//! The worker's metrics: one OpenTelemetry instrument per fact the runtime
//! reports, behind a cheap-to-clone [`Metrics`] handle with one method each.
//!
//! Attributes are kept to bounded sets (queue name, outcome enums, the five
//! IMDS event types): message ids and free-form errors belong on spans, never
//! here, or every value would become its own time series.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _, ObservableGauge};

use crate::checkpoint_gauges::{CheckpointEstimates, CheckpointGauges, EstimatesSource};
use crate::keeper_gauges::{KeeperGauges, ProtectionState};
use crate::lane_metrics::{LaneInstruments, SwitchCostSource};
use crate::outcomes::{
    CheckpointOutcome, EVENT_TYPES, JobTimeKind, LeaseOutcome, MessageOutcome, StorageRefusal,
};
use crate::span::MESSAGING_DESTINATION_NAME;
use crate::worker_time::{WorkerTime, WorkerTimeSource};
use crate::{attributes, names};

// Second-scale boundaries: the SDK default (0..10000) assumes milliseconds.
const PROCESS_BOUNDARIES: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
const CHECKPOINT_BOUNDARIES: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
// A share, 0 to 1: finer towards 1, where a healthy fleet is.
const GOODPUT_BOUNDARIES: [f64; 10] = [0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0];
// Azure's Spot notice is 30 s; the interesting part is around it.
const DRAIN_BOUNDARIES: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 45.0, 60.0, 120.0,
];

/// The known IMDS scheduled-event types; anything else is reported as
/// `other` so a surprise value cannot grow the series count.
fn event_type_attribute(event_type: &str) -> &'static str {
    let (known, other) = EVENT_TYPES.split_at(EVENT_TYPES.len() - 1);
    known
        .iter()
        .find(|known| known.eq_ignore_ascii_case(event_type.trim()))
        .unwrap_or(&other[0])
}

/// The worker's metric instruments.
///
/// Cloning is cheap (one `Arc`); every clone records into the same
/// instruments and shares the readiness state. Built by
/// [`Telemetry::metrics`](crate::Telemetry::metrics) or, with no exporter,
/// [`Metrics::noop`], which records nothing and needs no setup.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_telemetry::{LeaseOutcome, Metrics};
///
/// let metrics = Metrics::noop();
/// use spot_worker_telemetry::MessageOutcome;
/// metrics.handler_succeeded("orders", Duration::from_millis(120));
/// metrics.message_settled("orders", MessageOutcome::Released);
/// metrics.lease_renewed("orders", LeaseOutcome::Lost);
/// metrics.set_ready(true);
/// assert!(metrics.is_ready());
/// ```
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Instruments>,
}

struct Instruments {
    settled: Counter<u64>,
    failed: Counter<u64>,
    process_duration: Histogram<f64>,
    lease_renewals: Counter<u64>,
    checkpoint_writes: Counter<u64>,
    checkpoint_duration: Histogram<f64>,
    eviction_notices: Counter<u64>,
    drain_duration: Histogram<f64>,
    ready: Arc<AtomicBool>,
    // Held so the callback's registration lives as long as the handle.
    _ready_gauge: ObservableGauge<i64>,
    storage_refused: Arc<AtomicU8>,
    _storage_refused_gauge: ObservableGauge<i64>,
    job_time: Counter<f64>,
    job_goodput: Histogram<f64>,
    job_unaccounted: Counter<u64>,
    checkpoint_gauges: CheckpointGauges,
    lanes: LaneInstruments,
    worker_time: WorkerTime,
    pod_deletion_cost_writes: Counter<u64>,
    keepers: KeeperGauges,
}

impl Metrics {
    /// Creates the instruments on `meter`.
    ///
    /// Call it once per meter provider and clone the result: each call
    /// registers another readiness callback.
    pub fn new(meter: &Meter) -> Self {
        let ready = Arc::new(AtomicBool::new(false));
        let observed = Arc::clone(&ready);
        let storage_refused = Arc::new(AtomicU8::new(0));
        let refusal_observed = Arc::clone(&storage_refused);
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        let histogram = |name: &'static str, description: &'static str, boundaries: &[f64]| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(boundaries.to_vec())
                .build()
        };
        let inner = Instruments {
            settled: counter(
                names::MESSAGES_SETTLED,
                "{message}",
                "Deliveries settled, by outcome: succeeded, skipped_completed, retried, \
                 poisoned, released, waited_for_peer, waited_for_store, lease_lost, moved, \
                 superseded, probe_taken.",
            ),
            failed: counter(
                names::MESSAGES_FAILED,
                "{message}",
                "Handler failures counted towards the poison queue (never an eviction, a wait \
                 or a lost lease).",
            ),
            process_duration: histogram(
                names::MESSAGE_PROCESS_DURATION,
                "Time a handler took, for handlers that succeeded.",
                &PROCESS_BOUNDARIES,
            ),
            lease_renewals: counter(
                names::LEASE_RENEWALS,
                "{renewal}",
                "Visibility-timeout renewals of in-flight messages, by result.",
            ),
            checkpoint_writes: counter(
                names::CHECKPOINT_WRITES,
                "{write}",
                "Checkpoint writes, by result.",
            ),
            checkpoint_duration: histogram(
                names::CHECKPOINT_WRITE_DURATION,
                "Latency of checkpoint writes.",
                &CHECKPOINT_BOUNDARIES,
            ),
            eviction_notices: counter(
                names::EVICTION_NOTICES,
                "{notice}",
                "IMDS scheduled-event notices seen, by event type.",
            ),
            drain_duration: histogram(
                names::DRAIN_DURATION,
                "Time from an eviction notice to the worker being fully drained.",
                &DRAIN_BOUNDARIES,
            ),
            ready,
            _ready_gauge: meter
                .i64_observable_gauge(names::READY)
                .with_unit("1")
                .with_description("1 while the worker reports ready to take messages, else 0.")
                .with_callback(move |observer| {
                    observer.observe(i64::from(observed.load(Ordering::Relaxed)), &[]);
                })
                .build(),
            storage_refused,
            // Both reasons are always reported (0 or 1), so a dashboard sees
            // a refusal end as well as begin.
            _storage_refused_gauge: meter
                .i64_observable_gauge(names::STORAGE_REFUSED)
                .with_unit("1")
                .with_description(
                    "1 while the checkpoint store refuses the worker or misses its container and intake is paused, else 0; by reason.",
                )
                .with_callback(move |observer| {
                    let current = refusal_observed.load(Ordering::Relaxed);
                    for refusal in StorageRefusal::ALL {
                        let value = i64::from(StorageRefusal::code(Some(refusal)) == current);
                        observer
                            .observe(value, &[KeyValue::new(attributes::REASON, refusal.as_str())]);
                    }
                })
                .build(),
            job_time: meter
                .f64_counter(names::JOB_TIME)
                .with_unit("s")
                .with_description(
                    "Finished jobs' time across all their deliveries, by kind: useful, redone, \
                     checkpointing, waiting.",
                )
                .build(),
            job_goodput: meter
                .f64_histogram(names::JOB_GOODPUT)
                .with_unit("1")
                .with_description("Finished jobs' useful time over all their time.")
                .with_boundaries(GOODPUT_BOUNDARIES.to_vec())
                .build(),
            job_unaccounted: counter(
                names::JOB_UNACCOUNTED,
                "{delivery}",
                "Deliveries of finished jobs cut before their first checkpoint save, whose \
                 time is missing from spot_worker.job.time.",
            ),
            checkpoint_gauges: CheckpointGauges::new(meter),
            lanes: LaneInstruments::new(meter),
            worker_time: WorkerTime::new(meter),
            pod_deletion_cost_writes: counter(
                names::POD_DELETION_COST_WRITES,
                "{write}",
                "Writes of the pod's controller.kubernetes.io/pod-deletion-cost, by result: ok, \
                 throttled, forbidden, server_error, refused, unreachable.",
            ),
            keepers: KeeperGauges::new(meter),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Metrics that go nowhere, for tests and for running without an
    /// exporter. Readiness is still tracked in memory.
    pub fn noop() -> Self {
        let provider = opentelemetry::metrics::NoopMeterProvider::new();
        Self::new(&provider.meter("spot-worker"))
    }

    /// A handler returned success after `duration` (whether its message
    /// is then deleted is [`message_settled`](Self::message_settled)'s).
    pub fn handler_succeeded(&self, queue: &str, duration: Duration) {
        self.inner
            .process_duration
            .record(duration.as_secs_f64(), &queue_attributes(queue));
    }

    /// The consumer settled a delivery with `outcome`.
    pub fn message_settled(&self, queue: &str, outcome: MessageOutcome) {
        self.inner.settled.add(
            1,
            &[
                KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned()),
                KeyValue::new(attributes::OUTCOME, outcome.as_str()),
            ],
        );
    }

    /// The consumer counted a handler failure (a retry, or poison after
    /// the handler failed).
    pub fn message_failed(&self, queue: &str) {
        self.inner.failed.add(1, &queue_attributes(queue));
    }

    /// A lease renewal finished with `outcome`.
    pub fn lease_renewed(&self, queue: &str, outcome: LeaseOutcome) {
        self.inner.lease_renewals.add(
            1,
            &[
                KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned()),
                KeyValue::new(attributes::RESULT, outcome.as_str()),
            ],
        );
    }

    /// A checkpoint write finished with `outcome` after `duration`.
    pub fn checkpoint_written(&self, outcome: CheckpointOutcome, duration: Duration) {
        let attributes = [KeyValue::new(attributes::RESULT, outcome.as_str())];
        self.inner.checkpoint_writes.add(1, &attributes);
        self.inner
            .checkpoint_duration
            .record(duration.as_secs_f64(), &attributes);
    }

    /// A job finished: `seconds` of each kind across all its deliveries,
    /// and `unaccounted` deliveries that left no accounting. Its goodput
    /// (useful over all) is recorded unless it took no time at all.
    pub fn job_finished(&self, queue: &str, seconds: &[(JobTimeKind, f64)], unaccounted: u32) {
        let mut total = 0.0;
        let mut useful = 0.0;
        for (kind, value) in seconds {
            self.inner.job_time.add(
                *value,
                &[
                    KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned()),
                    KeyValue::new(attributes::KIND, kind.as_str()),
                ],
            );
            total += value;
            if *kind == JobTimeKind::Useful {
                useful += value;
            }
        }
        if total > 0.0 {
            self.inner
                .job_goodput
                .record(useful / total, &queue_attributes(queue));
        }
        if unaccounted > 0 {
            self.inner
                .job_unaccounted
                .add(u64::from(unaccounted), &queue_attributes(queue));
        }
    }

    /// An IMDS scheduled event was noticed. Types other than the five IMDS
    /// defines are counted as `other`.
    pub fn eviction_notice(&self, event_type: &str) {
        self.inner.eviction_notices.add(
            1,
            &[KeyValue::new(
                attributes::EVENT_TYPE,
                event_type_attribute(event_type),
            )],
        );
    }

    /// The worker finished draining `duration` after the eviction notice.
    pub fn drained(&self, duration: Duration) {
        self.inner
            .drain_duration
            .record(duration.as_secs_f64(), &[]);
    }

    /// Sets the readiness gauge; it is observed at every export, so it
    /// reports the current value even when it has not changed.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// Sets the storage refusal gauge: why intake is paused for the
    /// checkpoint store, or `None` once it answers again.
    pub fn set_storage_refused(&self, refusal: Option<StorageRefusal>) {
        self.inner
            .storage_refused
            .store(StorageRefusal::code(refusal), Ordering::Relaxed);
    }

    /// The value last passed to [`set_storage_refused`](Self::set_storage_refused).
    pub fn storage_refused(&self) -> Option<StorageRefusal> {
        let current = self.inner.storage_refused.load(Ordering::Relaxed);
        StorageRefusal::ALL
            .into_iter()
            .find(|refusal| StorageRefusal::code(Some(*refusal)) == current)
    }

    /// Reports the checkpoint interval and its estimates from `source`,
    /// called at every export (`spot_worker.checkpoint.interval`,
    /// `spot_worker.checkpoint.cost`, `spot_worker.interruptions.rate`).
    pub fn observe_checkpoint_estimates(
        &self,
        source: impl Fn() -> CheckpointEstimates + Send + Sync + 'static,
    ) {
        let source: EstimatesSource = Arc::new(source);
        self.inner.checkpoint_gauges.source.set(source);
    }

    /// A job with a deadline finished: whether it `met` it, and its
    /// seconds on Spot and on regular capacity.
    pub fn deadline_job_finished(&self, queue: &str, met: bool, spot_s: f64, regular_s: f64) {
        self.inner
            .lanes
            .deadline_job_finished(queue, met, spot_s, regular_s);
    }

    /// The lane keeper made a pass: it `moved` jobs to the regular lane and
    /// saw `at_risk` jobs waiting at risk.
    pub fn lane_keeper_pass(&self, moved: u64, at_risk: u64) {
        self.inner.lanes.keeper_pass(moved, at_risk);
    }

    /// Reports this worker's paid time by phase, read from `source` at
    /// every export (`spot_worker.worker.time`): its lane and the seconds
    /// starting, busy, idle and draining.
    pub fn observe_worker_time(
        &self,
        source: impl Fn() -> (&'static str, [f64; 4]) + Send + Sync + 'static,
    ) {
        let source: WorkerTimeSource = Arc::new(source);
        self.inner.worker_time.source.set(source);
    }

    /// Reports d, in seconds, from `source` at every export
    /// (`spot_worker.lanes.switch_cost`).
    pub fn observe_switch_cost(&self, source: impl Fn() -> f64 + Send + Sync + 'static) {
        let source: SwitchCostSource = Arc::new(source);
        self.inner.lanes.switch_cost.set(source);
    }

    /// A write of the pod's deletion cost ended with `result` (`ok`, or
    /// why it failed: it is retried).
    pub fn pod_deletion_cost_written(&self, result: &'static str) {
        self.inner
            .pod_deletion_cost_writes
            .add(1, &[KeyValue::new(attributes::RESULT, result)]);
    }

    /// Sets the state of this VM's protection from scale-in
    /// (`spot_worker.scale_in.protection`).
    pub fn set_scale_in_protection(&self, state: ProtectionState) {
        self.inner.keepers.set_protection(state);
    }

    /// The value last passed to
    /// [`set_scale_in_protection`](Self::set_scale_in_protection)
    /// (initially `unknown`).
    pub fn scale_in_protection(&self) -> ProtectionState {
        self.inner.keepers.protection()
    }

    /// Sets whether writes of the pod's deletion cost keep failing
    /// (`spot_worker.pod_deletion_cost.failing`).
    pub fn set_pod_deletion_cost_failing(&self, failing: bool) {
        self.inner.keepers.set_cost_failing(failing);
    }

    /// The value last passed to
    /// [`set_pod_deletion_cost_failing`](Self::set_pod_deletion_cost_failing)
    /// (initially `false`).
    pub fn pod_deletion_cost_failing(&self) -> bool {
        self.inner.keepers.cost_failing()
    }

    /// The value last passed to [`set_ready`](Self::set_ready) (initially `false`).
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }
}

impl Default for Metrics {
    /// Same as [`Metrics::noop`].
    fn default() -> Self {
        Self::noop()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

fn queue_attributes(queue: &str) -> [KeyValue; 1] {
    [KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_bounded() {
        assert_eq!(event_type_attribute("Preempt"), "Preempt");
        assert_eq!(event_type_attribute("preempt"), "Preempt");
        assert_eq!(event_type_attribute(" Terminate "), "Terminate");
        assert_eq!(event_type_attribute("Freeze"), "Freeze");
        assert_eq!(event_type_attribute("msg-1234"), "other");
        assert_eq!(event_type_attribute(""), "other");
    }

    #[test]
    fn noop_metrics_accept_every_call_and_share_readiness_across_clones() {
        let metrics = Metrics::noop();
        let clone = metrics.clone();
        metrics.handler_succeeded("q", Duration::from_millis(5));
        metrics.message_failed("q");
        for outcome in MessageOutcome::ALL {
            metrics.message_settled("q", outcome);
        }
        metrics.lease_renewed("q", LeaseOutcome::Ok);
        metrics.checkpoint_written(CheckpointOutcome::Conflict, Duration::from_millis(3));
        metrics.eviction_notice("Preempt");
        metrics.drained(Duration::from_secs(12));
        metrics.job_finished("q", &[(JobTimeKind::Useful, 1.5)], 1);
        metrics.deadline_job_finished("q", false, 10.0, 2.5);
        metrics.lane_keeper_pass(2, 1);
        metrics.observe_switch_cost(|| 360.0);
        assert!(!clone.is_ready());
        metrics.set_ready(true);
        assert!(clone.is_ready());
        clone.set_ready(false);
        assert!(!metrics.is_ready());
    }
}
