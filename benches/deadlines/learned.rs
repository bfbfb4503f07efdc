//! What a fleet learns of its Spot capacity: how long it stays away (each
//! outage) and how long it stays (each run), from what it saw before a
//! job started and while it ran. Only the past: a policy is told each
//! tick after it happened.

use std::collections::VecDeque;

use crate::trace::Window;

/// How much must be seen before the outages seen are taken as the
/// fleet's: a day. A few hours at the start of a trace can hold one long
/// outage and nothing else.
pub const MIN_HISTORY_HOURS: f64 = 24.0;

/// What a job has, for [`SpotHistory::patience`]: seconds and a price ratio.
pub struct Plan {
    /// Seconds to the deadline.
    pub time_left: f64,
    /// Seconds of work left.
    pub work_left: f64,
    /// The slack the job may spend, past the safety net's reserve.
    pub budget: f64,
    /// d.
    pub overhead: f64,
    /// k.
    pub price_ratio: f64,
}

/// The Spot capacity seen, tick by tick: the lengths of the outages and
/// runs that ended within the last [`WINDOW_HOURS`], and how long the
/// current one has lasted. A window, not all of it: Spot capacity changes
/// its ways (a trace can go from a day of scarcity to days of plenty), and
/// what a fleet saw a week ago says less than what it saw today.
#[derive(Clone, Debug, Default)]
pub struct SpotHistory {
    /// Seconds seen in all.
    total: f64,
    /// What ended within the window, oldest first: (when it ended, whether
    /// it was an outage, its length).
    ended: VecDeque<(f64, bool, f64)>,
    /// Lengths of the outages in the window, seconds, shortest first.
    pub outages: Vec<f64>,
    /// Lengths of the runs of availability in the window, seconds.
    pub runs: Vec<f64>,
    /// Whether the last tick seen had Spot, and for how long that has been
    /// so (seconds); `None` before any tick.
    current: Option<(bool, f64)>,
}

/// How far back the history looks: three days.
pub const WINDOW_HOURS: f64 = 72.0;

impl SpotHistory {
    /// Seconds of the window seen.
    pub fn seen(&self) -> f64 {
        self.total.min(WINDOW_HOURS * 3600.0)
    }

    /// One more tick seen.
    pub fn see(&mut self, available: bool, gap: f64) {
        self.total += gap;
        self.current = match self.current {
            Some((was, age)) if was == available => Some((was, age + gap)),
            Some((was, age)) => {
                self.ended.push_back((self.total - gap, !was, age));
                if was {
                    self.runs.push(age);
                } else {
                    let at = self.outages.partition_point(|l| *l <= age);
                    self.outages.insert(at, age);
                }
                Some((available, gap))
            }
            None => Some((available, gap)),
        };
        while let Some(&(end, outage, length)) = self.ended.front() {
            if end >= self.total - WINDOW_HOURS * 3600.0 {
                break;
            }
            self.ended.pop_front();
            let list = if outage {
                &mut self.outages
            } else {
                &mut self.runs
            };
            if let Some(at) = list.iter().position(|l| *l == length) {
                list.remove(at);
            }
        }
    }

    /// The `hours` of the trace before tick 0 of `window` (only ticks the
    /// trace has before the job's start: never its wrapped-around future).
    pub fn before(window: Window<'_>, hours: f64) -> SpotHistory {
        let mut history = SpotHistory::default();
        let ticks = ((hours * 3600.0) / window.gap()) as usize;
        for back in (1..=ticks.min(window.start())).rev() {
            history.see(window.at_before(back), window.gap());
        }
        history
    }

    /// How long Spot has been away, seconds (0 while it is there).
    pub fn outage_age(&self) -> f64 {
        match self.current {
            Some((false, age)) => age,
            _ => 0.0,
        }
    }

    /// Seconds from one outage's start to the next's, on average; `None`
    /// before two outages and [`MIN_HISTORY_HOURS`] were seen.
    pub fn mean_cycle(&self) -> Option<f64> {
        (self.outages.len() >= 2 && self.total >= MIN_HISTORY_HOURS * 3600.0)
            .then(|| self.seen() / self.outages.len() as f64)
    }

