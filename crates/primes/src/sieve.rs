//! The arithmetic: a segmented sieve of Eratosthenes. The base primes (up to
//! the square root of the range's end) are found once; any sub-range is then
//! counted segment by segment in a fixed-size buffer, so memory stays small
//! whatever the range, and a long count can be stopped between segments.

/// Numbers sieved at once: 256 KiB of flags, which stays in a core's cache.
const SEGMENT_LEN: u64 = 1 << 18;

/// Counts the primes in `[start, end)` (0 if `start >= end`), with a
/// segmented sieve of Eratosthenes.
///
/// This is the reference the job's chunked, checkpointed count is checked
/// against: one pass over the whole range, no chunks, no storage. It needs
/// about `sqrt(end)` bytes for the base primes plus 256 KiB, and time
/// roughly proportional to `end - start`.
///
/// ```
/// use spot_worker_primes::count_primes;
///
/// assert_eq!(count_primes(0, 100), 25);
/// assert_eq!(count_primes(0, 1_000_000), 78_498);
/// assert_eq!(count_primes(2, 3), 1); // just 2
/// assert_eq!(count_primes(90, 97), 0); // 97 itself is excluded
/// assert_eq!(count_primes(10, 5), 0);
/// ```
pub fn count_primes(start: u64, end: u64) -> u64 {
    if start >= end {
        return 0;
    }
    // Never told to stop, so this is the whole range's count.
    BasePrimes::covering(end).count(start, end, || false).primes
}

/// How far a count got: the primes in `[lo, reached)`. `reached` is the
/// range's end unless the count was stopped, then a segment boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    pub(crate) reached: u64,
    pub(crate) primes: u64,
}

/// The odd primes whose squares are below `end`: all a sieve of any
/// sub-range of `[0, end)` needs. (Multiples of 2 are skipped by only ever
/// looking at odd numbers.)
#[derive(Clone, Debug)]
pub(crate) struct BasePrimes {
    end: u64,
    odd_primes: Vec<u32>,
}

impl BasePrimes {
    /// The base primes for ranges ending at or before `end`.
    pub(crate) fn covering(end: u64) -> Self {
        // Every composite n < end has a prime factor <= isqrt(end - 1), and
        // that root is below 2^32, so it fits a u32 and the flags fit memory.
        let root = end.saturating_sub(1).isqrt();
        let len = usize::try_from(root)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let mut composite = vec![false; len];
        let mut odd_primes = Vec::new();
        for n in (3..len).step_by(2) {
            if composite[n] {
                continue;
            }
            if let Ok(p) = u32::try_from(n) {
                odd_primes.push(p);
            }
            // Marking from n² is enough: smaller multiples have a smaller factor.
            let mut multiple = n.saturating_mul(n);
            while multiple < len {
                composite[multiple] = true;
                multiple += 2 * n;
            }
        }
        BasePrimes { end, odd_primes }
    }

    /// Counts the primes in `[lo, hi)`, calling `stop` before each segment
    /// and returning what was counted so far as soon as it says true (so a
    /// stopped count can still be saved). `hi` is capped at the end these
    /// base primes cover, since beyond it they would miss factors.
    pub(crate) fn count(&self, lo: u64, hi: u64, mut stop: impl FnMut() -> bool) -> Counted {
        let hi = hi.min(self.end);
        let mut counted = Counted {
            reached: lo,
            primes: 0,
        };
        if lo >= hi {
            return counted;
        }
        let buffer_len = usize::try_from((hi - lo).min(SEGMENT_LEN)).unwrap_or(0);
        let mut composite = vec![false; buffer_len];
        while counted.reached < hi {
            if stop() {
                break;
            }
            let seg_lo = counted.reached;
            let seg_hi = seg_lo.saturating_add(SEGMENT_LEN).min(hi);
            // 2 is the only even prime; segments only look at odd numbers.
            counted.primes += u64::from(seg_lo <= 2 && 2 < seg_hi)
                + self.count_segment(seg_lo, seg_hi, &mut composite);
            counted.reached = seg_hi;
        }
        counted
    }

