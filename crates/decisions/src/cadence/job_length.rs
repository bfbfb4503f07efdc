//! [`JobLengths`]: how much work the fleet's finished jobs took, so that a
//! job that says nothing about its end can still have its saves spread
//! over the rest it is expected to need ([`JobLengths::expected_left`]),
//! rather than one falling just before its end (see
//! [`super::finite`]).
//!
//! A job's length is the work it needed: the useful time of its goodput
//! ledger when it finished (`spot_worker_decisions::goodput`), redone,
//! checkpointing and waiting left out. The lengths are kept as a histogram
//! of [`BINS`] log-spaced bins (each a quarter of an octave wide, from a
//! minute to about 38 days), each with its count, the sum of its lengths
//! and the sum of their squares, so two workers' histograms merge by
//! summing, like the rest of the fleet's counts, and each bin has an exact
//! mean and spread: jobs of one length fall in one bin, with that length
//! as its mean.
//!
//! The rest a job that has done `d` is expected to need is the mean excess
//! over `d` of the finished jobs longer than `d`, each bin taken as a
//! normal distribution of its mean and spread (a point where all its jobs
//! were as long): jobs that all take about as long, give or take a little,
//! are expected to end soon once they pass their mean, not to run on
//! without end. Pure.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many bins the histogram has.
pub const BINS: usize = 64;

/// The upper edge of the first bin: jobs shorter than a minute share it.
const FIRST_EDGE_SECONDS: f64 = 60.0;

/// Bins per doubling of the length.
const BINS_PER_OCTAVE: f64 = 4.0;

/// How many finished jobs the fleet must have seen before their lengths
/// say anything: with fewer, one odd job would set where every job saves.
pub const MIN_JOBS: u64 = 10;

/// How many of the finished jobs, at least, must have been longer than a
/// job's work so far (counted as the share of each bin's distribution
/// beyond it): a job past nearly every one the fleet has seen has an
/// unknown end.
const MIN_JOBS_BEYOND: f64 = 1.0;

/// The lengths of the fleet's finished jobs: a histogram that merges by
/// summing (see the module documentation).
#[derive(Clone, Copy, PartialEq)]
pub struct JobLengths {
    counts: [u64; BINS],
    seconds: [f64; BINS],
    squares: [f64; BINS],
}

/// The bins that hold jobs, as `bin: count × mean ± spread s`.
impl std::fmt::Debug for JobLengths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut bins = f.debug_map();
        for bin in (0..BINS).filter(|bin| self.counts[*bin] > 0) {
            let (mean, spread) = self.mean_and_spread(bin);
            bins.entry(
                &bin,
                &format_args!("{} × {mean:.1} ± {spread:.1} s", self.counts[bin]),
            );
        }
        bins.finish()
    }
}

impl Default for JobLengths {
    fn default() -> Self {
        JobLengths {
            counts: [0; BINS],
            seconds: [0.0; BINS],
            squares: [0.0; BINS],
        }
    }
}

/// The bin of a job of `seconds` of work.
fn bin_of(seconds: f64) -> usize {
    if seconds < FIRST_EDGE_SECONDS {
        return 0;
    }
    let octaves = (seconds / FIRST_EDGE_SECONDS).log2();
    // `as` saturates; a length past the last edge is in the last bin.
    (1 + (octaves * BINS_PER_OCTAVE) as usize).min(BINS - 1)
}

impl JobLengths {
    /// One more finished job of `work`; a length that is not a finite,
    /// positive number of seconds adds nothing.
    pub fn add(&mut self, work: Duration) {
        let seconds = work.as_secs_f64();
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let bin = bin_of(seconds);
        self.counts[bin] = self.counts[bin].saturating_add(1);
        self.seconds[bin] += seconds;
        self.squares[bin] += seconds * seconds;
    }

    /// The jobs counted.
    pub fn jobs(&self) -> u64 {
        self.counts
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(*n))
    }

    /// Their mean length; `None` before the first.
    pub fn mean(&self) -> Option<Duration> {
        let jobs = self.jobs();
        (jobs > 0).then(|| Duration::from_secs_f64(self.seconds.iter().sum::<f64>() / jobs as f64))
    }

    /// These lengths and `other`'s.
    pub fn plus(&self, other: &JobLengths) -> JobLengths {
        let mut sum = *self;
        for bin in 0..BINS {
            sum.counts[bin] = sum.counts[bin].saturating_add(other.counts[bin]);
            sum.seconds[bin] += other.seconds[bin];
            sum.squares[bin] += other.squares[bin];
        }
        sum
    }

    /// Whether no job was counted.
    pub fn is_empty(&self) -> bool {
        self.jobs() == 0
    }

    /// The mean and standard deviation of the lengths in `bin`, seconds.
    fn mean_and_spread(&self, bin: usize) -> (f64, f64) {
        let count = self.counts[bin].max(1) as f64;
        let mean = self.seconds[bin] / count;
        let variance = (self.squares[bin] / count - mean * mean).max(0.0);
        (mean, variance.sqrt())
    }

    /// The work a job that has done `done` is expected to have left: the
    /// mean excess over `done` of the finished jobs that were longer (see
    /// the module documentation). `None` before [`MIN_JOBS`] finished, or
    /// when fewer than one of them was longer: a job past what the fleet
    /// has seen has an unknown end.
    pub fn expected_left(&self, done: Duration) -> Option<Duration> {
        if self.jobs() < MIN_JOBS {
            return None;
        }
        let done = done.as_secs_f64();
        let (mut beyond, mut left) = (0.0, 0.0);
        for bin in (0..BINS).filter(|bin| self.counts[*bin] > 0) {
            let (mean, spread) = self.mean_and_spread(bin);
            let (share, excess) = longer_than(mean, spread, done);
            let jobs = self.counts[bin] as f64 * share;
            beyond += jobs;
            left += jobs * excess;
        }
        (beyond >= MIN_JOBS_BEYOND && left.is_finite())
            .then(|| Duration::from_secs_f64(left / beyond))
    }
}

