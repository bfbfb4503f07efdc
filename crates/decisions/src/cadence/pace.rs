//! [`time_left`]: how long the rest of a job will take at the pace seen so
//! far, what a job that knows how far it is tells the checkpoint interval
//! ([`CheckpointCadence::is_due_before_end`](super::CheckpointCadence::is_due_before_end))
//! so its saves are spread over the job instead of one falling just before
//! its end. Shared by handlers that count their work (the primes example)
//! and the command runner, which reads a program's progress fraction. A
//! pure function.

use std::time::Duration;

/// The time `left` more work takes if it goes as fast as the `done` work
/// of this delivery went in `elapsed` (in any unit: numbers sieved, a
/// fraction of the job); `None` until some was done (no pace to go by), or
/// for amounts that are not finite, or negative. A delivery's own average
/// is the guess: a slower or faster machine after a resume measures its
/// own.
pub fn time_left(done: f64, elapsed: Duration, left: f64) -> Option<Duration> {
    if !(done.is_finite() && left.is_finite()) || done <= 0.0 || left < 0.0 {
        return None;
    }
    let seconds = elapsed.as_secs_f64() * (left / done);
    // Saturates rather than panicking on a pace too slow to represent.
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_takes_as_long_as_the_pace_so_far_says() {
        let s = Duration::from_secs;
        let cases = [
            // (done, elapsed, left, expected)
            (0.0, s(10), 1_000.0, None),
            (-0.1, s(10), 0.5, None),
            (0.1, s(10), -0.5, None),
            (f64::NAN, s(10), 0.5, None),
            (0.1, s(10), f64::INFINITY, None),
            (1_000.0, s(10), 0.0, Some(s(0))),
            (1_000.0, s(10), 1_000.0, Some(s(10))),
            (1_000.0, s(10), 3_000.0, Some(s(30))),
            (4_000.0, s(10), 1_000.0, Some(Duration::from_millis(2_500))),
            (0.25, s(10), 0.5, Some(s(20))),
            (1.0, s(u64::MAX / 2), u64::MAX as f64, Some(Duration::MAX)),
        ];
        for (done, elapsed, left, expected) in cases {
            assert_eq!(
                time_left(done, elapsed, left),
                expected,
                "done {done} in {elapsed:?}, {left} left"
            );
        }
    }
}
