//! Delays with jitter: the idle-polling backoff (so an empty queue is not
//! hammered, yet a new message is picked up quickly) and the retry delay
//! after a failed attempt. Jitter keeps a fleet of VMs from polling in step.

use std::time::Duration;

use crate::clock::Clock;

/// Exponential backoff for polling an empty queue: starts at `floor`,
/// doubles up to `max`, and is reset as soon as a message arrives.
#[derive(Debug, Clone)]
pub struct IdleBackoff {
    floor: Duration,
    max: Duration,
    current: Duration,
}

impl IdleBackoff {
    /// Starts at `floor` and doubles up to `max` (at least `floor`).
    pub fn new(floor: Duration, max: Duration) -> Self {
        IdleBackoff {
            floor,
            max: max.max(floor),
            current: floor,
        }
    }

    /// The next delay: uniform in [current/2, current], then current doubles.
    pub fn next_delay(&mut self, clock: &dyn Clock) -> Duration {
        let delay = jittered(self.current, clock);
        self.current = self.current.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the floor, because the queue just had work.
    pub fn reset(&mut self) {
        self.current = self.floor;
    }
}

/// How long a failed message stays invisible before its next attempt:
/// `base * 2^(attempt-1)` capped at `max`, jittered into its upper half.
pub fn retry_delay(base: Duration, max: Duration, attempt: u32, clock: &dyn Clock) -> Duration {
    let exponent = attempt.saturating_sub(1).min(30);
    let uncapped = base.saturating_mul(1u32 << exponent);
    jittered(uncapped.min(max), clock)
}

/// A uniformly random duration in [d/2, d], drawn from `clock`.
fn jittered(d: Duration, clock: &dyn Clock) -> Duration {
    let half = d / 2;
    let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(clock.jitter(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    #[test]
    fn idle_backoff_grows_to_the_cap_and_resets() {
        let floor = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let mut backoff = IdleBackoff::new(floor, max);
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = backoff.next_delay(&SystemClock);
            assert!(last <= max);
        }
        assert!(last >= max / 2, "should have reached the cap, got {last:?}");
        backoff.reset();
        let first = backoff.next_delay(&SystemClock);
        assert!(first >= floor / 2 && first <= floor, "{first:?}");
    }

    #[test]
    fn retry_delay_is_exponential_capped_and_jittered() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        for attempt in 1..=10u32 {
            let expected = (base * 2u32.pow(attempt - 1)).min(max);
            let delay = retry_delay(base, max, attempt, &SystemClock);
            assert!(
                delay <= expected && delay >= expected / 2,
                "attempt {attempt}: {delay:?}"
            );
        }
        assert!(retry_delay(base, max, u32::MAX, &SystemClock) <= max);
    }
}
