//! The patient policy, as the workers run it
//! ([`LanePolicy::Patient`]): it learns from the fleet's Spot history.
//! The bench feeds that history the trace, tick by tick, as a fleet's
//! Spot workers and evictions feed it: up to [`HISTORY_HOURS`] before the
//! job's start, then each tick just gone.

use spot_worker::decisions::lanes::{Lane, LanePolicy as Rule, SpotHistory};

use crate::model::{HISTORY_HOURS, Job, LanePolicy, Question};
use crate::policies::{at_secs, situation};
use crate::trace::Window;

/// [`LanePolicy::Patient`] with the fleet's history.
#[derive(Default)]
pub struct Patient {
    history: SpotHistory,
}

impl LanePolicy for Patient {
    fn name(&self) -> &'static str {
        "patient"
    }

    fn reset(&mut self, window: Window<'_>) {
        self.history = before(window, HISTORY_HOURS);
    }

    fn observe(&mut self, spot_available: bool, at: f64) {
        self.history.see(spot_available, at_secs(at));
    }

    fn lane(&mut self, job: &Job, q: &Question) -> Lane {
        Rule::Patient
            .choose(&situation(job, q), &self.history, job.price_ratio)
            .lane
    }
}

/// What the fleet saw in the `hours` of the trace before tick 0 of
/// `window` (only ticks the trace has before the job's start: never its
/// wrapped-around future).
fn before(window: Window<'_>, hours: f64) -> SpotHistory {
    let mut history = SpotHistory::default();
    let gap = window.gap();
    let ticks = ((hours * 3600.0) / gap) as usize;
    for back in (1..=ticks.min(window.start())).rev() {
        history.see(window.at_before(back), at_secs(-(back as f64) * gap));
    }
    history
}
