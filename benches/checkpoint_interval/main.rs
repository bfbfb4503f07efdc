//! The checkpoint interval, proven on a simulated fleet:
//! `cargo bench --bench checkpoint_interval [-- --workers N --hours H --job-hours J --seed S]`.
//!
//! For each cell of a grid (eviction rate, the share of evictions whose
//! notice is usable, crash rate, the cost of one save) it runs a fleet of
//! workers doing jobs of [`JOB_HOURS`] hours of work over the same seeded
//! interruption traces under each policy (see `sim.rs`), and prints per
//! cell each policy's overhead ((time saving + work lost) / work kept) as
//! a ratio to the best fixed interval, found by search over the same
//! traces, and the checkpoint writes per job. The adaptive policy (the
//! real `CheckpointCadence`) starts from a seed rate ten times too high
//! and ten times too low and learns the rates as the fleet does; the best
//! fixed interval knows them in advance.
//!
//! Under `cargo test --all-targets` (no `--bench`) it runs one small cell.

mod sim;
mod trace;

use sim::{Policy, Sim, Totals};
use trace::{Cell, traces};

/// The work in one job, in hours, unless `--job-hours` says otherwise.
const JOB_HOURS: f64 = 8.0;

/// Evictions per VM-hour.
const EVICTION_RATES: [f64; 4] = [0.01, 0.05, 0.15, 0.5];
/// The share of evictions whose notice is usable.
const USABLE_SHARES: [f64; 3] = [0.5, 0.9, 0.99];
/// Crashes, kills and lost VMs per hour.
const CRASH_RATES: [f64; 2] = [0.001, 0.01];
/// Seconds one save blocks the job.
const COSTS: [f64; 4] = [1.0, 10.0, 30.0, 120.0];

struct Options {
    workers: usize,
    hours: f64,
    job_hours: f64,
    seed: u64,
}

