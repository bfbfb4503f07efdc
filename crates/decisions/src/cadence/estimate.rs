//! The rates the interval needs, estimated from a fleet's counts and a
//! seed: conjugate Bayesian updates, so that a seed counts for a stated
//! amount of observation and the fleet's own history takes over as it
//! grows. Pure functions with table tests.
//!
//! Rates are per job-hour (see [`super::counts`]): for a job on a VM, the
//! VM's own rate per hour.
//!
//! - Evictions per job-hour: Gamma–Poisson. The prior is
//!   Gamma(shape = seed · W, rate = W), W = [`SEED_WEIGHT_HOURS`]: the
//!   seed counts as much as W job-hours of observation. After k
//!   evictions in T job-hours the posterior mean is
//!   (seed · W + k) / (W + T).
//! - The share of evictions that lose work (a notice too late to save, or
//!   a drain in time that saved nothing after the notice): Beta–binomial
//!   with the uniform prior Beta(1, 1): (1 + late + unsaved) /
//!   (2 + evictions). Before any eviction is seen it is ½: an even chance,
//!   not the optimism that every notice will be usable, nor that every
//!   program saves on its stop signal. A fleet whose programs never save
//!   on it converges to every eviction losing work (Daly's interval as if
//!   there were no notice); one whose notices always save, to none.
//!   For reports the two ways of losing are told apart as one
//!   Dirichlet(½, ½, 1) over (too late, unsaved, saved): (½ + late) /
//!   (2 + evictions) and (½ + unsaved) / (2 + evictions), which sum to
//!   the share above.
//! - Deliveries that ended with no outcome (a crash, a kill, a lost VM)
//!   per job-hour: Gamma–Poisson with no prior events and the same
//!   weight W: k / (W + T). No setting says how often a program crashes;
//!   it is zero until the fleet has seen one.

use super::counts::InterruptionCounts;

/// The seed eviction rate when none is set: 0.05 per job-hour (one
/// eviction per 20 hours a VM runs). `SPOT_WORKER_EVICTION_RATE` sets it.
pub const DEFAULT_SEED_EVICTIONS_PER_HOUR: f64 = 0.05;

/// How many job-hours of observation the seed rate counts for: 100.
/// Ten busy workers observe as much in ten hours, and ten times as much
/// in four days.
pub const SEED_WEIGHT_HOURS: f64 = 100.0;

/// The posterior mean of a Poisson rate (events per hour) under a
/// Gamma(prior_rate · weight, weight) prior, after `events` in `hours`.
/// A negative or non-finite input is read as zero (no information).
pub fn gamma_poisson_mean(prior_rate: f64, weight_hours: f64, events: f64, hours: f64) -> f64 {
    let sane = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
    let (prior_rate, weight, events, hours) = (
        sane(prior_rate),
        sane(weight_hours),
        sane(events),
        sane(hours),
    );
    if weight + hours == 0.0 {
        return prior_rate;
    }
    (prior_rate * weight + events) / (weight + hours)
}

/// The posterior mean of a proportion under a Beta(prior_hits,
/// prior_misses) prior after `hits` of `trials`.
pub fn beta_mean(prior_hits: f64, prior_misses: f64, hits: f64, trials: f64) -> f64 {
    let hits = hits.clamp(0.0, trials.max(0.0));
    let trials = trials.max(0.0);
    (prior_hits + hits) / (prior_hits + prior_misses + trials)
}

/// What the fleet's counts and the seed say about interruptions, per
/// job-hour.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RateEstimates {
    /// Evictions per job-hour, whether their notice was usable or not.
    pub evictions_per_hour: f64,
    /// The share of evictions whose notice came too late to save progress.
    pub late_share: f64,
    /// The share of evictions drained in time that saved nothing after the
    /// notice (the program died on its stop signal, the handler returned
    /// without saving).
    pub unsaved_share: f64,
    /// Deliveries that ended with no outcome per job-hour.
    pub no_outcome_per_hour: f64,
}

impl RateEstimates {
    /// The estimates from `counts` with `seed_evictions_per_hour` as the
    /// prior eviction rate (see the module documentation).
    pub fn from_counts(seed_evictions_per_hour: f64, counts: &InterruptionCounts) -> Self {
        let hours = counts.job_hours();
        let evictions = counts.evictions() as f64;
        RateEstimates {
            evictions_per_hour: gamma_poisson_mean(
                seed_evictions_per_hour,
                SEED_WEIGHT_HOURS,
                evictions,
                hours,
            ),
            // Beta(½, 1½) each: the marginals of Dirichlet(½, ½, 1).
            late_share: beta_mean(0.5, 1.5, counts.late as f64, evictions),
            unsaved_share: beta_mean(0.5, 1.5, counts.unsaved as f64, evictions),
            no_outcome_per_hour: gamma_poisson_mean(
                0.0,
                SEED_WEIGHT_HOURS,
                counts.no_outcome as f64,
                hours,
            ),
        }
    }

    /// The share of evictions that lose work: too late, or not saved at
    /// the notice.
    pub fn losing_share(&self) -> f64 {
        self.late_share + self.unsaved_share
    }

