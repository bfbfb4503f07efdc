//! [`InterruptionCounts`]: how often a fleet's deliveries were interrupted,
//! by kind, against the job time observed. The counts only grow, so two
//! workers' additions merge by summing (the fleet's counts are kept by
//! `spot_worker_storage::FleetLedger`, one addition per worker every
//! [`FLUSH_EVERY`]).
//!
//! Both are per delivery: an eviction of a worker running three jobs is
//! three interrupted deliveries in three jobs' time. So a rate is per
//! job-hour, which is what one job meets, however many a worker runs at
//! once, and for a job on a VM it equals the VM's own rate per hour.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a worker adds its counts to the fleet's: every hour.
pub const FLUSH_EVERY: Duration = Duration::from_secs(60 * 60);

/// What interrupted a delivery, as the interval policy tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interruption {
    /// An eviction (or another graceful stop) whose notice came in time:
    /// progress was saved and the message released; nothing was lost.
    Drained,
    /// An eviction whose notice came too late to save progress.
    Late,
    /// A delivery that ended with no outcome at all: a crash, a kill, a
    /// lost VM.
    NoOutcome,
}

/// Interruption counts and the job time they were seen in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InterruptionCounts {
    /// Evictions drained in time.
    #[serde(default)]
    pub drained: u64,
    /// Evictions whose notice came too late to save.
    #[serde(default)]
    pub late: u64,
    /// Deliveries that ended with no outcome.
    #[serde(default)]
    pub no_outcome: u64,
    /// Job time observed, in seconds: how long handlers ran, summed over
    /// deliveries.
    #[serde(default)]
    pub job_seconds: f64,
    /// Checkpoint saves measured, and the time they blocked their jobs in
    /// seconds: the fleet's mean cost of a save, for `spot-worker status`
    /// (each worker's interval follows its own measurements).
    #[serde(default)]
    pub saves: u64,
    /// See [`InterruptionCounts::saves`].
    #[serde(default)]
    pub save_seconds: f64,
}

impl InterruptionCounts {
    /// One more interruption of `kind`.
    pub fn count(&mut self, kind: Interruption) {
        let slot = match kind {
            Interruption::Drained => &mut self.drained,
            Interruption::Late => &mut self.late,
            Interruption::NoOutcome => &mut self.no_outcome,
        };
        *slot = slot.saturating_add(1);
    }

    /// Evictions of either kind.
    pub fn evictions(&self) -> u64 {
        self.drained.saturating_add(self.late)
    }

    /// The job time observed, in hours.
    pub fn job_hours(&self) -> f64 {
        self.job_seconds / 3600.0
    }

    /// The mean time a save blocked its job, in seconds; `None` before
    /// the first.
    pub fn mean_save_seconds(&self) -> Option<f64> {
        (self.saves > 0).then(|| self.save_seconds / self.saves as f64)
    }

    /// Whether nothing was counted (nothing to add to a ledger).
    pub fn is_empty(&self) -> bool {
        *self == InterruptionCounts::default()
    }

    /// These counts plus `other`'s (saturating; job time that is not a
    /// finite, positive number adds nothing).
    pub fn plus(&self, other: &InterruptionCounts) -> InterruptionCounts {
        let seconds = |s: f64| if s.is_finite() && s > 0.0 { s } else { 0.0 };
        InterruptionCounts {
            drained: self.drained.saturating_add(other.drained),
            late: self.late.saturating_add(other.late),
            no_outcome: self.no_outcome.saturating_add(other.no_outcome),
            job_seconds: seconds(self.job_seconds) + seconds(other.job_seconds),
            saves: self.saves.saturating_add(other.saves),
            save_seconds: seconds(self.save_seconds) + seconds(other.save_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_kind_and_never_overflow() {
        let mut counts = InterruptionCounts::default();
        assert!(counts.is_empty());
        counts.count(Interruption::Drained);
        counts.count(Interruption::Drained);
        counts.count(Interruption::Late);
        counts.count(Interruption::NoOutcome);
        assert_eq!((counts.drained, counts.late, counts.no_outcome), (2, 1, 1));
        assert_eq!(counts.evictions(), 3);
        let more = InterruptionCounts {
            drained: u64::MAX,
            no_outcome: 2,
            job_seconds: 7200.0,
            saves: 4,
            save_seconds: 2.0,
            ..InterruptionCounts::default()
        };
        let sum = counts.plus(&more);
        assert_eq!((sum.drained, sum.late, sum.no_outcome), (u64::MAX, 1, 3));
        assert_eq!(sum.job_hours(), 2.0);
        assert_eq!(sum.mean_save_seconds(), Some(0.5));
        assert_eq!(counts.mean_save_seconds(), None);
        let odd = InterruptionCounts {
            job_seconds: f64::NAN,
            ..InterruptionCounts::default()
        };
        assert_eq!(sum.plus(&odd).job_seconds, 7200.0);
    }

    #[test]
    fn older_or_partial_documents_read_with_zeros() {
        let counts: InterruptionCounts =
            serde_json::from_value(serde_json::json!({"drained": 3})).unwrap();
        assert_eq!(counts.drained, 3);
        assert_eq!(counts.job_seconds, 0.0);
    }
}
