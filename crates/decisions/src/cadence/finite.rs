//! [`spread_over_job`]: the checkpoint interval for a job that ends.
//!
//! Daly's interval assumes work without end. A job with R seconds of work
//! left, saving every τ, saves ⌈R/τ⌉ − 1 more times, and the last save
//! can fall shortly before the end, where it protects little: with τ at
//! 2.5 h an 8-hour job saves at 2.5, 5 and 7.5 h, where two saves at 2.67
//! and 5.33 h waste less. With n more saves spread evenly over R, each of
//! the n + 1 stretches of R/(n + 1) is lost on average half-way by an
//! interruption that loses work (rate λ), so the expected waste is
//!
//! ```text
//! W(n) = n·C + λ·R² / (2(n + 1))
//! ```
//!
//! (first order: the time the saves take is not exposed). Its minimum over
//! real n is at n + 1 = R/√(2C/λ), R over Young's interval; so the choice
//! is between the two whole numbers of stretches around R/τ, and the
//! interval is R over the one with the lesser W. Recomputed after every
//! save (R less one stretch, one save fewer) it gives the same stretch,
//! so the saves are even. A pure function.

use std::time::Duration;

use super::daly::{MAX_INTERVAL, MIN_INTERVAL};

/// The interval until the next save for a job with `remaining` work left
/// (counted from its last save), given Daly's `interval`, the cost of one
/// save and the rate of interruptions that lose work: `remaining` divided
/// into the whole number of even stretches, next to `remaining / interval`,
/// that wastes least (see the module documentation). At most one stretch
/// when the job ends within `interval`. Kept within
/// [`MIN_INTERVAL`]..=[`MAX_INTERVAL`] (the other choice is taken if the
/// better one is outside); a `remaining` of zero, or inputs that are not
/// finite positive numbers, give `interval` back.
pub fn spread_over_job(
    interval: Duration,
    cost: Duration,
    losing_per_hour: f64,
    remaining: Duration,
) -> Duration {
    let (tau, work, cost) = (
        interval.as_secs_f64(),
        remaining.as_secs_f64(),
        cost.as_secs_f64(),
    );
    let rate = losing_per_hour / 3600.0;
    if tau <= 0.0 || work <= 0.0 || !rate.is_finite() || rate < 0.0 || !cost.is_finite() {
        return interval;
    }
    let stretches = work / tau;
    let fewer = stretches.floor().max(1.0);
    let more = stretches.ceil().max(1.0);
    let waste = |n: f64| (n - 1.0) * cost + rate * work * work / (2.0 * n);
    let allowed = |n: f64| {
        let stretch = work / n;
        // A job that ends within the minimum needs no save at all.
        (stretch >= MIN_INTERVAL.as_secs_f64() || n == 1.0) && stretch <= MAX_INTERVAL.as_secs_f64()
    };
    let (better, other) = if waste(more) < waste(fewer) {
        (more, fewer)
    } else {
        (fewer, more)
    };
    let chosen = if allowed(better) {
        better
    } else if allowed(other) {
        other
    } else {
        return interval;
    };
    Duration::from_secs_f64(work / chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate at which Young's interval for a save of `cost` seconds is
    /// `tau` seconds: λ = 2C/τ², per hour.
    fn rate_for(cost: f64, tau: f64) -> f64 {
        2.0 * cost / (tau * tau) * 3600.0
    }

    #[test]
    fn the_saves_are_spread_evenly_over_what_is_left() {
        let h = 3600.0;
        // (Daly's τ s, cost s, losses/h, remaining s, expected interval s)
        let rows = [
            // 8 h left, τ 2.5 h: λR² = 20·(28800/9000)² = 204.8;
            // W(3 stretches) = 20 + 34.13, W(4) = 30 + 25.6: three of 2.67 h.
            (
                2.5 * h,
                10.0,
                rate_for(10.0, 2.5 * h),
                8.0 * h,
                8.0 * h / 3.0,
            ),
            // τ 2.2 h: λR² = 20·(28800/7920)² = 264.5; W(3) = 64.1,
            // W(4) = 63.1: four of 2 h.
            (7920.0, 10.0, rate_for(10.0, 7920.0), 8.0 * h, 2.0 * h),
            // The job ends within τ: no save before it does.
            (2.0 * h, 10.0, rate_for(10.0, 2.0 * h), 1.0 * h, 1.0 * h),
            // Exactly three intervals left: τ as it is.
            (1.0 * h, 10.0, rate_for(10.0, 1.0 * h), 3.0 * h, 1.0 * h),
            // Nothing is lost (τ at the maximum): the fewest saves, but no
            // stretch longer than the maximum: 30 h in two of 15 h.
            (24.0 * h, 10.0, 0.0, 30.0 * h, 15.0 * h),
            // 25 s left at τ = 10 s: three stretches would waste least
            // (λR² = 12.5; W(2) = 1 + 3.125, W(3) = 2 + 2.08) but are
            // shorter than the minimum: two of 12.5 s.
            (10.0, 1.0, rate_for(1.0, 10.0), 25.0, 12.5),
            // Nothing left, or nonsense: τ as it is.
            (1.0 * h, 10.0, 0.1, 0.0, 1.0 * h),
            (1.0 * h, 10.0, f64::NAN, 8.0 * h, 1.0 * h),
            (1.0 * h, 10.0, -1.0, 8.0 * h, 1.0 * h),
        ];
        for (tau, cost, rate, remaining, expected) in rows {
            let got = spread_over_job(
                Duration::from_secs_f64(tau),
                Duration::from_secs_f64(cost),
                rate,
                Duration::from_secs_f64(remaining),
            )
            .as_secs_f64();
            assert!(
                (got - expected).abs() < 1e-6,
                "τ {tau}, C {cost}, λ {rate}, R {remaining}: got {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn after_each_save_the_stretch_stays_the_same() {
        let (tau, cost) = (7920.0, 10.0);
        let rate = rate_for(cost, tau);
        let mut remaining = 8.0 * 3600.0;
        let mut stretches = Vec::new();
        while remaining > 1e-6 {
            let next = spread_over_job(
                Duration::from_secs_f64(tau),
                Duration::from_secs_f64(cost),
                rate,
                Duration::from_secs_f64(remaining),
            )
            .as_secs_f64();
            stretches.push(next);
            remaining -= next;
        }
        assert_eq!(stretches.len(), 4, "{stretches:?}");
        assert!(stretches.iter().all(|s| (s - 7200.0).abs() < 1e-6));
    }
}
