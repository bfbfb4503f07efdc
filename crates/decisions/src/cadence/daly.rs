//! Daly's checkpoint interval: how much work to do between two checkpoints
//! so that the time spent saving plus the work redone after interruptions
//! that lose work is least. A pure function; everything it needs (the cost
//! of one save, the mean time between interruptions that lose work) is
//! measured elsewhere.
//!
//! J. T. Daly, "A higher order estimate of the optimum checkpoint interval
//! for restart dumps", Future Generation Computer Systems 22 (2006),
//! 303–312, equation (37): with δ the time one checkpoint costs and M the
//! mean time between interruptions that lose work,
//!
//! ```text
//! τ = √(2δM) · [1 + ⅓·√(δ/2M) + ⅑·(δ/2M)] − δ     when δ < 2M
//! τ = M                                              when δ ≥ 2M
//! ```
//!
//! τ is the compute time between the end of one save and the start of the
//! next. Its first term, √(2δM), is Young's (1974) interval.

use std::time::Duration;

/// The least interval the policy hands out: never more often than
/// `spot-worker run` saved before the interval was adaptive (10 s), however
/// cheap a save or frequent the losses. A save that costs next to nothing
/// still costs a request.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// The longest interval the policy hands out: 24 hours. The model assumes
/// independent interruptions at a steady rate; with almost no losses seen
/// it would let a job run for days unsaved, and one burst the model did
/// not foresee (docs/checkpoint-interval.md) would then cost all of it.
pub const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Daly's higher-order optimum interval, in seconds, for a save costing
/// `cost` seconds and a mean time between interruptions that lose work of
/// `mtbi` seconds; unclamped. `mtbi` may be infinite (no losses at all):
/// the interval is then infinite too. A cost of zero gives zero (save
/// continuously); a cost or mean that is negative or NaN gives NaN, for
/// [`clamped_interval`] to refuse.
pub fn daly_interval_seconds(cost: f64, mtbi: f64) -> f64 {
    if cost.is_nan() || mtbi.is_nan() || cost < 0.0 || mtbi <= 0.0 {
        return f64::NAN;
    }
    if mtbi.is_infinite() {
        return f64::INFINITY;
    }
    if cost >= 2.0 * mtbi {
        return mtbi;
    }
    let ratio = cost / (2.0 * mtbi);
    (2.0 * cost * mtbi).sqrt() * (1.0 + ratio.sqrt() / 3.0 + ratio / 9.0) - cost
}

