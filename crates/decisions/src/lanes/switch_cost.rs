//! [`switch_cost`]: d, the time a job loses each time it changes machine,
//! from what the fleet measures, with a stated prior.
//!
//! A switch (an eviction and the start elsewhere, or a move between
//! lanes) costs a job four things, each measured where it happens and
//! averaged over the switches that showed it:
//!
//! - **queue wait**: from the job's release (or its move to a lane) until
//!   a worker takes it, scale-from-zero included;
//! - **start-up**: from that worker's receive until its handler starts
//!   (the goodput ledger's `waiting`, once the VM is up);
//! - **restore**: reading the job's checkpoint back;
//! - **lost work**: the work an interruption throws away, done again
//!   after the restart (the ledger's `redone`, per interruption).
//!
//! Each part's estimate is the posterior mean of its samples with the
//! seed counting as [`SEED_WEIGHT_SWITCHES`] samples: (w·seed + total) /
//! (w + count). A fresh fleet uses the seed; after a few dozen switches
//! the fleet's own figures dominate. d is the sum of the four
//! ([`SwitchCostParts::total`]).
//!
//! The seed, [`DEFAULT_SWITCH_COST_SEED`], is 6 minutes (0.1 h), between
//! the 0.05 h and 0.2 h of the paper's evaluation ("Can't Be Late",
//! NSDI 2024, §6): 3 min of queue wait (an autoscale rule's evaluation and
//! a VM's provisioning, when the pool is at zero), 1 min of start-up
//! (image pull, warmup), 30 s of restore, 90 s of lost work (half of a
//! 3-minute stretch between saves).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many samples the seed counts for, in each part: 4.
pub const SEED_WEIGHT_SWITCHES: u64 = 4;

/// The seed: 6 minutes in all (see the module documentation).
pub const DEFAULT_SWITCH_COST_SEED: SwitchCostParts = SwitchCostParts {
    queue_wait: Duration::from_secs(180),
    start_up: Duration::from_secs(60),
    restore: Duration::from_secs(30),
    lost_work: Duration::from_secs(90),
};

/// What one switch costs a job, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchCostParts {
    /// From release until a worker takes the job.
    pub queue_wait: Duration,
    /// From the receive until the handler starts.
    pub start_up: Duration,
    /// Reading the checkpoint back.
    pub restore: Duration,
    /// Work lost by the interruption, done again.
    pub lost_work: Duration,
}

impl SwitchCostParts {
    /// These parts in the same proportions, scaled so that they add up to
    /// `total`: a seed of another size than the default's 6 minutes (the
    /// `SPOT_WORKER_SWITCH_COST` setting). Parts that add up to nothing
    /// are split like [`DEFAULT_SWITCH_COST_SEED`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use spot_worker_decisions::lanes::DEFAULT_SWITCH_COST_SEED;
    ///
    /// let seed = DEFAULT_SWITCH_COST_SEED.scaled_to(Duration::from_secs(36));
    /// assert_eq!(seed.queue_wait, Duration::from_secs(18));
    /// assert_eq!(seed.total(), Duration::from_secs(36));
    /// ```
    pub fn scaled_to(&self, total: Duration) -> SwitchCostParts {
        let base = if self.total().is_zero() {
            DEFAULT_SWITCH_COST_SEED
        } else {
            *self
        };
        let ratio = total.as_secs_f64() / base.total().as_secs_f64();
        let scale = |part: Duration| {
            Duration::try_from_secs_f64(part.as_secs_f64() * ratio).unwrap_or(Duration::MAX)
        };
        SwitchCostParts {
            queue_wait: scale(base.queue_wait),
            start_up: scale(base.start_up),
            restore: scale(base.restore),
            lost_work: scale(base.lost_work),
        }
    }

    /// d: the four parts together.
    pub fn total(&self) -> Duration {
        self.queue_wait
            .saturating_add(self.start_up)
            .saturating_add(self.restore)
            .saturating_add(self.lost_work)
    }
}