fn value(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = args.iter().any(|a| a == "--bench");
    let mut options = Options {
        workers: 20,
        hours: 2000.0,
        job_hours: JOB_HOURS,
        seed: 24,
    };
    if let Some(job_hours) = value(&args, "--job-hours").and_then(|v| v.parse().ok()) {
        options.job_hours = job_hours;
    }
    if let Some(workers) = value(&args, "--workers").and_then(|v| v.parse().ok()) {
        options.workers = workers;
    }
    if let Some(hours) = value(&args, "--hours").and_then(|v| v.parse().ok()) {
        options.hours = hours;
    }
    if let Some(seed) = value(&args, "--seed").and_then(|v| v.parse().ok()) {
        options.seed = seed;
    }
    if !benchmarking {
        let cell = Cell {
            evictions_per_hour: 0.15,
            usable_share: 0.9,
            crashes_per_hour: 0.01,
            cost: 30.0,
        };
        let row = run_cell(
            &cell,
            &Options {
                workers: 4,
                hours: 200.0,
                job_hours: JOB_HOURS,
                seed: 1,
            },
        );
        println!(
            "checkpoint_interval: smoke cell, adaptive/best {:.2}; the grid is `cargo bench --bench checkpoint_interval`",
            row.adaptive_high.overhead() / row.best.overhead()
        );
        return;
    }
    println!(
        "{} workers × {} h ({} job-hours per policy), jobs of {} h, seed {}",
        options.workers,
        options.hours,
        options.workers as f64 * options.hours,
        options.job_hours,
        options.seed
    );
    println!();
    println!(
        "| evictions/h | usable notice | crashes/h | save cost | best fixed | its overhead | adaptive, seed ×10 | adaptive, seed ÷10 | ignoring the notice | 10 min | 10 s | writes/job: adaptive | best | 10 min | 10 s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worst = (0.0_f64, String::new());
    let mut misses = 0;
    let mut ignoring_worst = 0.0_f64;
    let mut cells = 0;
    for &evictions_per_hour in &EVICTION_RATES {
        for &usable_share in &USABLE_SHARES {
            for &crashes_per_hour in &CRASH_RATES {
                for &cost in &COSTS {
                    let cell = Cell {
                        evictions_per_hour,
                        usable_share,
                        crashes_per_hour,
                        cost,
                    };
                    let row = run_cell(&cell, &options);
                    let best = row.best.overhead();
                    let ratio = |t: &Totals| t.overhead() / best;
                    let (high, low) = (ratio(&row.adaptive_high), ratio(&row.adaptive_low));
                    let name = format!(
                        "{evictions_per_hour}/h, {usable_share} usable, {crashes_per_hour} crashes/h, {cost} s"
                    );
                    for r in [high, low] {
                        if r > worst.0 {
                            worst = (r, name.clone());
                        }
                    }
                    if high > 1.1 || low > 1.1 {
                        misses += 1;
                    }
                    ignoring_worst = ignoring_worst.max(ratio(&row.ignoring));
                    cells += 1;
                    println!(
                        "| {evictions_per_hour} | {usable_share} | {crashes_per_hour} | {cost} s | {} | {:.3} % | {high:.3} | {low:.3} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.0} |",
                        human(row.best_tau),
                        best * 100.0,
                        ratio(&row.ignoring),
                        ratio(&row.ten_minutes),
                        ratio(&row.ten_seconds),
                        row.adaptive_high.writes_per_job(),
                        row.best.writes_per_job(),
                        row.ten_minutes.writes_per_job(),
                        row.ten_seconds.writes_per_job(),
                    );
                }
            }
        }
    }
    println!();
    println!(
        "{cells} cells; adaptive within 1.1× of the best fixed interval in {} (both seeds); worst {:.3} ({}); ignoring the notice: up to {:.2}×",
        cells - misses,
        worst.0,
        worst.1,
        ignoring_worst
    );
}

struct Row {
    best_tau: f64,
    best: Totals,
    adaptive_high: Totals,
    adaptive_low: Totals,
    ignoring: Totals,
    ten_minutes: Totals,
    ten_seconds: Totals,
}

fn run_cell(cell: &Cell, options: &Options) -> Row {
    let cell_seed = options
        .seed
        .wrapping_mul(1_000_003)
        .wrapping_add((cell.evictions_per_hour * 1e4) as u64 * 7919)
        .wrapping_add((cell.usable_share * 1e3) as u64 * 104_729)
        .wrapping_add((cell.crashes_per_hour * 1e5) as u64 * 1_299_709)
        .wrapping_add(cell.cost as u64);
    let traces = traces(cell, options.workers, options.hours, cell_seed);
    let run = |policy| {
        Sim::new(
            *cell,
            policy,
            options.job_hours,
            &traces,
            cell_seed ^ 0x5eed,
        )
        .run(options.hours)
    };
    let (best_tau, best) = best_fixed(|tau| run(Policy::Fixed(tau)));
    Row {
        best_tau,
        best,
        adaptive_high: run(Policy::Adaptive {
            seed: cell.evictions_per_hour * 10.0,
            ignore_notice: false,
        }),
        adaptive_low: run(Policy::Adaptive {
            seed: cell.evictions_per_hour / 10.0,
            ignore_notice: false,
        }),
        ignoring: run(Policy::Adaptive {
            seed: cell.evictions_per_hour,
            ignore_notice: true,
        }),
        ten_minutes: run(Policy::Fixed(600.0)),
        ten_seconds: run(Policy::Fixed(10.0)),
    }
}

/// The fixed interval with the least overhead on the cell's traces: a
/// log-spaced scan from 5 s to 48 h (10 % steps), then a finer one (1 %)
/// around the best.
fn best_fixed(run: impl Fn(f64) -> Totals) -> (f64, Totals) {
    let mut best: Option<(f64, Totals)> = None;
    let consider = |tau: f64, best: &mut Option<(f64, Totals)>| {
        let totals = run(tau);
        if best
            .as_ref()
            .is_none_or(|(_, b)| totals.overhead() < b.overhead())
        {
            *best = Some((tau, totals));
        }
    };
    let (low, high) = (5.0_f64, 48.0 * 3600.0);
    let steps = ((high / low).ln() / 1.1_f64.ln()).ceil() as i32;
    for step in 0..=steps {
        consider(low * 1.1_f64.powi(step), &mut best);
    }
    let centre = best.as_ref().map_or(low, |(tau, _)| *tau);
    for step in -10..=10 {
        consider(centre * 1.01_f64.powi(step), &mut best);
    }
    best.expect("the scan considers at least one interval")
}

fn human(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 7200.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}
