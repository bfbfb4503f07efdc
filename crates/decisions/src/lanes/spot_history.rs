//! [`SpotHistory`]: what a fleet has seen of its Spot capacity: how long
//! it stays away (each outage) and how long it stays (each run), within a
//! window of the last [`WINDOW_HOURS`], and whether it is there now. Only
//! the past: it is told what was seen, when it was seen.
//!
//! Times are seconds on one clock, `f64` (the workers pass Unix seconds,
//! the bench the seconds of its trace). Sightings come as transitions
//! ([`SpotHistory::see`]): "Spot was there at t" (a Spot worker was heard
//! from), "Spot was gone at t" (a Spot VM was evicted). Seeing the same
//! state again changes nothing, so a fleet of workers can all report.
//!
//! A window, not everything: Spot capacity changes its ways (a trace can go
//! from a day of scarcity to days of plenty), and what a fleet saw a week
//! ago says less than what it saw today.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// How far back the history looks: three days.
pub const WINDOW_HOURS: f64 = 72.0;

/// How much must be seen before the outages seen are taken as the fleet's:
/// a day. A few hours can hold one long outage and nothing else.
pub const MIN_HISTORY_HOURS: f64 = 24.0;

/// The most periods kept (the oldest go first): a bound on the stored
/// document whatever the capacity does (a change every 30 s for three days
/// is under 9,000).
pub const MAX_PERIODS: usize = 4096;

/// One outage or run that ended.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Period {
    /// When it ended, seconds.
    pub end: f64,
    /// Whether Spot was away (an outage) or there (a run).
    pub outage: bool,
    /// How long it lasted, seconds.
    pub length: f64,
}

/// The state now, and since when.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Current {
    /// Whether Spot is there.
    pub there: bool,
    /// Since when, seconds.
    pub since: f64,
}

/// What a job has, for [`SpotHistory::patience`] and
/// [`SpotHistory::joining_age`]: seconds, and a price ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Seconds to the deadline.
    pub time_left: f64,
    /// Seconds of work left.
    pub work_left: f64,
    /// The slack the job may spend, past the safety net's reserve.
    pub budget: f64,
    /// d, seconds.
    pub overhead: f64,
    /// k: a regular hour's price over a Spot hour's.
    pub price_ratio: f64,
}

/// The fleet's Spot capacity as seen (see the module documentation).
///
/// ```
/// use spot_worker_decisions::lanes::SpotHistory;
///
/// let mut seen = SpotHistory::default();
/// seen.see(true, 0.0);
/// seen.see(false, 3600.0); // evicted after an hour
/// seen.see(true, 5400.0); // back half an hour later
/// assert_eq!(seen.outages(7200.0), vec![1800.0]);
/// assert_eq!(seen.mean_run(7200.0), Some(3600.0));
/// assert_eq!(seen.run_age(7200.0), 1800.0);
/// assert!(seen.is_there());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpotHistory {
    /// When the first sighting was.
    first: Option<f64>,
    /// What ended, oldest first (only those within the window are used).
    ended: VecDeque<Period>,
    /// The state now; `None` before any sighting.
    current: Option<Current>,
}

impl SpotHistory {
    /// Spot was (`there`) or was not there at `at`. A sighting older than
    /// the current state's start changes nothing (reports cross on the
    /// way), nor does one of the state already current.
    pub fn see(&mut self, there: bool, at: f64) {
        if !at.is_finite() {
            return;
        }
        let Some(current) = self.current else {
            self.first = Some(at);
            self.current = Some(Current { there, since: at });
            return;
        };
        if current.there == there || at < current.since {
            return;
        }
        self.ended.push_back(Period {
            end: at,
            outage: !current.there,
            length: at - current.since,
        });
        self.current = Some(Current { there, since: at });
        while self.ended.len() > MAX_PERIODS
            || self
                .ended
                .front()
                .is_some_and(|p| p.end < at - WINDOW_HOURS * 3600.0)
        {
            self.ended.pop_front();
        }
    }

    /// Whether the last sighting said Spot was there.
    pub fn is_there(&self) -> bool {
        self.current.is_some_and(|c| c.there)
    }

    /// The state now, if anything was seen.
    pub fn current(&self) -> Option<Current> {
        self.current
    }

    /// Seconds of the window seen by `now`.
    pub fn seen(&self, now: f64) -> f64 {
        self.first
            .map_or(0.0, |first| (now - first).clamp(0.0, WINDOW_HOURS * 3600.0))
    }

    fn in_window(&self, now: f64) -> impl Iterator<Item = &Period> {
        let from = now - WINDOW_HOURS * 3600.0;
        self.ended.iter().filter(move |p| p.end >= from)
    }

    /// The lengths of the outages that ended in the window, shortest first.
    pub fn outages(&self, now: f64) -> Vec<f64> {
        let mut lengths: Vec<f64> = self
            .in_window(now)
            .filter(|p| p.outage)
            .map(|p| p.length)
            .collect();
        lengths.sort_by(f64::total_cmp);
        lengths
    }

    /// The lengths of the runs of Spot that ended in the window, shortest
    /// first.
    pub fn runs(&self, now: f64) -> Vec<f64> {
        let mut lengths: Vec<f64> = self
            .in_window(now)
            .filter(|p| !p.outage)
            .map(|p| p.length)
            .collect();
        lengths.sort_by(f64::total_cmp);
        lengths
    }

