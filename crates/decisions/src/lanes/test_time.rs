//! The lane tests' clock: times in hours from one fixed instant, so that a
//! table of cases reads in the hours the rule is written in.

use std::time::{Duration, SystemTime};

/// Seconds in an hour.
pub(crate) const H: f64 = 3600.0;

/// `hours` after (before, if negative) a fixed instant.
pub(crate) fn at(hours: f64) -> SystemTime {
    let epoch = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    if hours >= 0.0 {
        epoch + Duration::from_secs_f64(hours * H)
    } else {
        epoch - Duration::from_secs_f64(-hours * H)
    }
}

/// `h` hours.
pub(crate) fn hours(h: f64) -> Duration {
    Duration::from_secs_f64(h * H)
}
