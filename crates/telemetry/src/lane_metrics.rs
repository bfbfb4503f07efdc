//! The lanes' instruments (docs/deploying.md, "The two lanes"): jobs with a deadline finished,
//! met or missed, and their hours by lane; the jobs the lane keeper moved
//! and those it saw at risk; and d, the switch cost the rule uses.
//!
//! The telemetry crate knows nothing of lanes: the runtime reports plain
//! numbers, and gives a function that reads d at each export.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter, ObservableGauge};

use crate::source_slot::SourceSlot;
use crate::span::MESSAGING_DESTINATION_NAME;
use crate::{attributes, names};

/// The values of the `lane` attribute.
pub const LANES: [&str; 2] = ["spot", "regular"];

/// The values of the `deadline` attribute.
pub const DEADLINE_OUTCOMES: [&str; 2] = ["met", "missed"];

/// Reads d, in seconds, at an export.
pub type SwitchCostSource = Arc<dyn Fn() -> f64 + Send + Sync>;

pub(crate) struct LaneInstruments {
    deadlines: Counter<u64>,
    lane_time: Counter<f64>,
    keeper_moved: Counter<u64>,
    at_risk: Arc<AtomicU64>,
    _at_risk_gauge: ObservableGauge<u64>,
    pub(crate) switch_cost: SourceSlot<SwitchCostSource>,
    _switch_cost_gauge: ObservableGauge<f64>,
}

impl LaneInstruments {
    pub(crate) fn new(meter: &Meter) -> Self {
        let at_risk = Arc::new(AtomicU64::new(0));
        let observed = Arc::clone(&at_risk);
        let switch_cost: SourceSlot<SwitchCostSource> = SourceSlot::default();
        let source = switch_cost.clone();
        LaneInstruments {
            deadlines: meter
                .u64_counter(names::JOB_DEADLINES)
                .with_unit("{job}")
                .with_description("Finished jobs with a deadline, by whether they met it (deadline: met, missed).")
                .build(),
            lane_time: meter
                .f64_counter(names::JOB_LANE_TIME)
                .with_unit("s")
                .with_description("Finished jobs' time across all their deliveries, by the lane it ran in (lane: spot, regular).")
                .build(),
            keeper_moved: meter
                .u64_counter(names::LANES_KEEPER_MOVED)
                .with_unit("{job}")
                .with_description("Jobs waiting in the Spot lane that the lane keeper moved to the regular lane, behind their line.")
                .build(),
            at_risk,
            _at_risk_gauge: meter
                .u64_observable_gauge(names::LANES_AT_RISK)
                .with_unit("{job}")
                .with_description("Jobs with a deadline waiting in the Spot lane whose slack is below two switches and a recheck, as the lane keeper last saw them (0 on workers not keeping the lanes).")
                .with_callback(move |observer| observer.observe(observed.load(Ordering::Relaxed), &[]))
                .build(),
            switch_cost,
            _switch_cost_gauge: meter
                .f64_observable_gauge(names::LANES_SWITCH_COST)
                .with_unit("s")
                .with_description("d: what one switch of lane costs a job, as the fleet measured it (the seed until it has).")
                .with_callback(move |observer| {
                    if let Some(read) = source.get() {
                        observer.observe(read(), &[]);
                    }
                })
                .build(),
        }
    }

    pub(crate) fn deadline_job_finished(
        &self,
        queue: &str,
        met: bool,
        spot_s: f64,
        regular_s: f64,
    ) {
        let outcome = DEADLINE_OUTCOMES[usize::from(!met)];
        self.deadlines.add(
            1,
            &[
                KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned()),
                KeyValue::new(attributes::DEADLINE, outcome),
            ],
        );
        for (lane, seconds) in LANES.into_iter().zip([spot_s, regular_s]) {
            self.lane_time.add(
                seconds,
                &[
                    KeyValue::new(MESSAGING_DESTINATION_NAME, queue.to_owned()),
                    KeyValue::new(attributes::LANE, lane),
                ],
            );
        }
    }

    pub(crate) fn keeper_pass(&self, moved: u64, at_risk: u64) {
        if moved > 0 {
            self.keeper_moved.add(moved, &[]);
        }
        self.at_risk.store(at_risk, Ordering::Relaxed);
    }
}
