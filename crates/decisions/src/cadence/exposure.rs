//! [`Exposure`]: the job time of a worker's running deliveries, counted as
//! it accrues rather than when each delivery ends.
//!
//! The interruption rates are events per job-hour (see [`super::counts`]).
//! An interruption is counted the moment it is seen; if a delivery's job
//! time were counted only when the delivery ends, a long job's time would
//! arrive hours late, and a crashed delivery's never (nobody is left to
//! report it). Both make the rates look higher than they are, and the
//! interval too short. So the worker integrates the number of deliveries
//! running over time, and every addition to the fleet's counts takes what
//! has accrued since the last: a crash loses at most the time since the
//! worker's last addition ([`super::FLUSH_EVERY`]).
//!
//! Pure: the caller passes the time of each step.

use tokio::time::Instant;

/// The running deliveries and the time up to which their job time has been
/// handed out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Exposure {
    running: u32,
    /// The last moment accrued to; `None` before the first delivery.
    since: Option<Instant>,
}

impl Exposure {
    /// The job time, in seconds, accrued since the last call by the
    /// deliveries running: it is handed out once (the next call starts
    /// from `now`). A `now` earlier than the last call accrues nothing.
    pub fn accrue(&mut self, now: Instant) -> f64 {
        let since = self.since.map_or(now, |since| since.max(now));
        let seconds = match self.since {
            Some(from) => {
                f64::from(self.running) * since.saturating_duration_since(from).as_secs_f64()
            }
            None => 0.0,
        };
        self.since = Some(since);
        seconds
    }

    /// A delivery's handler started at `at`; returns the job time accrued
    /// before it (by the others).
    pub fn started(&mut self, at: Instant) -> f64 {
        let accrued = self.accrue(at);
        self.running = self.running.saturating_add(1);
        accrued
    }

    /// A delivery's handler ended at `at`; returns the job time accrued
    /// until then, its own included. An end without a start accrues and
    /// changes nothing else.
    pub fn ended(&mut self, at: Instant) -> f64 {
        let accrued = self.accrue(at);
        self.running = self.running.saturating_sub(1);
        accrued
    }

