//! How long the watcher waits after a failure: the two retry rules as pure
//! functions, so each is a table test. A failed poll is retried within one
//! poll interval (an eviction notice must not wait); a failed instance
//! metadata lookup, which only names the VM, backs off.

use std::time::Duration;

use crate::client::MIN_REQUEST_SPACING;

/// The most poll attempts between two instance metadata lookups
/// (about a minute at the default 1-second interval).
pub const METADATA_RETRY_MAX_POLLS: u32 = 64;

/// After `failures` failed instance metadata lookups in a row, how many
/// poll attempts pass before the next lookup: 1, 2, 4, … doubling up to
/// [`METADATA_RETRY_MAX_POLLS`]. Counted in polls, not time, so the lookups
/// ride along with the polls and never add a wake-up of their own.
///
/// Instance metadata only names the VM, which a configured name already
/// does: an endpoint without it (a stand-in for IMDS) must not be asked
/// every second for as long as the watcher runs.
pub fn metadata_retry_polls(failures: u32) -> u32 {
    let doublings = failures.saturating_sub(1).min(31);
    (1u32 << doublings).min(METADATA_RETRY_MAX_POLLS)
}

/// The delay before retrying after a failed poll, whatever the number of
/// failures in a row: between half the poll interval (never below
/// [`MIN_REQUEST_SPACING`]) and the poll interval itself, placed by `jitter`
/// (0.0 to 1.0) so that the VMs of a scale set do not retry in lockstep.
///
/// Never longer than the interval: IMDS is local, allows 5 requests a second,
/// and an eviction notice posted as it recovers must be seen within one poll
/// interval. An exponential backoff (to 5 s, say) would cost a sixth of a
/// Preempt's 30-second notice.
pub fn retry_delay(poll_interval: Duration, jitter: f64) -> Duration {
    let low = (poll_interval / 2)
        .max(MIN_REQUEST_SPACING)
        .min(poll_interval);
    let spread = poll_interval.saturating_sub(low);
    low + spread.mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_metadata_lookups_back_off_to_a_cap() {
        // (failures in a row, polls until the next lookup)
        let table = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 8),
            (7, 64),
            (8, 64),
            (40, 64),
            (u32::MAX, 64),
        ];
        for (failures, polls) in table {
            assert_eq!(metadata_retry_polls(failures), polls, "{failures}");
        }
    }

    #[test]
    fn retries_never_wait_longer_than_the_poll_interval() {
        let ms = Duration::from_millis;
        // (interval, jitter, expected delay)
        let table = [
            (ms(1000), 0.0, ms(500)),
            (ms(1000), 0.5, ms(750)),
            (ms(1000), 1.0, ms(1000)),
            (ms(1000), 7.0, ms(1000)),
            (ms(1000), -1.0, ms(500)),
            // The request spacing IMDS needs is kept.
            (ms(300), 0.0, ms(250)),
            (ms(250), 0.5, ms(250)),
            (ms(4000), 1.0, ms(4000)),
        ];
        for (interval, jitter, expected) in table {
            assert_eq!(
                retry_delay(interval, jitter),
                expected,
                "{interval:?} {jitter}"
            );
        }
    }
}