    /// How long Spot has been away at `now`, seconds (0 while it is there
    /// or before any sighting).
    pub fn outage_age(&self, now: f64) -> f64 {
        match self.current {
            Some(Current {
                there: false,
                since,
            }) => (now - since).max(0.0),
            _ => 0.0,
        }
    }

    /// How long Spot has been there at `now`, seconds (0 while it is away).
    pub fn run_age(&self, now: f64) -> f64 {
        match self.current {
            Some(Current { there: true, since }) => (now - since).max(0.0),
            _ => 0.0,
        }
    }

    /// Seconds from one outage's start to the next's, on average; `None`
    /// before two outages and [`MIN_HISTORY_HOURS`] were seen.
    pub fn mean_cycle(&self, now: f64) -> Option<f64> {
        let outages = self.in_window(now).filter(|p| p.outage).count();
        let since_first = self.first.map_or(0.0, |first| now - first);
        (outages >= 2 && since_first >= MIN_HISTORY_HOURS * 3600.0)
            .then(|| self.seen(now) / outages as f64)
    }

    /// The mean length of a run of Spot, seconds; `None` before one ended.
    pub fn mean_run(&self, now: f64) -> Option<f64> {
        let runs = self.runs(now);
        (!runs.is_empty()).then(|| runs.iter().sum::<f64>() / runs.len() as f64)
    }

    /// The share of the ended periods' time with Spot (0 with none).
    pub fn availability(&self, now: f64) -> f64 {
        let (mut runs, mut outages) = (0.0, 0.0);
        for p in self.in_window(now) {
            if p.outage {
                outages += p.length;
            } else {
                runs += p.length;
            }
        }
        if runs + outages > 0.0 {
            runs / (runs + outages)
        } else {
            0.0
        }
    }

    /// How long a job waiting for Spot should wait in each outage before it
    /// bridges the rest with regular capacity: the θ (among the outage
    /// lengths seen, or no limit) that costs least, in Spot-hours, over the
    /// outages to come in `plan.time_left` (one per mean cycle, each drawn
    /// from those seen):
    ///
    /// - each outage waited out costs its length and d in slack; one that
    ///   outlasts θ costs θ + 2d in slack (a regular start, then the Spot
    ///   start it needs anyway), and d plus the rest of it and d on regular
    ///   capacity in money: the premium k − 1 per regular hour, except for
    ///   the regular hours the job needs anyway, because the Spot it can
    ///   expect (the share of time with Spot times the time left) does not
    ///   cover its work left;
    /// - when this needs more slack than `plan.budget`, the slack runs out
    ///   after budget / need of the time left, and the safety net puts the
    ///   job on regular capacity for the rest of it, while Spot might have
    ///   been there: k − 1 per hour, times the share of time with Spot.
    ///
    /// `None` before two outages and a day were seen
    /// ([`mean_cycle`](Self::mean_cycle)).
    pub fn patience(&self, plan: &Plan, now: f64) -> Option<f64> {
        let cycle = self.mean_cycle(now)?;
        let lengths = self.outages(now);
        Some(cheapest_patience(
            &lengths,
            plan,
            plan.time_left / cycle,
            self.availability(now),
        ))
    }

    /// The age from which a run of Spot is worth joining for a job whose
    /// slack cannot pay two switches in every cycle to come: the runs the
    /// budget pays for are the longest ones, and a run that has lasted as
    /// long as the shortest of those is taken to be one of them. 0 when the
    /// budget pays for every cycle, or before a cycle is known.
    pub fn joining_age(&self, plan: &Plan, now: f64) -> f64 {
        let Some(cycle) = self.mean_cycle(now) else {
            return 0.0;
        };
        let switches = plan.time_left / cycle * 2.0 * plan.overhead;
        if switches <= plan.budget {
            return 0.0;
        }
        quantile(&self.runs(now), 1.0 - (plan.budget / switches).max(0.0))
    }
}

/// The `share` quantile of `sorted` (0 for none).
fn quantile(sorted: &[f64], share: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 * share.clamp(0.0, 1.0)) as usize).min(sorted.len() - 1);
    sorted[at]
}

/// [`SpotHistory::patience`]'s search, over the outage `lengths` seen
/// (sorted), with `coming` outages expected and Spot there a `share` of the
/// time.
fn cheapest_patience(lengths: &[f64], plan: &Plan, coming: f64, share: f64) -> f64 {
    let n = lengths.len() as f64;
    let (d, premium) = (plan.overhead, plan.price_ratio - 1.0);
    let needed_anyway = (plan.work_left - share * plan.time_left).max(0.0);
    let total: f64 = lengths.iter().sum();
    // θ with the `longer` longest outages outlasting it, which add up to
    // `tail`.
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
        // Waiting at this pace, the slack runs out after budget / slack of
        // the time left; the rest of it is on regular capacity.
        let cut_short = if slack > plan.budget {
            1.0 - plan.budget / slack
        } else {
            0.0
        };
        money + premium * share * plan.time_left * cut_short
    };
    let mut best = (cost(f64::INFINITY, 0.0, 0.0), f64::INFINITY);
    // Shortest first: from θ = 0 (all bridged) up.
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
    best.1
}

#[cfg(test)]
mod tests;
