//! [`InterruptionCounts`]: how often a fleet's deliveries were interrupted,
//! by kind, against the job time observed, what the interruptions that
//! lost work lost, and how long the fleet's finished jobs were. The counts
//! only grow, so two workers' additions merge by summing (the fleet's
//! counts are kept per queue by `spot_worker_storage::FleetLedger`, one
//! addition per worker every [`FLUSH_EVERY`]).
//!
//! An interruption is counted by what it lost. A notice in time is not
//! enough: a program that saves on its own schedule and dies on the stop
//! signal (a training loop saving each epoch) is released in time and
//! still loses the work since its last save. So a drain counts as
//! [`Interruption::Drained`] only if something was saved after the notice,
//! and as [`Interruption::Unsaved`], with the interruptions that lose work,
//! if not; what the counts learn is the share of notices that really save.
//!
//! Both are per delivery: an eviction of a worker running three jobs is
//! three interrupted deliveries in three jobs' time. So a rate is per
//! job-hour, which is what one job meets, however many a worker runs at
//! once, and for a job on a VM it equals the VM's own rate per hour.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::job_length::JobLengths;

/// How often a worker adds its counts to the fleet's: every hour.
pub const FLUSH_EVERY: Duration = Duration::from_secs(60 * 60);

/// What interrupted a delivery, as the interval policy tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interruption {
    /// An eviction (or another graceful stop) saved at the notice: the
    /// handler saved after its cancellation, or the program wrote a new
    /// version of its checkpoint file after its stop signal, and the
    /// message was released; nothing was lost.
    Drained,
    /// An eviction drained in time whose last save came before the notice:
    /// the handler returned (the program ended) without saving after it,
    /// and the work since its last save was lost.
    Unsaved,
    /// An eviction whose notice came too late to save progress.
    Late,
    /// A delivery that ended with no outcome at all: a crash, a kill, a
    /// lost VM.
    NoOutcome,
}

/// Interruption counts and the job time they were seen in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InterruptionCounts {
    /// Evictions saved at the notice.
    #[serde(default)]
    pub drained: u64,
    /// Evictions drained in time without a save after the notice.
    #[serde(default)]
    pub unsaved: u64,
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
    /// Interruptions that lost work whose loss was measured (a drain
    /// without a save at the notice, a notice too late whose worker
    /// settled it), and the work they lost in seconds: the work lost per
    /// interruption, for `spot-worker status`. Deliveries with no outcome
    /// lose work nobody measures.
    #[serde(default)]
    pub losses: u64,
    /// See [`InterruptionCounts::losses`].
    #[serde(default)]
    pub lost_seconds: f64,
    /// The lengths of the jobs the fleet finished (see [`JobLengths`]).
    #[serde(default, skip_serializing_if = "JobLengths::is_empty")]
    pub job_lengths: JobLengths,
}

impl InterruptionCounts {
    /// One more interruption of `kind`.
    pub fn count(&mut self, kind: Interruption) {
        let slot = match kind {
            Interruption::Drained => &mut self.drained,
            Interruption::Unsaved => &mut self.unsaved,
            Interruption::Late => &mut self.late,
            Interruption::NoOutcome => &mut self.no_outcome,
        };
        *slot = slot.saturating_add(1);
    }

    /// One interruption that lost `lost` of work, measured.
    pub fn count_loss(&mut self, lost: Duration) {
        self.losses = self.losses.saturating_add(1);
        self.lost_seconds += finite_seconds(lost.as_secs_f64());
    }

    /// Evictions of every kind.
    pub fn evictions(&self) -> u64 {
        self.drained
            .saturating_add(self.unsaved)
            .saturating_add(self.late)
    }

    /// The share of evictions saved at the notice, as counted; `None`
    /// before the first.
    pub fn saved_share(&self) -> Option<f64> {
        let evictions = self.evictions();
        (evictions > 0).then(|| self.drained as f64 / evictions as f64)
    }

    /// The mean work lost by an interruption whose loss was measured;
    /// `None` before the first.
    pub fn mean_loss_seconds(&self) -> Option<f64> {
        (self.losses > 0).then(|| self.lost_seconds / self.losses as f64)
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
        let seconds = finite_seconds;
        InterruptionCounts {
            drained: self.drained.saturating_add(other.drained),
            unsaved: self.unsaved.saturating_add(other.unsaved),
            late: self.late.saturating_add(other.late),
            no_outcome: self.no_outcome.saturating_add(other.no_outcome),
            job_seconds: seconds(self.job_seconds) + seconds(other.job_seconds),
            saves: self.saves.saturating_add(other.saves),
            save_seconds: seconds(self.save_seconds) + seconds(other.save_seconds),
            losses: self.losses.saturating_add(other.losses),
            lost_seconds: seconds(self.lost_seconds) + seconds(other.lost_seconds),
            job_lengths: self.job_lengths.plus(&other.job_lengths),
        }
    }
}

/// `s` if it is a finite, positive number of seconds, else nothing.
fn finite_seconds(s: f64) -> f64 {
    if s.is_finite() && s > 0.0 { s } else { 0.0 }
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
        counts.count(Interruption::Unsaved);
        counts.count(Interruption::NoOutcome);
        assert_eq!(
            (
                counts.drained,
                counts.unsaved,
                counts.late,
                counts.no_outcome
            ),
            (2, 1, 1, 1)
        );
        assert_eq!(counts.evictions(), 4);
        assert_eq!(counts.saved_share(), Some(0.5));
        assert_eq!(counts.mean_loss_seconds(), None);
        counts.count_loss(Duration::from_millis(2500));
        counts.count_loss(Duration::from_millis(500));
        assert_eq!(counts.mean_loss_seconds(), Some(1.5));
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
        assert_eq!((sum.unsaved, sum.losses, sum.lost_seconds), (1, 2, 3.0));
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
        assert_eq!((counts.unsaved, counts.losses), (0, 0));
        assert!(counts.job_lengths.is_empty());
        // Empty job lengths are left out of the document.
        let json = serde_json::to_value(counts).unwrap();
        assert!(json.get("job_lengths").is_none(), "{json}");
    }
}
