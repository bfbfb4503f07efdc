//! How long the rest of a job will take, at the pace seen so far: what a
//! job that knows its end tells the checkpoint interval
//! ([`JobCheckpoint::is_due_before_end`](spot_worker_storage::JobCheckpoint::is_due_before_end)),
//! so its saves are spread over the job instead of one falling just
//! before the end.

use std::time::Duration;

/// The time `left` more numbers take if they go as fast as the `done`
/// numbers of this delivery went in `elapsed`; `None` until some were done
/// (no pace to go by). A sieve's pace barely changes along a range, so
/// this delivery's own average is a fair guess (a slower or faster machine
/// after a resume measures its own).
pub(crate) fn time_left(done: u64, elapsed: Duration, left: u64) -> Option<Duration> {
    if done == 0 {
        return None;
    }
    let seconds = elapsed.as_secs_f64() * left as f64 / done as f64;
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
            (0, s(10), 1_000, None),
            (1_000, s(10), 0, Some(s(0))),
            (1_000, s(10), 1_000, Some(s(10))),
            (1_000, s(10), 3_000, Some(s(30))),
            (4_000, s(10), 1_000, Some(Duration::from_millis(2_500))),
            (1, s(u64::MAX / 2), u64::MAX, Some(Duration::MAX)),
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
