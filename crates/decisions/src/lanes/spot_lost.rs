//! [`spot_capacity_gone`]: whether the evictions a fleet's Spot workers
//! reported say its Spot capacity is gone (an outage), or only that some
//! VMs of a pool that still runs were evicted.
//!
//! One VM evicted while others run is not an outage: Azure takes single
//! VMs back all the time. But when capacity is reclaimed, Azure evicts a
//! pool's VMs together, within a minute or so, and then the workers
//! evicted first still see the others as running (they were heard from a
//! moment ago, and will be fresh for minutes). Waiting for the last one to
//! be evicted, or for the last word to go stale, records the outage late
//! or never. So many evictions close together are themselves the signal:
//! when at least [`MASS_EVICTION_MIN`] workers were evicted within the
//! window and they are at least [`MASS_EVICTION_SHARE`] of the pool seen
//! (those evicted and those still running), the capacity is gone.

/// The fewest evictions within the window that count as a mass eviction:
/// two of a pool of three or four is bad luck, not yet an outage.
pub const MASS_EVICTION_MIN: usize = 3;

/// The share of the pool seen that must have been evicted within the
/// window for a mass eviction: half.
pub const MASS_EVICTION_SHARE: f64 = 0.5;

/// What a fleet saw of its Spot workers lately, for
/// [`spot_capacity_gone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evictions {
    /// Spot workers evicted within the window (and not heard from since).
    pub evicted: usize,
    /// Spot workers heard from within the window and not evicted since.
    pub running: usize,
}

/// Whether the fleet's Spot capacity is gone: an eviction left no Spot
/// worker running, or the evictions are a mass eviction (at least
/// [`MASS_EVICTION_MIN`], and at least [`MASS_EVICTION_SHARE`] of the
/// pool seen). No eviction: not gone (this decides on evictions only).
///
/// ```
/// use spot_worker_decisions::lanes::{Evictions, spot_capacity_gone};
///
/// // One of a pool of ten: a VM taken back, not an outage.
/// assert!(!spot_capacity_gone(Evictions { evicted: 1, running: 9 }));
/// // Six of ten within the window: the pool is being reclaimed.
/// assert!(spot_capacity_gone(Evictions { evicted: 6, running: 4 }));
/// ```
pub fn spot_capacity_gone(seen: Evictions) -> bool {
    if seen.evicted == 0 {
        return false;
    }
    if seen.running == 0 {
        return true;
    }
    let pool = seen.evicted.saturating_add(seen.running) as f64;
    seen.evicted >= MASS_EVICTION_MIN && seen.evicted as f64 >= MASS_EVICTION_SHARE * pool
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evictions_close_together_are_an_outage() {
        // (evicted, running, gone, why)
        let table = [
            (0, 0, false, "nothing seen"),
            (0, 5, false, "no eviction: this decides on evictions only"),
            (1, 0, true, "the last Spot worker evicted"),
            (2, 0, true, "the last ones evicted"),
            (1, 1, false, "one of two: the other runs"),
            (1, 9, false, "one VM of a pool taken back"),
            (
                2,
                1,
                false,
                "two of three: below the fewest for a mass eviction",
            ),
            (2, 2, false, "two of four: below the fewest"),
            (3, 3, true, "three of six: the fewest, and half"),
            (3, 4, false, "three of seven: under half"),
            (10, 990, false, "1 % of a large pool"),
            (499, 501, false, "just under half of a thousand"),
            (500, 500, true, "half of a thousand"),
            (1000, 0, true, "a whole pool evicted"),
            (usize::MAX, usize::MAX, true, "no overflow"),
        ];
        for (evicted, running, gone, why) in table {
            assert_eq!(
                spot_capacity_gone(Evictions { evicted, running }),
                gone,
                "{evicted} evicted, {running} running: {why}"
            );
        }
    }
}