/// Daly's interval for a save costing `cost` and interruptions that lose
/// work arriving at `losing_per_hour` (per worker-hour), clamped to
/// [`MIN_INTERVAL`]..=[`MAX_INTERVAL`]. A rate of zero (nothing can be
/// lost) gives the maximum; a rate that is negative or not a number gives
/// the minimum: in doubt, save often.
pub fn clamped_interval(cost: Duration, losing_per_hour: f64) -> Duration {
    if losing_per_hour.is_nan() || losing_per_hour < 0.0 {
        return MIN_INTERVAL;
    }
    let mtbi = 3600.0 / losing_per_hour; // infinite for a rate of zero
    let seconds = daly_interval_seconds(cost.as_secs_f64(), mtbi);
    if seconds.is_nan() {
        return MIN_INTERVAL;
    }
    let seconds = seconds.clamp(MIN_INTERVAL.as_secs_f64(), MAX_INTERVAL.as_secs_f64());
    Duration::from_secs_f64(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values worked out by hand from Daly's equation (37) (and checked
    /// with a calculator): (δ, M, τ) in seconds.
    #[test]
    fn matches_dalys_formula_worked_by_hand() {
        let rows = [
            // √(2·1·7200) = 120; δ/2M = 1/14400, √ = 1/120:
            // 120·(1 + 1/360 + 1/129600) − 1 = 119.3343
            (1.0, 7200.0, 119.3343),
            // √432000 = 657.267; δ/2M = 1/120, √ = 0.091287:
            // 657.267·(1 + 0.030429 + 0.000926) − 60 = 617.876
            (60.0, 3600.0, 617.876),
            // √(2·10·36000) = 848.528; δ/2M = 1/7200:
            // 848.528·(1 + 0.0039284 + 0.0000154) − 10 = 841.875
            (10.0, 36000.0, 841.875),
            // √1728000 = 1314.534; δ/2M = 1/120: ·1.031355 − 120 = 1235.751
            (120.0, 7200.0, 1235.751),
            // √(2·30·360000) = 4647.580; δ/2M = 1/24000:
            // 4647.580·(1 + 0.0021517 + 0.0000046) − 30 = 4627.602
            (30.0, 360000.0, 4627.602),
            // Young's term dominates for rare losses: √2e8 = 14142.136,
            // ·(1 + 0.0000236) − 1 = 14141.469
            (1.0, 1e8, 14141.469),
            // δ close to 2M: √12000 = 109.545; δ/2M = 5/6, √ = 0.912871:
            // 109.545·(1 + 0.304290 + 0.092593) − 100 = 53.021
            (100.0, 60.0, 53.021),
            // δ ≥ 2M: checkpoint once per mean time between losses.
            (120.0, 60.0, 60.0),
            (500.0, 60.0, 60.0),
        ];
        for (cost, mtbi, expected) in rows {
            let got = daly_interval_seconds(cost, mtbi);
            assert!(
                (got - expected).abs() < 1e-3,
                "δ {cost}, M {mtbi}: got {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn is_youngs_interval_to_first_order() {
        for (cost, mtbi) in [(1.0, 1e6), (5.0, 1e7), (0.1, 1e5)] {
            let young = (2.0_f64 * cost * mtbi).sqrt();
            let daly = daly_interval_seconds(cost, mtbi);
            assert!((daly - young).abs() / young < 0.01, "{cost} {mtbi}");
        }
    }

    #[test]
    fn odd_inputs_give_nan_or_infinity_never_a_panic() {
        assert!(daly_interval_seconds(f64::NAN, 10.0).is_nan());
        assert!(daly_interval_seconds(1.0, f64::NAN).is_nan());
        assert!(daly_interval_seconds(-1.0, 10.0).is_nan());
        assert!(daly_interval_seconds(1.0, 0.0).is_nan());
        assert!(daly_interval_seconds(1.0, -5.0).is_nan());
        assert_eq!(daly_interval_seconds(1.0, f64::INFINITY), f64::INFINITY);
        assert_eq!(daly_interval_seconds(0.0, 100.0), 0.0);
    }

    #[test]
    fn clamped_interval_stays_within_its_bounds() {
        let secs = Duration::from_secs;
        // (cost, losses per hour, expected)
        let rows = [
            // M = 1800 s: √216000 = 464.758; δ/2M = 1/60, √ = 0.129099:
            // 464.758·(1 + 0.043033 + 0.001852) − 60 = 425.619
            (secs(60), 2.0, Duration::from_secs_f64(425.619)),
            // 1 s per save, one loss per 2 hours: 119.33 s.
            (
                secs(1),
                0.5,
                Duration::from_secs_f64(119.334_259_259_259_27),
            ),
            // Free saves or constant losses: never below the minimum.
            (Duration::ZERO, 0.5, MIN_INTERVAL),
            (secs(1), 1000.0, MIN_INTERVAL),
            // Nothing to lose: the maximum.
            (secs(30), 0.0, MAX_INTERVAL),
            (secs(120), 1e-6, MAX_INTERVAL),
            // Nonsense rates: in doubt, save often.
            (secs(30), -1.0, MIN_INTERVAL),
            (secs(30), f64::NAN, MIN_INTERVAL),
        ];
        for (cost, rate, expected) in rows {
            let got = clamped_interval(cost, rate);
            assert!(
                (got.as_secs_f64() - expected.as_secs_f64()).abs() < 1e-3,
                "cost {cost:?}, rate {rate}: got {got:?}, expected {expected:?}"
            );
        }
        // A costlier save means a longer interval; more losses a shorter one.
        assert!(clamped_interval(secs(60), 0.1) > clamped_interval(secs(6), 0.1));
        assert!(clamped_interval(secs(6), 0.5) < clamped_interval(secs(6), 0.05));
    }
}