    /// The deliveries running.
    pub fn running(&self) -> u32 {
        self.running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[derive(Clone, Copy, Debug)]
    enum Step {
        Start,
        End,
        Accrue,
    }

    #[test]
    fn job_time_is_handed_out_as_it_accrues_and_only_once() {
        let base = Instant::now();
        let at = |s: u64| base + Duration::from_secs(s);
        // (step, at s, seconds handed out, running after)
        let rows = [
            (Step::Accrue, 0, 0.0, 0),
            (Step::Start, 10, 0.0, 1),
            // One delivery for 50 s.
            (Step::Accrue, 60, 50.0, 1),
            (Step::Start, 100, 40.0, 2),
            // Two for 20 s.
            (Step::End, 120, 40.0, 1),
            // A clock that went backwards hands out nothing.
            (Step::Accrue, 110, 0.0, 1),
            (Step::Accrue, 130, 10.0, 1),
            (Step::End, 160, 30.0, 0),
            // Nothing running: nothing accrues.
            (Step::Accrue, 1000, 0.0, 0),
            // An end without a start changes nothing.
            (Step::End, 1010, 0.0, 0),
        ];
        let mut exposure = Exposure::default();
        let mut total = 0.0;
        for (step, s, expected, running) in rows {
            let got = match step {
                Step::Start => exposure.started(at(s)),
                Step::End => exposure.ended(at(s)),
                Step::Accrue => exposure.accrue(at(s)),
            };
            assert!((got - expected).abs() < 1e-9, "{step:?} at {s}: {got}");
            assert_eq!(exposure.running(), running, "{step:?} at {s}");
            total += got;
        }
        // Every second of every delivery, once: 150 + 20.
        assert!((total - 170.0).abs() < 1e-9, "{total}");
    }

    /// A crash-heavy fleet (0.05 crashes per job-hour, jobs of 24 h: two
    /// deliveries in three crash) measured the way the worker measures:
    /// job time taken at every hourly addition, a crashed worker's
    /// un-added counts lost, its successor counting the crash. The rate
    /// from the counts is the true one within 3 % (it is 0.3 % here: a
    /// crash loses at most an hour of job time, and a successor that
    /// crashes before its first addition loses its count too); counting a
    /// delivery's time only when it ends, as before, made it twice as
    /// high.
    #[test]
    fn a_crash_heavy_fleets_rate_is_estimated_without_bias() {
        use super::super::counts::{FLUSH_EVERY, Interruption, InterruptionCounts};
        use super::super::policy::{CheckpointCadence, IntervalSource};
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};

        const CRASHES_PER_HOUR: f64 = 0.05;
        const JOB_SECONDS: f64 = 24.0 * 3600.0;
        const WORKERS: usize = 20;
        const HOURS: f64 = 2000.0;
        let flush = FLUSH_EVERY.as_secs_f64();
        let base = Instant::now();
        let at = |s: f64| base + Duration::from_secs_f64(s);
        let fresh = || {
            CheckpointCadence::new(IntervalSource::Adaptive {
                seed_evictions_per_hour: 0.05,
            })
        };
        let mut rng = StdRng::seed_from_u64(24);
        let (mut fleet, mut old_fleet) =
            (InterruptionCounts::default(), InterruptionCounts::default());
        let (mut crashes, mut true_seconds) = (0_u64, 0.0);
        for _ in 0..WORKERS {
            let mut cadence = fresh();
            let mut now = 0.0;
            let mut started = 0.0;
            let mut next_flush = flush;
            cadence.job_started(at(now));
            let mut next_crash = -(1.0 - rng.random::<f64>()).ln() / CRASHES_PER_HOUR * 3600.0;
            while now < HOURS * 3600.0 {
                let job_end = started + JOB_SECONDS;
                let next = next_flush.min(next_crash).min(job_end);
                true_seconds += next - now;
                now = next;
                if now == next_flush {
                    fleet = fleet.plus(&cadence.take_pending_at(at(now)));
                    next_flush += flush;
                } else if now == job_end {
                    cadence.job_ended(at(now));
                    old_fleet.job_seconds += now - started;
                    started = now;
                    cadence.job_started(at(now));
                } else {
                    // The crashed worker's un-added counts are lost; its
                    // successor counts the delivery without an outcome.
                    crashes += 1;
                    cadence = fresh();
                    cadence.note(Interruption::NoOutcome);
                    old_fleet.count(Interruption::NoOutcome);
                    started = now;
                    cadence.job_started(at(now));
                    next_crash = now - (1.0 - rng.random::<f64>()).ln() / CRASHES_PER_HOUR * 3600.0;
                }
            }
            fleet = fleet.plus(&cadence.take_pending_at(at(now)));
        }
        // A successor that crashes before its first addition loses the
        // count it made, as the worker does.
        assert!(fleet.no_outcome <= crashes && fleet.no_outcome > crashes * 9 / 10);
        let truth = crashes as f64 / (true_seconds / 3600.0);
        let measured = fleet.no_outcome as f64 / fleet.job_hours();
        let before = old_fleet.no_outcome as f64 / old_fleet.job_hours();
        // docs/checkpoint-interval.md quotes these (`-- --nocapture`).
        eprintln!(
            "{CRASHES_PER_HOUR} crashes per job-hour, {} h jobs, {WORKERS} workers, {HOURS} h: \
             true rate {truth:.5}/h; from the counts {measured:.5}/h ({:+.2} %); counted at \
             each delivery's end {before:.5}/h ({:.2}x)",
            JOB_SECONDS / 3600.0,
            (measured / truth - 1.0) * 100.0,
            before / truth
        );
        assert!(
            (truth - CRASHES_PER_HOUR).abs() < 0.1 * CRASHES_PER_HOUR,
            "the trace: {truth}"
        );
        assert!(
            (measured / truth - 1.0).abs() < 0.03,
            "measured {measured}, true {truth}"
        );
        assert!(before > truth * 1.5, "before: {before}, true {truth}");
        // The estimate the interval uses (the prior's weight is 100 of
        // these 40,000 job-hours) follows.
        let estimate = super::super::estimate::RateEstimates::from_counts(0.05, &fleet);
        assert!(
            (estimate.no_outcome_per_hour / truth - 1.0).abs() < 0.03,
            "{estimate:?}, true {truth}"
        );
    }
}