/// The samples of one part: their sum and how many there were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Samples {
    /// The sum of the samples, in milliseconds.
    #[serde(default)]
    pub total_ms: u64,
    /// How many samples.
    #[serde(default)]
    pub count: u64,
}

impl Samples {
    /// These samples and one more.
    pub fn with(self, sample: Duration) -> Samples {
        let ms = u64::try_from(sample.as_millis()).unwrap_or(u64::MAX);
        Samples {
            total_ms: self.total_ms.saturating_add(ms),
            count: self.count.saturating_add(1),
        }
    }

    /// These samples and `other`'s, as one fleet adds up its workers'.
    pub fn plus(self, other: Samples) -> Samples {
        Samples {
            total_ms: self.total_ms.saturating_add(other.total_ms),
            count: self.count.saturating_add(other.count),
        }
    }

    /// The posterior mean with `seed` counting as `weight` samples.
    fn mean_with(self, seed: Duration, weight: u64) -> Duration {
        let weight = weight as f64;
        let seconds = (weight * seed.as_secs_f64() + self.total_ms as f64 / 1000.0)
            / (weight + self.count as f64);
        if seconds.is_finite() {
            Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
        } else {
            // No seed weight and no samples: nothing to go by but the seed.
            seed
        }
    }
}

/// What the fleet measured of its switches, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchSamples {
    /// Queue waits after a release or a move.
    #[serde(default)]
    pub queue_wait: Samples,
    /// Start-ups of a delivery that resumes a job.
    #[serde(default)]
    pub start_up: Samples,
    /// Checkpoint reads at a resume.
    #[serde(default)]
    pub restore: Samples,
    /// Work lost per interruption.
    #[serde(default)]
    pub lost_work: Samples,
}

impl SwitchSamples {
    /// Whether no part has a sample.
    pub fn is_empty(&self) -> bool {
        *self == SwitchSamples::default()
    }

    /// These samples and `other`'s, part by part, as one fleet adds up
    /// its workers'.
    pub fn plus(&self, other: &SwitchSamples) -> SwitchSamples {
        SwitchSamples {
            queue_wait: self.queue_wait.plus(other.queue_wait),
            start_up: self.start_up.plus(other.start_up),
            restore: self.restore.plus(other.restore),
            lost_work: self.lost_work.plus(other.lost_work),
        }
    }
}