/// Of lengths normally distributed with `mean` and `spread` (all of them
/// `mean` if the spread is nothing), the share longer than `done`, and how
/// much longer they are on average: `spread·(λ(z) − z)` with `z` the
/// standard score of `done` and λ the inverse Mills ratio φ/(1 − Φ).
fn longer_than(mean: f64, spread: f64, done: f64) -> (f64, f64) {
    if spread <= mean * 1e-9 {
        return if mean > done {
            (1.0, mean - done)
        } else {
            (0.0, 0.0)
        };
    }
    let z = (done - mean) / spread;
    // Beyond 30 standard deviations nothing is left (and φ underflows).
    if z > 30.0 {
        return (0.0, 0.0);
    }
    let share = 0.5 * erfc(z / std::f64::consts::SQRT_2);
    let density = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (share, (spread * (density / share - z)).max(0.0))
}

/// The complementary error function, to a relative error below 1.2·10⁻⁷
/// everywhere (the Chebyshev fit of *Numerical Recipes*, `erfcc`): the
/// tail of a distribution far past its mean stays exact enough to weigh.
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let poly = -1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let tail = t * (-x * x + poly).exp();
    if x >= 0.0 { tail } else { 2.0 - tail }
}

/// One bin as stored: its index, count, and the sums of its lengths and
/// their squares in seconds.
type StoredBin = (usize, u64, f64, f64);

/// Stored sparse, as the bins that hold jobs: `[[bin, count, seconds,
/// squares], …]`.
impl Serialize for JobLengths {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bins: Vec<StoredBin> = (0..BINS)
            .filter(|bin| self.counts[*bin] > 0)
            .map(|bin| (bin, self.counts[bin], self.seconds[bin], self.squares[bin]))
            .collect();
        bins.serialize(serializer)
    }
}