    /// Interruptions that lose work, per job-hour: evictions whose
    /// notice came too late or whose drain saved nothing after it, and
    /// deliveries with no outcome. An eviction saved at the notice loses
    /// nothing.
    pub fn losing_per_hour(&self) -> f64 {
        self.evictions_per_hour * self.losing_share() + self.no_outcome_per_hour
    }

    /// The same rate if the notice were ignored: every eviction counted as
    /// losing work (what a policy that does not drain would have to assume).
    pub fn losing_per_hour_ignoring_the_notice(&self) -> f64 {
        self.evictions_per_hour + self.no_outcome_per_hour
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn gamma_poisson_posterior_means() {
        // (prior rate, weight, events, hours, posterior mean)
        let rows = [
            // No data: the prior.
            (0.1, 100.0, 0.0, 0.0, 0.1),
            // As much data as prior weight: halfway between.
            (0.1, 100.0, 30.0, 100.0, 0.2),
            // (0.1·100 + 5)/(100 + 900) = 0.015
            (0.1, 100.0, 5.0, 900.0, 0.015),
            // A seed ten times too high is outweighed: (1·100 + 1000)/(100 + 10000)
            (1.0, 100.0, 1000.0, 10_000.0, 1100.0 / 10_100.0),
            // No prior weight: the observed rate.
            (0.1, 0.0, 3.0, 10.0, 0.3),
            // No prior weight and no data: the seed as it is.
            (0.1, 0.0, 0.0, 0.0, 0.1),
            // Zero prior rate: k / (W + T).
            (0.0, 100.0, 2.0, 100.0, 0.01),
            // Nonsense inputs read as no information.
            (-1.0, 100.0, 2.0, 100.0, 0.01),
            (0.1, f64::NAN, 3.0, 10.0, 0.3),
            (0.1, 100.0, f64::INFINITY, -4.0, 0.1),
        ];
        for (prior, weight, events, hours, expected) in rows {
            let got = gamma_poisson_mean(prior, weight, events, hours);
            assert!(
                close(got, expected),
                "prior {prior}, weight {weight}, {events} in {hours} h: got {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn beta_posterior_means() {
        // (hits, trials, mean) under Beta(1, 1)
        let rows = [
            (0.0, 0.0, 0.5),
            (0.0, 8.0, 0.1),
            (1.0, 98.0, 0.02),
            (8.0, 8.0, 0.9),
            // More hits than trials is read as all trials hit.
            (9.0, 8.0, 0.9),
            (-3.0, 8.0, 0.1),
        ];
        for (hits, trials, expected) in rows {
            let got = beta_mean(1.0, 1.0, hits, trials);
            assert!(close(got, expected), "{hits}/{trials}: {got}");
        }
    }

    #[test]
    fn estimates_from_counts_combine_the_kinds() {
        let counts = InterruptionCounts {
            drained: 96,
            unsaved: 1,
            late: 1,
            no_outcome: 4,
            job_seconds: 900.0 * 3600.0,
            ..InterruptionCounts::default()
        };
        let estimates = RateEstimates::from_counts(0.2, &counts);
        // (0.2·100 + 98)/(100 + 900) = 0.118
        assert!(close(estimates.evictions_per_hour, 0.118));
        // (½ + 1)/(2 + 98) = 0.015 each; together (1 + 2)/(2 + 98) = 0.03
        assert!(close(estimates.late_share, 0.015));
        assert!(close(estimates.unsaved_share, 0.015));
        assert!(close(estimates.losing_share(), 0.03));
        // 4/(100 + 900) = 0.004
        assert!(close(estimates.no_outcome_per_hour, 0.004));
        assert!(close(estimates.losing_per_hour(), 0.118 * 0.03 + 0.004));
        assert!(close(
            estimates.losing_per_hour_ignoring_the_notice(),
            0.118 + 0.004
        ));
        // A new fleet: the seed, half of it losing work, no crashes yet.
        let new = RateEstimates::from_counts(0.2, &InterruptionCounts::default());
        assert!(close(new.losing_per_hour(), 0.1));
    }

    /// A fleet of programs that never save on the stop signal learns that
    /// every eviction loses work (the interval as if there were no
    /// notice); one whose notices always save, that none does. No setting
    /// says which: the counts do.
    #[test]
    fn the_share_of_notices_that_save_is_learned() {
        let hours = 1000.0;
        let fleet = |drained: u64, unsaved: u64| InterruptionCounts {
            drained,
            unsaved,
            job_seconds: hours * 3600.0,
            ..InterruptionCounts::default()
        };
        // (saved at the notice, drained unsaved, losing share)
        let rows = [
            (0, 0, 0.5),
            (0, 500, 501.0 / 502.0),
            (500, 0, 1.0 / 502.0),
            (250, 250, 251.0 / 502.0),
        ];
        for (drained, unsaved, share) in rows {
            let estimates = RateEstimates::from_counts(0.5, &fleet(drained, unsaved));
            assert!(
                close(estimates.losing_share(), share),
                "{drained} saved, {unsaved} unsaved: {estimates:?}"
            );
        }
        let never = RateEstimates::from_counts(0.5, &fleet(0, 500));
        let blind = never.losing_per_hour_ignoring_the_notice();
        assert!((never.losing_per_hour() / blind - 1.0).abs() < 0.0025);
        let always = RateEstimates::from_counts(0.5, &fleet(500, 0));
        assert!(always.losing_per_hour() < blind / 400.0);
    }
}