/// d by part: each part's posterior mean, the `seed` counting as
/// [`SEED_WEIGHT_SWITCHES`] samples of it (see the module documentation).
/// `.total()` is the d the lane rule takes.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_decisions::lanes::{switch_cost, Samples, SwitchSamples, DEFAULT_SWITCH_COST_SEED};
///
/// // A fresh fleet: the seed, 6 minutes.
/// let fresh = switch_cost(&DEFAULT_SWITCH_COST_SEED, &SwitchSamples::default());
/// assert_eq!(fresh.total(), Duration::from_secs(360));
///
/// // 96 queue waits of 10 minutes (a slow scale-from-zero): that part is
/// // (4 × 3 + 96 × 10) / 100 = 9.72 minutes, and d grows with it.
/// let mut measured = SwitchSamples::default();
/// for _ in 0..96 {
///     measured.queue_wait = measured.queue_wait.with(Duration::from_secs(600));
/// }
/// let learned = switch_cost(&DEFAULT_SWITCH_COST_SEED, &measured);
/// assert_eq!(learned.queue_wait, Duration::from_secs_f64(583.2));
/// assert_eq!(learned.total(), Duration::from_secs_f64(583.2 + 180.0));
/// ```
pub fn switch_cost(seed: &SwitchCostParts, measured: &SwitchSamples) -> SwitchCostParts {
    let w = SEED_WEIGHT_SWITCHES;
    SwitchCostParts {
        queue_wait: measured.queue_wait.mean_with(seed.queue_wait, w),
        start_up: measured.start_up.mean_with(seed.start_up, w),
        restore: measured.restore.mean_with(seed.restore, w),
        lost_work: measured.lost_work.mean_with(seed.lost_work, w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(seconds_each: u64, count: u64) -> Samples {
        Samples {
            total_ms: seconds_each * 1000 * count,
            count,
        }
    }

    #[test]
    fn each_part_moves_from_the_seed_to_the_fleets_mean() {
        let seed = DEFAULT_SWITCH_COST_SEED;
        let rows = [
            // (queue-wait samples: seconds each, count) → that part, seconds
            ((0, 0), 180.0),
            // One sample of 60 s against four of 180: 156.
            ((60, 1), 156.0),
            // As many samples as the seed's weight: half-way.
            ((60, 4), 120.0),
            // A long history: nearly the fleet's own mean.
            ((60, 396), 61.2),
            // Instant starts (a warm pool) pull d down, never below zero.
            ((0, 1_000), 180.0 * 4.0 / 1_004.0),
        ];
        for ((each, count), expected) in rows {
            let parts = switch_cost(
                &seed,
                &SwitchSamples {
                    queue_wait: samples(each, count),
                    ..SwitchSamples::default()
                },
            );
            let got = parts.queue_wait.as_secs_f64();
            assert!(
                (got - expected).abs() < 1e-6,
                "{count} × {each} s: got {got}"
            );
            // The other parts stay at the seed.
            assert_eq!(
                parts.total().as_secs_f64() - got,
                seed.total().as_secs_f64() - 180.0
            );
        }
    }

    #[test]
    fn a_seed_scales_in_proportion_and_samples_add_up_by_part() {
        // (total asked, seconds) → the parts in the default's proportions
        let rows = [
            (360.0, [180.0, 60.0, 30.0, 90.0]),
            (3.6, [1.8, 0.6, 0.3, 0.9]),
            (0.0, [0.0, 0.0, 0.0, 0.0]),
        ];
        for (total, [q, s, r, l]) in rows {
            let parts = DEFAULT_SWITCH_COST_SEED.scaled_to(Duration::from_secs_f64(total));
            let got = [
                parts.queue_wait.as_secs_f64(),
                parts.start_up.as_secs_f64(),
                parts.restore.as_secs_f64(),
                parts.lost_work.as_secs_f64(),
            ];
            for (got, want) in got.into_iter().zip([q, s, r, l]) {
                assert!((got - want).abs() < 1e-6, "{total}: {got} vs {want}");
            }
        }
        // A zero seed scales like the default one.
        let from_zero = SwitchCostParts::default().scaled_to(Duration::from_secs(36));
        assert_eq!(from_zero.queue_wait, Duration::from_secs(18));
        let one = SwitchSamples {
            restore: samples(2, 1),
            ..SwitchSamples::default()
        };
        assert!(SwitchSamples::default().is_empty() && !one.is_empty());
        assert_eq!(one.plus(&one).restore, samples(2, 2));
        assert_eq!(one.plus(&one).queue_wait, Samples::default());
    }

    #[test]
    fn the_seed_is_six_minutes_and_samples_add_up() {
        assert_eq!(DEFAULT_SWITCH_COST_SEED.total(), Duration::from_secs(360));
        let one = Samples::default().with(Duration::from_millis(1_500));
        assert_eq!(
            one,
            Samples {
                total_ms: 1_500,
                count: 1
            }
        );
        assert_eq!(
            one.plus(one),
            Samples {
                total_ms: 3_000,
                count: 2
            }
        );
        // Saturates instead of overflowing.
        let huge = Samples::default().with(Duration::MAX).with(Duration::MAX);
        assert_eq!(huge.total_ms, u64::MAX);
        let parts = switch_cost(
            &SwitchCostParts::default(),
            &SwitchSamples {
                lost_work: huge,
                ..SwitchSamples::default()
            },
        );
        assert!(parts.lost_work > Duration::from_secs(1_000_000));
        assert_eq!(parts.total(), parts.lost_work);
        // A document from an older worker reads with what it has.
        let read: SwitchSamples =
            serde_json::from_value(serde_json::json!({"restore": {"total_ms": 2000, "count": 2}}))
                .unwrap();
        assert_eq!(
            read.restore,
            Samples {
                total_ms: 2_000,
                count: 2
            }
        );
        assert_eq!(read.queue_wait, Samples::default());
    }
}
