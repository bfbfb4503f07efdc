//! [`CheckpointCadence`]: the live checkpoint interval of one worker. It
//! holds what the interval depends on (the measured cost of a save, the
//! fleet's interruption counts and what this worker saw since it last added
//! to them, the seed rate, a user's explicit interval) and answers "is a
//! checkpoint due?". [`adaptive_interval`] is the decision itself, pure.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::cost::{CheckpointCost, CostMeter, SaveCost};
use super::counts::{Interruption, InterruptionCounts};
use super::daly::{MIN_INTERVAL, clamped_interval};
use super::estimate::RateEstimates;
use super::exposure::Exposure;
use super::finite::spread_over_job;

/// The interval for a save measured to cost `cost` (`None`: none measured
/// yet) and interruptions that lose work at `losing_per_hour`: Daly's,
/// clamped (see [`clamped_interval`]). Without a cost (no save measured by
/// the worker or the fleet) the interval is the minimum, so the first save
/// comes early and measures
/// the cost.
pub fn adaptive_interval(cost: Option<Duration>, losing_per_hour: f64) -> Duration {
    match cost {
        Some(cost) => clamped_interval(cost, losing_per_hour),
        None => MIN_INTERVAL,
    }
}

/// Where a worker's interval comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IntervalSource {
    /// The user's explicit interval: it wins over any estimate.
    Explicit(Duration),
    /// Daly's interval from the estimates, with this seed eviction rate
    /// (per worker-hour) before the fleet has history.
    Adaptive {
        /// The prior eviction rate per worker-hour.
        seed_evictions_per_hour: f64,
    },
}

/// What the interval rests on now, for metrics and `spot-worker status`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CadenceView {
    /// The interval handed out.
    pub interval: Duration,
    /// Whether it is the user's explicit one.
    pub explicit: bool,
    /// The cost of the saves this worker measured (the interval uses the
    /// fleet's mean save until there is one).
    pub cost: CheckpointCost,
    /// The rate estimates.
    pub estimates: RateEstimates,
    /// The fleet's counts with this worker's not yet added ones.
    pub counts: InterruptionCounts,
    /// The cost of a save the interval uses: this worker's, or the
    /// fleet's mean before it measured one; `None` before anyone did.
    pub save_cost: Option<Duration>,
}

#[derive(Debug, Default)]
struct Observed {
    /// The fleet's counts as last read or written.
    fleet: InterruptionCounts,
    /// What this worker saw since.
    pending: InterruptionCounts,
    /// The job time of the deliveries running, not yet in `pending`.
    exposure: Exposure,
}

impl Observed {
    fn add_job_seconds(&mut self, seconds: f64) {
        self.pending = self.pending.plus(&InterruptionCounts {
            job_seconds: seconds,
            ..InterruptionCounts::default()
        });
    }
}

/// One worker's checkpoint interval, shared by its deliveries.
#[derive(Debug)]
pub struct CheckpointCadence {
    source: IntervalSource,
    cost: CostMeter,
    observed: Mutex<Observed>,
}

impl CheckpointCadence {
    /// A cadence with nothing measured or counted yet.
    pub fn new(source: IntervalSource) -> Self {
        CheckpointCadence {
            source,
            cost: CostMeter::new(),
            observed: Mutex::default(),
        }
    }

    /// Where the interval comes from.
    pub fn source(&self) -> IntervalSource {
        self.source
    }

    /// Records what one save cost (also counted for the fleet's mean).
    pub fn record_save(&self, save: SaveCost) {
        self.cost.record(save);
        let mut observed = self.lock();
        observed.pending = observed.pending.plus(&InterruptionCounts {
            saves: 1,
            save_seconds: save.blocked.as_secs_f64(),
            ..InterruptionCounts::default()
        });
    }

    /// Counts one interruption this worker saw.
    pub fn note(&self, kind: Interruption) {
        self.lock().pending.count(kind);
    }

    /// Counts one interruption this worker saw that lost `lost` of work,
    /// measured (see [`InterruptionCounts::losses`]).
    pub fn note_loss(&self, kind: Interruption, lost: Duration) {
        let mut observed = self.lock();
        observed.pending.count(kind);
        observed.pending.count_loss(lost);
    }