    /// Odd primes in `[lo, hi)`, where `hi - lo <= composite.len()`.
    fn count_segment(&self, lo: u64, hi: u64, composite: &mut [bool]) -> u64 {
        let Ok(len) = usize::try_from(hi - lo) else {
            return 0;
        };
        let Some(composite) = composite.get_mut(..len) else {
            return 0;
        };
        composite.fill(false);
        for &p in &self.odd_primes {
            let p = u64::from(p);
            let square = p * p; // p < 2^32
            if square >= hi {
                break;
            }
            // The first odd multiple of p that is >= max(p², lo): even
            // multiples are never looked at.
            let mut first = square.max(lo.div_ceil(p).saturating_mul(p));
            if first.is_multiple_of(2) {
                first = first.saturating_add(p);
            }
            let (Ok(mut i), Ok(step)) = (usize::try_from(first - lo), usize::try_from(2 * p))
            else {
                continue;
            };
            while i < len {
                composite[i] = true;
                i += step;
            }
        }
        let first_odd = lo.max(3) | 1;
        let Ok(skip) = usize::try_from(first_odd - lo) else {
            return 0;
        };
        composite
            .iter()
            .skip(skip)
            .step_by(2)
            .filter(|&&is_composite| !is_composite)
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An oracle independent of the sieve.
    fn is_prime_by_trial_division(n: u64) -> bool {
        n >= 2
            && (2..)
                .take_while(|d| d * d <= n)
                .all(|d| !n.is_multiple_of(d))
    }

    fn count_by_trial_division(lo: u64, hi: u64) -> u64 {
        (lo..hi).filter(|&n| is_prime_by_trial_division(n)).count() as u64
    }

    #[test]
    fn known_values_of_the_prime_counting_function() {
        assert_eq!(count_primes(0, 0), 0);
        assert_eq!(count_primes(0, 2), 0);
        assert_eq!(count_primes(2, 3), 1);
        assert_eq!(count_primes(0, 3), 1);
        assert_eq!(count_primes(0, 4), 2);
        assert_eq!(count_primes(0, 10), 4);
        assert_eq!(count_primes(0, 1_000), 168);
        assert_eq!(count_primes(0, 1_000_000), 78_498);
        assert_eq!(count_primes(0, 10_000_000), 664_579);
        assert_eq!(count_primes(1_000_000, 10_000_000), 664_579 - 78_498);
    }

    #[test]
    fn matches_trial_division_across_segment_edges_and_prime_squares() {
        let edge = SEGMENT_LEN;
        let ranges = [
            (0, 5_000),
            (1, 2),
            (3, 4),
            (4, 5),
            (24, 26),       // 25 = 5²
            (120, 122),     // 121 = 11²
            (9_400, 9_410), // 9409 = 97²
            (edge - 50, edge + 50),
            (2 * edge - 1, 2 * edge + 1),
            (3 * edge - 333, 4 * edge + 333),
            (1_000_000_000, 1_000_000_500),
        ];
        for (lo, hi) in ranges {
            assert_eq!(
                count_primes(lo, hi),
                count_by_trial_division(lo, hi),
                "[{lo}, {hi})"
            );
        }
    }

    #[test]
    fn counting_in_chunks_adds_up_whatever_the_boundaries() {
        let end = 2_000;
        let base = BasePrimes::covering(end);
        let expected = count_by_trial_division(0, end);
        // Chunk sizes whose boundaries fall on primes (7, 97), next to them,
        // and on single numbers.
        for chunk in [1, 2, 3, 7, 10, 96, 97, 98, 1_999, 5_000] {
            let total: u64 = (0..end)
                .step_by(chunk)
                .map(|lo| base.count(lo, lo + chunk as u64, || false).primes)
                .sum();
            assert_eq!(total, expected, "chunk {chunk}");
        }
    }

    #[test]
    fn a_stopped_count_reports_how_far_it_got() {
        let (lo, hi) = (1, 10 * SEGMENT_LEN);
        let base = BasePrimes::covering(hi);
        let mut segments = 0;
        let stopped = base.count(lo, hi, || {
            segments += 1;
            segments > 3
        });
        assert_eq!(
            segments, 4,
            "three segments counted, stopped before the fourth"
        );
        assert_eq!(stopped.reached, lo + 3 * SEGMENT_LEN);
        assert_eq!(stopped.primes, count_primes(lo, stopped.reached));
        let immediately = base.count(lo, hi, || true);
        assert_eq!((immediately.reached, immediately.primes), (lo, 0));
        let whole = base.count(lo, hi, || false);
        assert_eq!((whole.reached, whole.primes), (hi, count_primes(lo, hi)));
    }

    #[test]
    fn ranges_beyond_the_covered_end_are_cut_at_it() {
        let base = BasePrimes::covering(100);
        let counted = base.count(90, 1_000, || false);
        assert_eq!((counted.reached, counted.primes), (100, 1)); // 97
    }
}