/// A bin out of range, or sums that are not finite, positive numbers, is
/// skipped: a document another version wrote loses that bin, not the rest
/// of the counts.
impl<'de> Deserialize<'de> for JobLengths {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bins = Vec::<StoredBin>::deserialize(deserializer)?;
        let mut lengths = JobLengths::default();
        let sane = |x: f64| x.is_finite() && x >= 0.0;
        for (bin, count, seconds, squares) in bins {
            if bin < BINS && sane(seconds) && sane(squares) {
                lengths.counts[bin] = lengths.counts[bin].saturating_add(count);
                lengths.seconds[bin] += seconds;
                lengths.squares[bin] += squares;
            }
        }
        Ok(lengths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hours(h: f64) -> Duration {
        Duration::from_secs_f64(h * 3600.0)
    }

    fn of(jobs: &[(f64, u64)]) -> JobLengths {
        let mut lengths = JobLengths::default();
        for (h, n) in jobs {
            for _ in 0..*n {
                lengths.add(hours(*h));
            }
        }
        lengths
    }

    #[test]
    fn bins_are_quarter_octaves_from_a_minute() {
        // (seconds, bin)
        let rows = [
            (1.0, 0),
            (59.9, 0),
            (60.0, 1),
            (71.0, 1),
            // 60·2^¼ = 71.35
            (71.4, 2),
            (120.0, 5),
            (8.0 * 3600.0, 1 + (4.0 * (480.0_f64).log2()) as usize),
            (1e12, BINS - 1),
        ];
        for (seconds, bin) in rows {
            assert_eq!(bin_of(seconds), bin, "{seconds} s");
        }
    }

    /// Finished jobs: their length in hours, and how many.
    type Finished = &'static [(f64, u64)];

    #[test]
    fn the_rest_expected_is_the_mean_over_the_longer_jobs() {
        // (finished jobs: hours and how many, done h, expected left h)
        let rows: [(Finished, f64, Option<f64>); 8] = [
            // Nothing seen: unknown.
            (&[], 0.0, None),
            // All 8 h: the rest of 8 h, exactly.
            (&[(8.0, 20)], 0.0, Some(8.0)),
            (&[(8.0, 20)], 5.5, Some(2.5)),
            // Past every job seen: unknown.
            (&[(8.0, 20)], 8.0, None),
            // Half 2 h, half 8 h: from the start, 5 h; past 2 h, the 8 h ones.
            (&[(2.0, 10), (8.0, 10)], 0.0, Some(5.0)),
            (&[(2.0, 10), (8.0, 10)], 3.0, Some(5.0)),
            // Too few jobs seen at all.
            (&[(8.0, 9)], 0.0, None),
            (
                &[(2.0, 50), (8.0, 9)],
                1.0,
                Some((50.0 * 1.0 + 9.0 * 7.0) / 59.0),
            ),
        ];
        for (jobs, done, expected) in rows {
            let got = of(jobs)
                .expected_left(hours(done))
                .map(|left| left.as_secs_f64() / 3600.0);
            match (got, expected) {
                (Some(got), Some(expected)) => {
                    assert!((got - expected).abs() < 1e-9, "{jobs:?} at {done} h: {got}");
                }
                _ => assert_eq!(got, expected, "{jobs:?} at {done} h"),
            }
        }
    }

    /// Jobs of about 8 hours, give or take a few minutes: one past 8
    /// hours is expected to end within minutes, not to run on unknown.
    #[test]
    fn a_job_past_the_typical_length_is_expected_to_end_soon() {
        let mut lengths = JobLengths::default();
        for i in 0..21 {
            lengths.add(hours(7.9 + 0.01 * f64::from(i)));
        }
        let left = |h: f64| {
            lengths
                .expected_left(hours(h))
                .map(|left| left.as_secs_f64() / 60.0)
        };
        // From the start: the mean, 8 hours.
        assert!((left(0.0).unwrap() - 480.0).abs() < 1e-6, "{:?}", left(0.0));
        // At the mean: σ·φ(0)/½ = 0.798 σ, σ = 3.6 minutes.
        let spread = (0.01_f64 * 0.01 * (21.0 * 21.0 - 1.0) / 12.0).sqrt() * 60.0;
        assert!(
            (left(8.0).unwrap() - 0.797_885 * spread).abs() < 1e-3,
            "{:?}",
            left(8.0)
        );
        // Past it: less still, then unknown.
        assert!(left(8.1).unwrap() < left(8.0).unwrap());
        assert_eq!(left(8.5), None);
    }

    #[test]
    fn the_tail_of_a_bin_and_its_mean_excess() {
        // (mean, spread, done, share longer, their mean excess)
        let rows = [
            // No spread: all of them, or none.
            (10.0, 0.0, 5.0, 1.0, 5.0),
            (10.0, 0.0, 10.0, 0.0, 0.0),
            // At the mean: half, 2·φ(0)/½ on.
            (10.0, 2.0, 10.0, 0.5, 2.0 * 0.797_884_56),
            // One σ past: 15.87 %, 2·(φ(1)/0.158655 − 1) on.
            (
                10.0,
                2.0,
                12.0,
                0.158_655_25,
                2.0 * (0.241_970_72 / 0.158_655_25 - 1.0),
            ),
            // Far before: all, the mean's distance on.
            (10.0, 2.0, 0.0, 0.999_999_71, 10.000_003),
            // Far past: nothing.
            (10.0, 2.0, 80.0, 0.0, 0.0),
        ];
        for (mean, spread, done, share, excess) in rows {
            let (got_share, got_excess) = longer_than(mean, spread, done);
            assert!(
                (got_share - share).abs() < 1e-6 && (got_excess - excess).abs() < 1e-5,
                "N({mean}, {spread}²) past {done}: {got_share}, {got_excess}"
            );
        }
        // (x, erfc(x)), to the fit's relative error.
        for (x, expected) in [
            (0.0, 1.0),
            (1.0, 0.157_299_207),
            (-1.0, 1.842_700_793),
            (3.0, 2.209_049_70e-5),
            (5.0, 1.537_459_79e-12),
        ] {
            let got = erfc(x);
            assert!((got / expected - 1.0).abs() < 2e-7, "erfc({x}) = {got}");
        }
    }

    #[test]
    fn lengths_merge_by_summing_and_round_trip_sparse() {
        let a = of(&[(8.0, 3), (0.01, 2)]);
        let b = of(&[(8.0, 1), (30.0 * 24.0, 1)]);
        let sum = a.plus(&b);
        assert_eq!(sum.jobs(), 7);
        assert!(
            ((sum.mean().unwrap().as_secs_f64() / 3600.0) - (32.02 + 720.0) / 7.0).abs() < 1e-9
        );
        let json = serde_json::to_value(sum).unwrap();
        assert_eq!(json.as_array().unwrap().len(), 3, "{json}");
        assert_eq!(serde_json::from_value::<JobLengths>(json).unwrap(), sum);
        // Odd bins are skipped, the rest kept.
        let odd = serde_json::json!([
            [1000, 1, 5.0, 25.0],
            [3, 2, -1.0, 1.0],
            [2, 1, 72.0, 5184.0]
        ]);
        let read: JobLengths = serde_json::from_value(odd).unwrap();
        assert_eq!(read.jobs(), 1);
        // Nonsense lengths add nothing.
        let mut lengths = JobLengths::default();
        lengths.add(Duration::ZERO);
        assert!(lengths.is_empty());
        assert_eq!(lengths.mean(), None);
    }
}
