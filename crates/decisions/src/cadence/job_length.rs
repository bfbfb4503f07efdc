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
//! minute to about 38 days), each with its count and the sum of its
//! lengths, so the mean of a bin is exact (jobs of one length fall in one
//! bin, and their mean is their length) and two workers' histograms merge
//! by summing, like the rest of the fleet's counts. Pure.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many bins the histogram has.
pub const BINS: usize = 64;

/// The upper edge of the first bin: jobs shorter than a minute share it.
const FIRST_EDGE_SECONDS: f64 = 60.0;

/// Bins per doubling of the length.
const BINS_PER_OCTAVE: f64 = 4.0;

/// How many finished jobs longer than a job's work so far the expectation
/// needs: with fewer, one odd job would set where every job saves, and
/// the job is treated as one of unknown end.
pub const MIN_JOBS_BEYOND: u64 = 10;

/// The lengths of the fleet's finished jobs: a histogram that merges by
/// summing (see the module documentation).
#[derive(Clone, Copy, PartialEq)]
pub struct JobLengths {
    counts: [u64; BINS],
    seconds: [f64; BINS],
}

/// The bins that hold jobs, as `bin: count × mean s`.
impl std::fmt::Debug for JobLengths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut bins = f.debug_map();
        for bin in (0..BINS).filter(|bin| self.counts[*bin] > 0) {
            let mean = self.seconds[bin] / self.counts[bin] as f64;
            bins.entry(&bin, &format_args!("{} × {mean:.1} s", self.counts[bin]));
        }
        bins.finish()
    }
}

impl Default for JobLengths {
    fn default() -> Self {
        JobLengths {
            counts: [0; BINS],
            seconds: [0.0; BINS],
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
        }
        sum
    }

    /// Whether no job was counted.
    pub fn is_empty(&self) -> bool {
        self.jobs() == 0
    }

    /// The work a job that has done `done` is expected to have left: the
    /// mean, over the finished jobs that were longer, of how much longer
    /// they were (each bin taken at its mean). `None` when fewer than
    /// [`MIN_JOBS_BEYOND`] finished jobs were longer: a job past what the
    /// fleet has seen has an unknown end.
    pub fn expected_left(&self, done: Duration) -> Option<Duration> {
        let done = done.as_secs_f64();
        let (mut jobs, mut left) = (0u64, 0.0);
        for bin in 0..BINS {
            let count = self.counts[bin];
            if count == 0 {
                continue;
            }
            let mean = self.seconds[bin] / count as f64;
            if mean > done {
                jobs = jobs.saturating_add(count);
                left += count as f64 * (mean - done);
            }
        }
        (jobs >= MIN_JOBS_BEYOND).then(|| Duration::from_secs_f64(left / jobs as f64))
    }
}

/// One bin as stored: its index, count and sum of lengths in seconds.
type StoredBin = (usize, u64, f64);

/// Stored sparse, as the bins that hold jobs: `[[bin, count, seconds], …]`.
impl Serialize for JobLengths {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bins: Vec<StoredBin> = (0..BINS)
            .filter(|bin| self.counts[*bin] > 0)
            .map(|bin| (bin, self.counts[bin], self.seconds[bin]))
            .collect();
        bins.serialize(serializer)
    }
}

/// A bin out of range, or a sum that is not a finite, positive number,
/// is skipped: a document another version wrote loses that bin, not the
/// rest of the counts.
impl<'de> Deserialize<'de> for JobLengths {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bins = Vec::<StoredBin>::deserialize(deserializer)?;
        let mut lengths = JobLengths::default();
        for (bin, count, seconds) in bins {
            if bin < BINS && seconds.is_finite() && seconds >= 0.0 {
                lengths.counts[bin] = lengths.counts[bin].saturating_add(count);
                lengths.seconds[bin] += seconds;
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
            // Too few jobs longer than what is done.
            (&[(2.0, 50), (8.0, 9)], 3.0, None),
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
        let odd = serde_json::json!([[1000, 1, 5.0], [3, 2, -1.0], [2, 1, 72.0]]);
        let read: JobLengths = serde_json::from_value(odd).unwrap();
        assert_eq!(read.jobs(), 1);
        // Nonsense lengths add nothing.
        let mut lengths = JobLengths::default();
        lengths.add(Duration::ZERO);
        assert!(lengths.is_empty());
        assert_eq!(lengths.mean(), None);
    }
}
