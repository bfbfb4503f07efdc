//! The checkpoint interval and what it rests on, as gauges observed at
//! every export: the interval handed out, the measured cost of a save, and
//! the interruption rates estimated for the fleet (docs/checkpoint-interval.md),
//! so a user can check the estimates the worker acts on.
//!
//! The telemetry crate knows nothing of storage: the runtime gives a
//! function that reads the estimates ([`Metrics::observe_checkpoint_estimates`](crate::Metrics::observe_checkpoint_estimates)),
//! called at each export.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableGauge};

use crate::source_slot::SourceSlot;
use crate::{attributes, names};

/// The estimates behind the checkpoint interval, as the runtime reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CheckpointEstimates {
    /// The interval handed out, in seconds.
    pub interval_seconds: f64,
    /// The recent time one save blocked the job, in seconds (`None`: no
    /// save measured yet).
    pub save_cost_seconds: Option<f64>,
    /// Evictions per job-hour.
    pub evictions_per_hour: f64,
    /// Evictions whose notice came too late, per job-hour.
    pub late_per_hour: f64,
    /// Evictions drained in time that saved nothing after the notice (a
    /// program that dies on its stop signal), per job-hour.
    pub unsaved_per_hour: f64,
    /// Deliveries that ended with no outcome, per job-hour.
    pub no_outcome_per_hour: f64,
    /// Interruptions that lose work, per job-hour.
    pub losing_per_hour: f64,
}

/// The values of the `kind` attribute of `spot_worker.interruptions.rate`.
pub const INTERRUPTION_KINDS: [&str; 5] = ["evicted", "late", "unsaved", "no_outcome", "losing"];

/// Reads the estimates at an export.
pub type EstimatesSource = Arc<dyn Fn() -> CheckpointEstimates + Send + Sync>;

/// The gauges; they report nothing until a source is set.
pub(crate) struct CheckpointGauges {
    pub(crate) source: SourceSlot<EstimatesSource>,
    _interval: ObservableGauge<f64>,
    _cost: ObservableGauge<f64>,
    _rates: ObservableGauge<f64>,
}

fn read(source: &SourceSlot<EstimatesSource>) -> Option<CheckpointEstimates> {
    source.get().map(|read| read())
}

impl CheckpointGauges {
    pub(crate) fn new(meter: &Meter) -> Self {
        let source: SourceSlot<EstimatesSource> = SourceSlot::default();
        let (for_interval, for_cost, for_rates) = (source.clone(), source.clone(), source.clone());
        CheckpointGauges {
            _interval: meter
                .f64_observable_gauge(names::CHECKPOINT_INTERVAL)
                .with_unit("s")
                .with_description(
                    "The checkpoint interval handed to handlers and programs now (fixed, or Daly's from the estimates).",
                )
                .with_callback(move |observer| {
                    if let Some(estimates) = read(&for_interval) {
                        observer.observe(estimates.interval_seconds, &[]);
                    }
                })
                .build(),
            _cost: meter
                .f64_observable_gauge(names::CHECKPOINT_COST)
                .with_unit("s")
                .with_description("The recent time one checkpoint save blocked the job.")
                .with_callback(move |observer| {
                    if let Some(cost) = read(&for_cost).and_then(|e| e.save_cost_seconds) {
                        observer.observe(cost, &[]);
                    }
                })
                .build(),
            _rates: meter
                .f64_observable_gauge(names::INTERRUPTION_RATE)
                .with_unit("{interruption}/h")
                .with_description(
                    "Estimated interruptions per job-hour, by kind: evicted, late (notice too late to save), unsaved (drained in time, nothing saved after the notice), no_outcome (crash, kill, lost VM), losing (late + unsaved + no_outcome).",
                )
                .with_callback(move |observer| {
                    if let Some(e) = read(&for_rates) {
                        let rates = [
                            e.evictions_per_hour,
                            e.late_per_hour,
                            e.unsaved_per_hour,
                            e.no_outcome_per_hour,
                            e.losing_per_hour,
                        ];
                        for (kind, rate) in INTERRUPTION_KINDS.iter().zip(rates) {
                            observer.observe(rate, &[KeyValue::new(attributes::KIND, *kind)]);
                        }
                    }
                })
                .build(),
            source,
        }
    }
}