    /// Counts one finished job of `work` (its useful time) in the fleet's
    /// job lengths, which [`CheckpointCadence::expected_left`] goes by.
    pub fn note_job_length(&self, work: Duration) {
        self.lock().pending.job_lengths.add(work);
    }

    /// Counts `ran` more job time at once (job time that was not timed
    /// with [`CheckpointCadence::job_started`]).
    pub fn add_job_time(&self, ran: Duration) {
        self.lock().add_job_seconds(ran.as_secs_f64());
    }

    /// A delivery's handler started at `at`: its job time counts from
    /// then, and reaches the counts at each [`CheckpointCadence::take_pending`]
    /// while it runs (see [`super::exposure`]). End it with
    /// [`CheckpointCadence::job_ended`], or use [`CheckpointCadence::running_job`].
    pub fn job_started(&self, at: Instant) {
        let mut observed = self.lock();
        let accrued = observed.exposure.started(at);
        observed.add_job_seconds(accrued);
    }

    /// A delivery's handler ended at `at`: the rest of its job time counts.
    pub fn job_ended(&self, at: Instant) {
        let mut observed = self.lock();
        let accrued = observed.exposure.ended(at);
        observed.add_job_seconds(accrued);
    }

    /// Times one delivery's handler from now until the guard is dropped
    /// (whether the delivery ends or is itself dropped).
    pub fn running_job(&self) -> RunningJob<'_> {
        self.job_started(Instant::now());
        RunningJob { cadence: self }
    }

    /// Replaces the fleet's counts with `fleet` (as read from, or written
    /// to, the fleet's ledger in the checkpoint store).
    pub fn set_fleet(&self, fleet: InterruptionCounts) {
        self.lock().fleet = fleet;
    }

    /// Takes what this worker saw since it last took it, for the ledger;
    /// give it back with [`CheckpointCadence::give_back`] if it could not
    /// be added.
    /// The job time of the deliveries running is counted up to now.
    pub fn take_pending(&self) -> InterruptionCounts {
        self.take_pending_at(Instant::now())
    }

    /// [`CheckpointCadence::take_pending`] with the running deliveries'
    /// job time counted up to `now`.
    pub fn take_pending_at(&self, now: Instant) -> InterruptionCounts {
        let mut observed = self.lock();
        let accrued = observed.exposure.accrue(now);
        observed.add_job_seconds(accrued);
        std::mem::take(&mut observed.pending)
    }

    /// Gives back what [`CheckpointCadence::take_pending`] took and could
    /// not be added to the ledger, to be added next time.
    pub fn give_back(&self, taken: InterruptionCounts) {
        let mut observed = self.lock();
        observed.pending = observed.pending.plus(&taken);
    }

    /// The interval now and what it rests on.
    pub fn view(&self) -> CadenceView {
        let cost = self.cost.snapshot();
        let counts = {
            let observed = self.lock();
            observed.fleet.plus(&observed.pending)
        };
        let (interval, explicit, seed) = match self.source {
            IntervalSource::Explicit(interval) => (interval, true, 0.0),
            IntervalSource::Adaptive {
                seed_evictions_per_hour,
            } => (Duration::ZERO, false, seed_evictions_per_hour),
        };
        let estimates = RateEstimates::from_counts(seed, &counts);
        // This worker's own measurements, or before it has any (a fresh
        // VM), the fleet's mean save: a replacement worker needs no early
        // save of its own to know what saving costs.
        let save_cost = cost
            .estimate()
            .or_else(|| counts.mean_save_seconds().map(Duration::from_secs_f64));
        let interval = if explicit {
            interval
        } else {
            adaptive_interval(save_cost, estimates.losing_per_hour())
        };
        CadenceView {
            interval,
            explicit,
            cost,
            estimates,
            counts,
            save_cost,
        }
    }

    /// The interval now.
    pub fn interval(&self) -> Duration {
        match self.source {
            IntervalSource::Explicit(interval) => interval,
            IntervalSource::Adaptive { .. } => self.view().interval,
        }
    }

    /// Whether a job whose progress was last saved `since_last_save` ago
    /// should save now.
    pub fn is_due(&self, since_last_save: Duration) -> bool {
        since_last_save >= self.interval()
    }

    /// The interval for a job that knows it has `remaining` work left,
    /// counted from its last save: the adaptive interval spread evenly
    /// over what is left, so no save falls just before the end where it
    /// protects little ([`spread_over_job`]). An explicit interval is
    /// kept as it is; so is the adaptive one before a save was measured.
    pub fn interval_before_end(&self, remaining: Duration) -> Duration {
        if let IntervalSource::Explicit(interval) = self.source {
            return interval;
        }
        let view = self.view();
        match view.save_cost {
            Some(cost) => spread_over_job(
                view.interval,
                cost,
                view.estimates.losing_per_hour(),
                remaining,
            ),
            None => view.interval,
        }
    }

    /// [`CheckpointCadence::is_due`] for a handler that knows how much
    /// work it has `left` (its progress fraction times the job's length,
    /// say): due when `since_last_save` reaches the interval spread over
    /// the work from its last save to the end.
    pub fn is_due_before_end(&self, since_last_save: Duration, left: Duration) -> bool {
        since_last_save >= self.interval_before_end(since_last_save + left)
    }

    /// The work a job that has done `done` so far (all its deliveries'
    /// useful work, this one's included) is expected to have left, from
    /// the lengths of the jobs the fleet finished
    /// ([`JobLengths::expected_left`](super::JobLengths::expected_left));
    /// `None` with an explicit interval, or when the fleet has not
    /// finished enough jobs longer than that.
    pub fn expected_left(&self, done: Duration) -> Option<Duration> {
        if let IntervalSource::Explicit(_) = self.source {
            return None;
        }
        let lengths = {
            let observed = self.lock();
            observed
                .fleet
                .job_lengths
                .plus(&observed.pending.job_lengths)
        };
        lengths.expected_left(done)
    }

    /// The interval for a job that says nothing about its end, counted
    /// from its last save, `since_last_save` ago, when it has done `done`
    /// so far: spread over the rest the fleet's finished jobs say it has
    /// left ([`CheckpointCadence::expected_left`]), or Daly's while they
    /// cannot say.
    pub fn interval_in_job(&self, since_last_save: Duration, done: Duration) -> Duration {
        match self.expected_left(done) {
            Some(left) => self.interval_before_end(since_last_save.saturating_add(left)),
            None => self.interval(),
        }
    }

    /// [`CheckpointCadence::is_due`] for a job that has done `done` so far
    /// and says nothing about its end: due when `since_last_save` reaches
    /// [`CheckpointCadence::interval_in_job`].
    pub fn is_due_in_job(&self, since_last_save: Duration, done: Duration) -> bool {
        since_last_save >= self.interval_in_job(since_last_save, done)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Observed> {
        // Nothing panics while holding it: the counts stay consistent.
        self.observed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One delivery's handler, timed for the job time until dropped (see
/// [`CheckpointCadence::running_job`]).
#[derive(Debug)]
pub struct RunningJob<'a> {
    cadence: &'a CheckpointCadence,
}

impl Drop for RunningJob<'_> {
    fn drop(&mut self) {
        self.cadence.job_ended(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(seed: f64) -> CheckpointCadence {
        CheckpointCadence::new(IntervalSource::Adaptive {
            seed_evictions_per_hour: seed,
        })
    }

    fn save(seconds: u64) -> SaveCost {
        SaveCost {
            blocked: Duration::from_secs(seconds),
            requests: 1,
            bytes: 10,
        }
    }

    #[test]
    fn the_first_save_is_due_early_then_the_interval_follows_cost_and_losses() {
        let cadence = adaptive(0.2);
        assert_eq!(cadence.interval(), MIN_INTERVAL);
        assert!(cadence.is_due(MIN_INTERVAL));
        assert!(!cadence.is_due(MIN_INTERVAL / 2));
        cadence.record_save(save(30));
        // A new fleet: 0.2 evictions/h, half of them losing work: 0.1/h,
        // M = 36000 s; Daly for δ = 30: √2160000·(1 + ⅓·√(1/2400) + 1/21600) − 30 = 1449.76.
        let expected = clamped_interval(Duration::from_secs(30), 0.1);
        assert_eq!(cadence.interval(), expected);
        assert!(
            (expected.as_secs_f64() - 1449.76).abs() < 1.0,
            "{expected:?}"
        );
        // The fleet's history: many evictions, all drained in time, and no
        // crashes: the interval grows (fewer losses than the seed implied).
        cadence.set_fleet(InterruptionCounts {
            drained: 2000,
            late: 0,
            no_outcome: 1,
            job_seconds: 10_000.0 * 3600.0,
            ..InterruptionCounts::default()
        });
        let view = cadence.view();
        assert!(view.interval > expected * 5, "{view:?}");
        // Crashes seen: it shrinks again.
        cadence.set_fleet(InterruptionCounts {
            drained: 2000,
            late: 0,
            no_outcome: 500,
            job_seconds: 10_000.0 * 3600.0,
            ..InterruptionCounts::default()
        });
        assert!(cadence.interval() < view.interval);
    }

    #[test]
    fn a_fresh_worker_starts_from_the_fleets_mean_save_then_its_own() {
        let cadence = adaptive(0.2);
        cadence.set_fleet(InterruptionCounts {
            saves: 10,
            save_seconds: 300.0,
            ..InterruptionCounts::default()
        });
        // No save of its own yet: the fleet's mean, 30 s.
        assert_eq!(
            cadence.interval(),
            clamped_interval(Duration::from_secs(30), 0.1)
        );
        // Its own measurements take over (the fleet's mean moves by one
        // save only).
        cadence.record_save(save(120));
        assert_eq!(
            cadence.interval(),
            clamped_interval(Duration::from_secs(120), 0.1)
        );
    }

    #[test]
    fn a_job_that_knows_its_end_spreads_the_interval_over_it() {
        let cadence = adaptive(0.2);
        let left = Duration::from_secs(8 * 3600);
        // Nothing measured: the first save comes early, end or not.
        assert_eq!(cadence.interval_before_end(left), MIN_INTERVAL);
        cadence.record_save(save(30));
        let tau = cadence.interval();
        assert_eq!(
            cadence.interval_before_end(left),
            spread_over_job(tau, Duration::from_secs(30), 0.1, left)
        );
        // 1449.76 s into 8 h: 19.86 stretches; the waste is least with 20,
        // of 1440 s.
        assert_eq!(cadence.interval_before_end(left), Duration::from_secs(1440));
        assert!(
            cadence.is_due_before_end(Duration::from_secs(1440), left - Duration::from_secs(1440))
        );
        assert!(
            !cadence.is_due_before_end(Duration::from_secs(1439), left - Duration::from_secs(1439))
        );
        // A job ending within the interval saves no more.
        let short = Duration::from_secs(1000);
        assert_eq!(cadence.interval_before_end(short), short);
        // The user's interval is kept.
        let explicit = CheckpointCadence::new(IntervalSource::Explicit(Duration::from_secs(7)));
        explicit.record_save(save(30));
        assert_eq!(explicit.interval_before_end(left), Duration::from_secs(7));
    }

    #[test]
    fn a_job_that_says_nothing_of_its_end_is_spread_over_what_the_fleet_s_jobs_took() {
        let cadence = adaptive(0.2);
        cadence.record_save(save(30));
        let tau = cadence.interval();
        let hours = |h: f64| Duration::from_secs_f64(h * 3600.0);
        // No finished job seen: Daly's interval.
        assert_eq!(cadence.expected_left(Duration::ZERO), None);
        assert_eq!(cadence.interval_in_job(Duration::ZERO, Duration::ZERO), tau);
        // The fleet finished twenty 8-hour jobs (ten of them reported by
        // other workers): a job at its start is spread over 8 hours, as
        // one that knows its end.
        let mut fleet = InterruptionCounts::default();
        for _ in 0..10 {
            fleet.job_lengths.add(hours(8.0));
            cadence.note_job_length(hours(8.0));
        }
        cadence.set_fleet(fleet);
        assert_eq!(cadence.expected_left(hours(2.0)), Some(hours(6.0)));
        assert_eq!(
            cadence.interval_in_job(Duration::ZERO, Duration::ZERO),
            cadence.interval_before_end(hours(8.0))
        );
        // Half an hour after its last save, 6.5 hours in.
        let since = hours(0.5);
        assert_eq!(
            cadence.interval_in_job(since, hours(6.5)),
            cadence.interval_before_end(since + hours(1.5))
        );
        assert_eq!(
            cadence.is_due_in_job(since, hours(6.5)),
            cadence.is_due_before_end(since, hours(1.5))
        );
        // Longer than every job seen: Daly's again.
        assert_eq!(cadence.interval_in_job(since, hours(9.0)), tau);
        // An explicit interval is kept.
        let explicit = CheckpointCadence::new(IntervalSource::Explicit(Duration::from_secs(7)));
        explicit.set_fleet(fleet.plus(&fleet));
        assert_eq!(explicit.expected_left(Duration::ZERO), None);
        assert_eq!(
            explicit.interval_in_job(Duration::ZERO, Duration::ZERO),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn losses_are_counted_with_their_kind() {
        let cadence = adaptive(0.1);
        cadence.note_loss(Interruption::Unsaved, Duration::from_millis(2500));
        cadence.note_loss(Interruption::Late, Duration::from_millis(500));
        cadence.note(Interruption::Drained);
        let counts = cadence.view().counts;
        assert_eq!(
            (counts.drained, counts.unsaved, counts.late, counts.losses),
            (1, 1, 1, 2)
        );
        assert_eq!(counts.mean_loss_seconds(), Some(1.5));
        assert_eq!(counts.saved_share(), Some(1.0 / 3.0));
    }

    #[test]
    fn an_explicit_interval_wins() {
        let cadence = CheckpointCadence::new(IntervalSource::Explicit(Duration::from_secs(7)));
        cadence.record_save(save(100));
        cadence.note(Interruption::NoOutcome);
        assert_eq!(cadence.interval(), Duration::from_secs(7));
        assert!(cadence.view().explicit);
        assert!(cadence.is_due(Duration::from_secs(7)));
    }

    #[test]
    fn pending_counts_are_taken_once_and_given_back_on_failure() {
        let cadence = adaptive(0.1);
        cadence.note(Interruption::Drained);
        cadence.note(Interruption::Late);
        cadence.add_job_time(Duration::from_secs(90));
        let taken = cadence.take_pending();
        assert_eq!((taken.drained, taken.late, taken.job_seconds), (1, 1, 90.0));
        assert!(cadence.take_pending().is_empty());
        // Not added to the ledger: given back, and added to what comes next.
        cadence.give_back(taken);
        cadence.note(Interruption::NoOutcome);
        cadence.add_job_time(Duration::from_secs(10));
        let again = cadence.take_pending();
        assert_eq!(
            (
                again.drained,
                again.late,
                again.no_outcome,
                again.job_seconds
            ),
            (1, 1, 1, 100.0)
        );
        // What is pending counts in the estimates before it is added.
        cadence.note(Interruption::Late);
        assert_eq!(cadence.view().counts.late, 1);
    }

    #[test]
    fn the_pure_decision_table() {
        let secs = Duration::from_secs;
        // (measured cost, losses per hour, expected interval)
        let rows = [
            (None, 0.5, MIN_INTERVAL),
            (None, 0.0, MIN_INTERVAL),
            (Some(secs(1)), 0.5, Duration::from_secs_f64(119.334_259)),
            (Some(secs(60)), 1.0, Duration::from_secs_f64(617.876)),
            (Some(secs(60)), 0.0, super::super::daly::MAX_INTERVAL),
        ];
        for (cost, rate, expected) in rows {
            let got = adaptive_interval(cost, rate);
            assert!(
                (got.as_secs_f64() - expected.as_secs_f64()).abs() < 1e-3,
                "{cost:?} {rate}: {got:?}"
            );
        }
    }
}