    /// The mean length of a run of Spot, seconds; `None` before one ended.
    pub fn mean_run(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| self.runs.iter().sum::<f64>() / self.runs.len() as f64)
    }

    /// The share of the time seen with Spot.
    pub fn availability(&self) -> f64 {
        let runs: f64 = self.runs.iter().sum();
        let outages: f64 = self.outages.iter().sum();
        if runs + outages > 0.0 {
            runs / (runs + outages)
        } else {
            0.0
        }
    }

    /// How long a job waiting for Spot should wait in each outage before
    /// it bridges the rest with regular capacity: the θ (among the outage
    /// lengths seen, or no limit) that costs least, in Spot-hours, over
    /// the outages to come in `plan.time_left` (one per mean cycle, each
    /// drawn from those seen):
    ///
    /// - each outage waited out costs its length and d in slack; one that
    ///   outlasts θ costs θ + 2d in slack (a regular start, then the Spot
    ///   start it needs anyway), and d plus the rest of it and d on
    ///   regular capacity in money: the premium k − 1 per regular hour,
    ///   except for the regular hours the job needs anyway, because the
    ///   Spot it can expect (the share of time with Spot times the time
    ///   left) does not cover its work left;
    /// - when this needs more slack than `plan.budget`, the slack runs out
    ///   after budget / need of the time left, and the safety net puts the
    ///   job on regular capacity for the rest of it, while Spot might have
    ///   been there: k − 1 per hour, times the share of time with Spot.
    ///
    /// `None` before two outages were seen.
    pub fn patience(&self, plan: &Plan) -> Option<f64> {
        let cycle = self.mean_cycle()?;
        let coming = plan.time_left / cycle;
        let lengths = &self.outages;
        let n = lengths.len() as f64;
        let (d, premium) = (plan.overhead, plan.price_ratio - 1.0);
        let share = self.availability();
        let needed_anyway = (plan.work_left - share * plan.time_left).max(0.0);
        let total: f64 = lengths.iter().sum();
        // θ with the `longer` longest outages outlasting it, which add up
        // to `tail`.
        let cost = |theta: f64, longer: f64, tail: f64| {
            // (No limit: none outlasts it, and ∞ · 0 must not be NaN.)
            let waited = if longer > 0.0 {
                total - tail + theta * longer
            } else {
                total
            };
            let slack = coming * (waited + d * n + d * longer) / n;
            let regular = if longer > 0.0 {
                coming * (tail - theta * longer + d * longer) / n
            } else {
                0.0
            };
            let money = coming * longer / n * d + premium * (regular - needed_anyway).max(0.0);
            // Waiting at this pace, the slack runs out after budget/slack
            // of the time left; the rest of it is on regular capacity.
            let cut_short = if slack > plan.budget {
                1.0 - plan.budget / slack
            } else {
                0.0
            };
            money + premium * share * plan.time_left * cut_short
        };
        let mut best = (cost(f64::INFINITY, 0.0, 0.0), f64::INFINITY);
        // Shortest first (the lengths are kept sorted): from θ = 0 (all
        // bridged) up.
        let mut tail = total;
        let mut at = 0;
        for theta in std::iter::once(0.0).chain(lengths.iter().copied()) {
            while at < lengths.len() && lengths[at] <= theta {
                tail -= lengths[at];
                at += 1;
            }
            let c = cost(theta, (lengths.len() - at) as f64, tail);
            if c < best.0 {
                best = (c, theta);
            }
        }
        Some(best.1)
    }

    /// The age from which a run of Spot is worth joining for a job whose
    /// slack cannot pay two switches in every cycle to come: the runs
    /// the budget pays for are the longest ones, and a run that has
    /// lasted as long as the shortest of those is taken to be one of them.
    pub fn joining_age(&self, plan: &Plan) -> f64 {
        let Some(cycle) = self.mean_cycle() else {
            return 0.0;
        };
        let switches = plan.time_left / cycle * 2.0 * plan.overhead;
        if switches <= plan.budget {
            return 0.0;
        }
        self.run_quantile(1.0 - (plan.budget / switches).max(0.0))
    }

    /// How long Spot has been there, seconds (0 while it is away).
    pub fn run_age(&self) -> f64 {
        match self.current {
            Some((true, age)) => age,
            _ => 0.0,
        }
    }

    /// The `share` quantile of the run lengths seen (0 for none).
    pub fn run_quantile(&self, share: f64) -> f64 {
        let mut runs = self.runs.clone();
        runs.sort_by(f64::total_cmp);
        if runs.is_empty() {
            return 0.0;
        }
        let at = ((runs.len() as f64 * share.clamp(0.0, 1.0)) as usize).min(runs.len() - 1);
        runs[at]
    }
}
