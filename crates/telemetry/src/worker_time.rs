//! The fleet's bill as metrics (issue 39, item 3): this worker's paid
//! time since it started, by `phase` (starting, busy, idle, draining) and
//! by the `lane` its VM is paid at, observed at every export as a
//! monotonic counter (`spot_worker.worker.time`). Summed over the fleet's
//! workers it is the VM-hours (pod-hours) paid, split like the bill of
//! `spot-worker status`.
//!
//! The telemetry crate knows nothing of the worker's life: the runtime
//! gives a function that reads its time ([`Metrics::observe_worker_time`](crate::Metrics::observe_worker_time)).

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableCounter};

use crate::source_slot::SourceSlot;
use crate::{attributes, names};

/// The values of the `phase` attribute of `spot_worker.worker.time`.
pub const WORKER_PHASES: [&str; 4] = ["starting", "busy", "idle", "draining"];

/// This worker's time as the runtime reads it: its lane (one of
/// [`LANES`](crate::LANES)) and the seconds in each of [`WORKER_PHASES`].
pub type WorkerTimeSource = Arc<dyn Fn() -> (&'static str, [f64; 4]) + Send + Sync>;

/// The counter; it reports nothing until a source is set.
pub(crate) struct WorkerTime {
    pub(crate) source: SourceSlot<WorkerTimeSource>,
    _time: ObservableCounter<f64>,
}

impl WorkerTime {
    pub(crate) fn new(meter: &Meter) -> Self {
        let source: SourceSlot<WorkerTimeSource> = SourceSlot::default();
        let read = source.clone();
        WorkerTime {
            _time: meter
                .f64_observable_counter(names::WORKER_TIME)
                .with_unit("s")
                .with_description("This worker's paid time since it started, by phase (starting: warmup; busy: a handler running; idle: ready, none running; draining: from the stop signal or notice to exit) and lane (spot, regular): the fleet's bill.")
                .with_callback(move |observer| {
                    if let Some(read) = read.get() {
                        let (lane, seconds) = read();
                        for (phase, seconds) in WORKER_PHASES.into_iter().zip(seconds) {
                            observer.observe(
                                seconds,
                                &[
                                    KeyValue::new(attributes::LANE, lane),
                                    KeyValue::new(attributes::PHASE, phase),
                                ],
                            );
                        }
                    }
                })
                .build(),
            source,
        }
    }
}
