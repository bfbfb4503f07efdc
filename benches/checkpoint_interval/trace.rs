//! The interruptions each simulated worker meets: a seeded Poisson stream
//! per worker, the same for every policy compared in a cell (common random
//! numbers, so a ratio between two policies is not noise between two
//! traces).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spot_worker::decisions::cadence::Interruption;

/// One grid cell: the rates and the cost the fleet really has.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    /// Evictions per VM-hour.
    pub evictions_per_hour: f64,
    /// The share of evictions whose notice is usable (progress saved).
    pub usable_share: f64,
    /// Crashes, kills and lost VMs (no notice at all) per hour.
    pub crashes_per_hour: f64,
    /// The time one save blocks the job, in seconds.
    pub cost: f64,
}

/// One interruption: when (seconds from the start) and what.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub at: f64,
    pub kind: Interruption,
}

/// Each worker's interruptions over `hours`, drawn from `seed`.
pub fn traces(cell: &Cell, workers: usize, hours: f64, seed: u64) -> Vec<Vec<Event>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let total_per_second = (cell.evictions_per_hour + cell.crashes_per_hour) / 3600.0;
    let end = hours * 3600.0;
    (0..workers)
        .map(|_| {
            let mut events = Vec::new();
            let mut at = 0.0;
            loop {
                // Exponential gaps: 1 − U is in (0, 1], so the log is finite.
                at += -(1.0 - rng.random::<f64>()).ln() / total_per_second;
                if at >= end {
                    break events;
                }
                let crash = rng.random::<f64>() * (cell.evictions_per_hour + cell.crashes_per_hour)
                    < cell.crashes_per_hour;
                let kind = if crash {
                    Interruption::NoOutcome
                } else if rng.random::<f64>() < cell.usable_share {
                    Interruption::Drained
                } else {
                    Interruption::Late
                };
                events.push(Event { at, kind });
            }
        })
        .collect()
}

/// A multiplier with mean 1 and a spread of about 30 % (log-normal), for
/// the measured cost of one save: the meter sees noisy saves, the model's
/// time uses their mean.
pub fn cost_noise(rng: &mut StdRng) -> f64 {
    const SIGMA: f64 = 0.3;
    // Box–Muller.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (SIGMA * normal - SIGMA * SIGMA / 2.0).exp()
}
