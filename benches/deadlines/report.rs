//! Every policy over the same starts of one trace, and what is printed of
//! them: one JSON line per policy.

use serde_json::json;

use crate::model::{Job, LanePolicy, Outcome, simulate};
use crate::optimum::optimum;
use crate::trace::Trace;

/// One policy's outcomes, start by start (the same starts for all).
pub struct Runs {
    pub policy: &'static str,
    pub outcomes: Vec<Outcome>,
}

impl Runs {
    pub fn costs(&self) -> Vec<f64> {
        self.outcomes.iter().map(|o| o.cost).collect()
    }

    pub fn mean_cost(&self) -> f64 {
        mean(&self.costs())
    }

    pub fn missed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.missed).count()
    }
}

/// The policies' runs over `starts`, then the optimum's (named
/// "optimum"; its Spot and regular hours are not tracked).
pub fn run_all(
    trace: &Trace,
    job: &Job,
    starts: &[usize],
    policies: &mut [Box<dyn LanePolicy>],
) -> Vec<Runs> {
    let mut all: Vec<Runs> = policies
        .iter_mut()
        .map(|policy| Runs {
            policy: policy.name(),
            outcomes: starts
                .iter()
                .map(|&start| simulate(trace.from(start), job, policy.as_mut()))
                .collect(),
        })
        .collect();
    let on_demand = (job.work + job.overhead) / 3600.0 * job.price_ratio;
    let bound = if job.work + job.overhead <= job.deadline {
        on_demand
    } else {
        f64::INFINITY
    };
    let optimum = starts
        .iter()
        .map(|&start| {
            let cost = optimum(trace.from(start), job, bound);
            Outcome {
                cost: cost.unwrap_or(f64::INFINITY),
                missed: cost.is_none(),
                ..Outcome::default()
            }
        })
        .collect();
    all.push(Runs {
        policy: "optimum",
        outcomes: optimum,
    });
    all
}

pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The share of greedy's excess over the optimum that `runs` removes, on
/// average: (greedy − policy) / (greedy − optimum), of the mean costs;
/// `None` where greedy is already optimal.
pub fn gap_closed(runs: &Runs, greedy: &Runs, optimum: &Runs) -> Option<f64> {
    let gap = greedy.mean_cost() - optimum.mean_cost();
    (gap > 1e-9).then(|| (greedy.mean_cost() - runs.mean_cost()) / gap)
}

/// How many starts `runs` met the deadline on for less than the optimum
/// (must be none: the optimum is the least cost of a schedule that meets
/// it; a late job can be cheaper, and is counted in `missed` instead).
pub fn beats_optimum(runs: &Runs, optimum: &Runs) -> usize {
    runs.outcomes
        .iter()
        .zip(&optimum.outcomes)
        .filter(|(r, o)| !r.missed && r.cost < o.cost - 1e-9)
        .count()
}

/// One JSON line per policy.
pub fn json_lines(trace: &Trace, job: &Job, all: &[Runs]) -> Vec<String> {
    let find = |name: &str| all.iter().find(|r| r.policy == name);
    let (greedy, optimum, on_demand) = (find("greedy"), find("optimum"), find("on-demand"));
    all.iter()
        .map(|runs| {
            let costs = runs.costs();
            let hours = |f: fn(&Outcome) -> f64| mean(&runs.outcomes.iter().map(f).collect::<Vec<_>>());
            let closed = greedy.zip(optimum).and_then(|(g, o)| gap_closed(runs, g, o));
            json!({
                "policy": runs.policy,
                "mean_cost": round(runs.mean_cost()),
                "median_cost": round(median(&costs)),
                "worst_cost": round(costs.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
                "missed": runs.missed(),
                "gap_closed": closed.map(round),
                "vs_on_demand": on_demand.map(|od| round(runs.mean_cost() / od.mean_cost())),
                "spot_hours": (runs.policy != "optimum").then(|| round(hours(|o| o.spot_hours))),
                "regular_hours": (runs.policy != "optimum").then(|| round(hours(|o| o.regular_hours))),
                "starts_per_job": (runs.policy != "optimum").then(|| round(hours(|o| f64::from(o.starts)))),
                "beats_optimum": optimum.map(|o| beats_optimum(runs, o)),
                "trace": trace.name,
                "work_hours": job.work / 3600.0,
                "deadline_hours": job.deadline / 3600.0,
                "overhead_hours": job.overhead / 3600.0,
                "price_ratio": job.price_ratio,
                "starts": runs.outcomes.len(),
            })
            .to_string()
        })
        .collect()
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}
