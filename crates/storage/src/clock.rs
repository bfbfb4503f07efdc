//! [`Clock`]: where the consumer and the lane keeper read the time of day
//! and draw the jitter of their waits. The default, [`SystemClock`], is
//! the wall clock and the thread's random numbers, in every binary; a
//! seeded fault search gives its own, so that a seed's run (every wait,
//! every lane decision) replays exactly.

use std::fmt;
use std::time::SystemTime;

use rand::Rng as _;

/// The time of day and the randomness behind jitter.
pub trait Clock: Send + Sync + 'static {
    /// The time of day now.
    fn now(&self) -> SystemTime;

    /// A number drawn uniformly from `0..=max`: the jitter of a wait.
    fn jitter(&self, max: u64) -> u64;
}

/// The wall clock and the thread's random numbers: what every worker uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn jitter(&self, max: u64) -> u64 {
        rand::rng().random_range(0..=max)
    }
}

// Lets types holding a clock derive Debug.
impl fmt::Debug for dyn Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Clock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_is_the_wall_clock_and_jitters_within_bounds() {
        let before = SystemTime::now();
        let now = SystemClock.now();
        assert!(now >= before && now <= SystemTime::now());
        assert_eq!(SystemClock.jitter(0), 0);
        assert!((0..100).all(|_| SystemClock.jitter(5) <= 5));
        assert!((0..100).any(|_| SystemClock.jitter(u64::MAX) > 0));
    }
}
