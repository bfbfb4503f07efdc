//! The checkpoint interval, proven on simulated fleets:
//! `cargo bench --bench checkpoint_interval [-- --workers N --fleets F
//! --hours H --training-workers N --job-hours J --job-model fixed|mixed
//! --behaviour saves|dies --seed S --in-sample --evictions A,B --usable A,B
//! --crashes A,B --costs A,B]` (the last four run a subset of the grid).
//!
//! For each cell of a grid (eviction rate, the share of evictions whose
//! notice is usable, crash rate, the cost of one save) and each behaviour
//! of the handler at a usable notice (it saves; or it saves on its own
//! schedule only and dies on the signal, as a program without a handler
//! for SIGTERM does), it runs [`FLEETS`] independent fleets of workers
//! doing jobs of [`JOB_HOURS`] hours of work (or, with `--job-model
//! mixed`, of lengths drawn log-uniformly from a quarter to four times
//! that) over the same seeded evaluation traces under each policy (see
//! `sim.rs`), and prints per cell each policy's overhead ((time saving +
//! work lost) / work kept) as a ratio to the best fixed interval's, and
//! the checkpoint writes per job. The best fixed interval knows the rates
//! and the behaviour in advance, not the trace: it is found by search on
//! independent training traces of the same cell (other seeds), then scored
//! on the evaluation traces like every other policy. The adaptive policy
//! (the real `CheckpointCadence`) starts from a seed rate ten times too
//! high and ten times too low and learns the rates, the share of notices
//! that save and the jobs' lengths as each fleet does; it is scored as
//! Daly's interval alone, spread over the rest the fleet's finished jobs
//! say a job has left (what every handler gets now), and for a handler
//! that says how much work its job has left. Two references separate the
//! model from the learning: Daly's interval for the true rates, and the
//! adaptive policy on fleets whose counts start with a long history at the
//! true rates. `--in-sample` also searches the evaluation traces
//! themselves (the old, over-fitted comparison) and prints how much luck
//! that finds.
//!
//! Under `cargo test --all-targets` (no `--bench`) it runs one small cell
//! for each behaviour.

mod sim;
mod trace;

use sim::{Behaviour, JobModel, Knows, Policy, Sim, Totals};
use spot_worker::decisions::cadence::clamped_interval;
use std::time::Duration;
use trace::{Cell, traces};

/// The work in one job, in hours, unless `--job-hours` says otherwise.
const JOB_HOURS: f64 = 8.0;

/// With `--job-model mixed`, jobs' work is drawn log-uniformly from this
/// many times less than `--job-hours` to this many times more.
const MIXED_SPREAD: f64 = 4.0;

/// Evictions per VM-hour.
const EVICTION_RATES: [f64; 4] = [0.01, 0.05, 0.15, 0.5];
/// The share of evictions whose notice is usable.
const USABLE_SHARES: [f64; 3] = [0.5, 0.9, 0.99];
/// Crashes, kills and lost VMs per hour.
const CRASH_RATES: [f64; 2] = [0.001, 0.01];
/// Seconds one save blocks the job.
const COSTS: [f64; 4] = [1.0, 10.0, 30.0, 120.0];
/// Independent fleets each policy runs per cell unless `--fleets` says
/// otherwise: in the cells where little is lost one fleet meets only about
/// a hundred losing interruptions, and where each falls (against each
/// policy's saves) is luck of several percent.
const FLEETS: usize = 8;

struct Options {
    /// Workers in one fleet.
    workers: usize,
    /// Independent fleets per policy and cell, each learning from scratch.
    fleets: usize,
    /// Workers in the training traces the best fixed interval is chosen on.
    training_workers: usize,
    hours: f64,
    jobs: JobModel,
    seed: u64,
    in_sample: bool,
}

fn value(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

/// The grid's values for one axis, or the ones `flag` lists.
fn axis(args: &[String], flag: &str, grid: &[f64]) -> Vec<f64> {
    value(args, flag).map_or_else(
        || grid.to_vec(),
        |list| {
            list.split(',')
                .filter_map(|v| v.trim().parse().ok())
                .collect()
        },
    )
}

/// The handlers' behaviours at a notice to run: both, unless
/// `--behaviour saves` or `--behaviour dies` says one.
fn behaviours(args: &[String]) -> Vec<Behaviour> {
    match value(args, "--behaviour").as_deref() {
        Some("saves") => vec![Behaviour::SavesAtNotice],
        Some("dies") => vec![Behaviour::DiesOnSignal],
        _ => vec![Behaviour::SavesAtNotice, Behaviour::DiesOnSignal],
    }
}

fn behaviour_name(behaviour: Behaviour) -> &'static str {
    match behaviour {
        Behaviour::SavesAtNotice => "saves at the notice",
        Behaviour::DiesOnSignal => "saves on its own schedule, dies on the signal",
    }
}

/// An adaptive policy that learns from a seed `factor` times the cell's
/// eviction rate, knowing `knows` of the job's end.
fn adaptive(cell: &Cell, factor: f64, knows: Knows) -> Policy {
    Policy::Adaptive {
        seed: cell.evictions_per_hour * factor,
        ignore_notice: false,
        knows,
        history: false,
    }
}

/// The simulation asks an adaptive policy again after every save, as
/// handlers and the runner do: a fresh worker's interval is the 10 s
/// minimum until its first save measures the cost, and then, where little
/// is lost, an hour or more. Simulated saves that kept the minimum (the
/// fault found on 2026-11-26) would make about 180 in the first hour.
fn first_saves_measure_the_cost() {
    let quiet = Cell {
        evictions_per_hour: 0.01,
        usable_share: 0.99,
        crashes_per_hour: 0.001,
        cost: 10.0,
    };
    let workers = 4;
    let trace = traces(&quiet, workers, 1.0, 1);
    let policy = adaptive(&quiet, 1.0, Knows::Nothing);
    let first_hour = Sim::new(
        quiet,
        policy,
        Behaviour::SavesAtNotice,
        JobModel::Fixed(JOB_HOURS * 3600.0),
        &trace,
        1,
    )
    .run(1.0);
    println!(
        "checkpoint_interval: a fresh fleet's first hour, {} saves by {workers} workers",
        first_hour.writes
    );
    assert!(
        first_hour.writes <= 3 * workers as u64,
        "a fresh fleet's first hour took {} saves by {workers} workers: the simulation did not ask the policy again after a save",
        first_hour.writes
    );
}

/// The ratios of one adaptive variant to the best fixed interval, per
/// seed (×10, ÷10), over the cells run.
#[derive(Default)]
struct Scores {
    high: Vec<f64>,
    low: Vec<f64>,
    worst: (f64, String),
    misses: Vec<String>,
}

impl Scores {
    fn add(&mut self, cell: &str, high: f64, low: f64) {
        self.high.push(high);
        self.low.push(low);
        for r in [high, low] {
            if r > self.worst.0 {
                self.worst = (r, cell.to_owned());
            }
        }
        if high > 1.1 || low > 1.1 {
            self.misses.push(format!("{cell}: {high:.3} / {low:.3}"));
        }
    }

    fn summary(&self, label: &str) {
        let cells = self.high.len();
        println!(
            "{cells} cells; {label}: within 1.1× of the best fixed interval in {} (both seeds); median {:.3} (seed ×10) / {:.3} (seed ÷10); worst {:.3} ({})",
            cells - self.misses.len(),
            median(&self.high),
            median(&self.low),
            self.worst.0,
            self.worst.1,
        );
        for miss in &self.misses {
            println!("  miss: {miss}");
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = args.iter().any(|a| a == "--bench");
    let job_hours = value(&args, "--job-hours")
        .and_then(|v| v.parse().ok())
        .unwrap_or(JOB_HOURS);
    let jobs = match value(&args, "--job-model").as_deref() {
        Some("mixed") => JobModel::Mixed {
            shortest: job_hours * 3600.0 / MIXED_SPREAD,
            longest: job_hours * 3600.0 * MIXED_SPREAD,
        },
        _ => JobModel::Fixed(job_hours * 3600.0),
    };
    let mut options = Options {
        workers: 20,
        fleets: FLEETS,
        training_workers: 0,
        hours: 2000.0,
        jobs,
        seed: 24,
        in_sample: args.iter().any(|a| a == "--in-sample"),
    };
    if let Some(workers) = value(&args, "--workers").and_then(|v| v.parse().ok()) {
        options.workers = workers;
    }
    if let Some(hours) = value(&args, "--hours").and_then(|v| v.parse().ok()) {
        options.hours = hours;
    }
    if let Some(seed) = value(&args, "--seed").and_then(|v| v.parse().ok()) {
        options.seed = seed;
    }
    if let Some(fleets) = value(&args, "--fleets").and_then(|v| v.parse().ok()) {
        options.fleets = fleets;
    }
    options.training_workers = value(&args, "--training-workers")
        .and_then(|v| v.parse().ok())
        .unwrap_or(options.workers * options.fleets);
    if !benchmarking {
        let cell = Cell {
            evictions_per_hour: 0.15,
            usable_share: 0.9,
            crashes_per_hour: 0.01,
            cost: 30.0,
        };
        let smoke = Options {
            workers: 4,
            fleets: 1,
            training_workers: 4,
            hours: 200.0,
            jobs: JobModel::Fixed(JOB_HOURS * 3600.0),
            seed: 1,
            in_sample: false,
        };
        for behaviour in [Behaviour::SavesAtNotice, Behaviour::DiesOnSignal] {
            let row = run_cell(&cell, behaviour, &smoke);
            println!(
                "checkpoint_interval: smoke cell, {}: adaptive/best {:.2}, learned lengths/best {:.2}; the grid is `cargo bench --bench checkpoint_interval`",
                behaviour_name(behaviour),
                row.adaptive_high.overhead() / row.best.overhead(),
                row.learned_high.overhead() / row.best.overhead(),
            );
        }
        first_saves_measure_the_cost();
        return;
    }
    let model = match options.jobs {
        JobModel::Fixed(work) => format!("jobs of {} h", work / 3600.0),
        JobModel::Mixed { shortest, longest } => format!(
            "jobs of {} h to {} h of work, log-uniform",
            shortest / 3600.0,
            longest / 3600.0
        ),
    };
    println!(
        "{} fleets of {} workers × {} h ({} job-hours per policy), {model}, seed {}; best fixed interval chosen on {} other workers' traces",
        options.fleets,
        options.workers,
        options.hours,
        (options.fleets * options.workers) as f64 * options.hours,
        options.seed,
        options.training_workers,
    );
    for behaviour in behaviours(&args) {
        run_grid(&args, behaviour, &options);
    }
}

/// Runs the grid (or the cells the flags list) for handlers that behave
/// as `behaviour` says, and prints a table and its summary.
fn run_grid(args: &[String], behaviour: Behaviour, options: &Options) {
    println!();
    println!("### A handler that {}", behaviour_name(behaviour));
    println!();
    println!(
        "| evictions/h | usable notice | crashes/h | save cost | best fixed (chosen on training) | its overhead: training | evaluation | adaptive, seed ×10 | adaptive, seed ÷10 | job lengths learned, ×10 | job lengths learned, ÷10 | job's end known, ×10 | job's end known, ÷10 | … and the rates | adaptive interval at the end | Daly, rates known | ignoring the notice | 10 min | 10 s | writes/job: adaptive | lengths learned | end known | best | 10 min | 10 s |"
    );
    println!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut scores: [Scores; 3] = Default::default();
    let (mut ignoring, mut daly) = (Vec::new(), Vec::new());
    let mut in_sample_worst = 0.0_f64;
    for &evictions_per_hour in &axis(args, "--evictions", &EVICTION_RATES) {
        for &usable_share in &axis(args, "--usable", &USABLE_SHARES) {
            for &crashes_per_hour in &axis(args, "--crashes", &CRASH_RATES) {
                for &cost in &axis(args, "--costs", &COSTS) {
                    let cell = Cell {
                        evictions_per_hour,
                        usable_share,
                        crashes_per_hour,
                        cost,
                    };
                    let row = run_cell(&cell, behaviour, options);
                    let best = row.best.overhead();
                    let ratio = |t: &Totals| t.overhead() / best;
                    let name = format!(
                        "{evictions_per_hour}/h, {usable_share} usable, {crashes_per_hour} crashes/h, {cost} s"
                    );
                    let pairs = [
                        (ratio(&row.adaptive_high), ratio(&row.adaptive_low)),
                        (ratio(&row.learned_high), ratio(&row.learned_low)),
                        (ratio(&row.knowing_high), ratio(&row.knowing_low)),
                    ];
                    for (scores, (high, low)) in scores.iter_mut().zip(pairs) {
                        scores.add(&name, high, low);
                    }
                    ignoring.push(ratio(&row.ignoring));
                    daly.push(ratio(&row.daly_known));
                    println!(
                        "| {evictions_per_hour} | {usable_share} | {crashes_per_hour} | {cost} s | {} | {:.3} % | {:.3} % | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.3} ({}) | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                        human(row.best_tau),
                        row.best_training.overhead() * 100.0,
                        best * 100.0,
                        pairs[0].0,
                        pairs[0].1,
                        pairs[1].0,
                        pairs[1].1,
                        pairs[2].0,
                        pairs[2].1,
                        ratio(&row.knowing_history),
                        human(row.adaptive_high.last_interval),
                        ratio(&row.daly_known),
                        human(row.daly_known.last_interval),
                        ratio(&row.ignoring),
                        ratio(&row.ten_minutes),
                        ratio(&row.ten_seconds),
                        row.adaptive_high.writes_per_job(),
                        row.learned_high.writes_per_job(),
                        row.knowing_high.writes_per_job(),
                        row.best.writes_per_job(),
                        row.ten_minutes.writes_per_job(),
                        row.ten_seconds.writes_per_job(),
                    );
                    if let Some((tau, in_sample)) = row.in_sample {
                        let worse = (row
                            .adaptive_high
                            .overhead()
                            .max(row.adaptive_low.overhead()))
                            / in_sample.overhead();
                        in_sample_worst = in_sample_worst.max(worse);
                        println!(
                            "|  | in sample: | | | {} | | {:.3} % | adaptive / in-sample best, worse seed: {worse:.3} | | | | | | | | | | | | | | {:.1} | | |",
                            human(tau),
                            in_sample.overhead() * 100.0,
                            in_sample.writes_per_job(),
                        );
                    }
                }
            }
        }
    }
    println!();
    println!("A handler that {}:", behaviour_name(behaviour));
    for (scores, label) in scores.iter().zip([
        "adaptive (Daly's interval)",
        "adaptive, job lengths learned",
        "adaptive, job's end known",
    ]) {
        scores.summary(label);
    }
    println!(
        "Daly, rates known: median {:.3}, worst {:.3}; ignoring the notice: median {:.3}, up to {:.2}×",
        median(&daly),
        daly.iter().copied().fold(0.0, f64::max),
        median(&ignoring),
        ignoring.iter().copied().fold(0.0, f64::max),
    );
    if options.in_sample {
        println!(
            "against the best fixed interval searched on the evaluation traces themselves: worst {in_sample_worst:.3}"
        );
    }
}

struct Row {
    /// The fixed interval chosen on the training traces, and its totals there.
    best_tau: f64,
    best_training: Totals,
    /// Its totals on the evaluation traces.
    best: Totals,
    adaptive_high: Totals,
    adaptive_low: Totals,
    /// The adaptive policy spread over the rest the fleet's finished jobs
    /// say a job has left (`is_due` now).
    learned_high: Totals,
    learned_low: Totals,
    /// The adaptive policy for handlers that tell how much work is left.
    knowing_high: Totals,
    knowing_low: Totals,
    /// The same with the fleet's history at the true rates from the start.
    knowing_history: Totals,
    ignoring: Totals,
    ten_minutes: Totals,
    ten_seconds: Totals,
    /// A fixed interval: Daly's for the cell's true rates.
    daly_known: Totals,
    /// With `--in-sample`: the best fixed interval on the evaluation traces.
    in_sample: Option<(f64, Totals)>,
}

fn run_cell(cell: &Cell, behaviour: Behaviour, options: &Options) -> Row {
    let cell_seed = options
        .seed
        .wrapping_mul(1_000_003)
        .wrapping_add((cell.evictions_per_hour * 1e4) as u64 * 7919)
        .wrapping_add((cell.usable_share * 1e3) as u64 * 104_729)
        .wrapping_add((cell.crashes_per_hour * 1e5) as u64 * 1_299_709)
        .wrapping_add(cell.cost as u64);
    // Other seeds, the same rates: what "knowing the rates" can learn.
    let training_seed = cell_seed ^ 0x7a12_a14e;
    // The first fleet's traces are the ones one fleet used to be scored on.
    let evaluation: Vec<(u64, Vec<Vec<trace::Event>>)> = (0..options.fleets.max(1) as u64)
        .map(|fleet| {
            let seed = cell_seed.wrapping_add(fleet.wrapping_mul(0x9e37_79b9));
            (seed, traces(cell, options.workers, options.hours, seed))
        })
        .collect();
    let training = traces(cell, options.training_workers, options.hours, training_seed);
    let run_on = |traces: &[Vec<trace::Event>], seed: u64, policy| {
        Sim::new(
            *cell,
            policy,
            behaviour,
            options.jobs,
            traces,
            seed ^ 0x5eed,
        )
        .run(options.hours)
    };
    // Each fleet learns on its own; their totals add up.
    let run = |policy| {
        evaluation
            .iter()
            .map(|(seed, traces)| run_on(traces, *seed, policy))
            .reduce(|a, b| a.plus(&b))
            .unwrap_or_default()
    };
    // Daly's interval for the true rates and mean cost: what the adaptive
    // policy would use if it had nothing to learn. A handler that dies on
    // the signal loses work at every eviction.
    let losing = match behaviour {
        Behaviour::SavesAtNotice => cell.evictions_per_hour * (1.0 - cell.usable_share),
        Behaviour::DiesOnSignal => cell.evictions_per_hour,
    } + cell.crashes_per_hour;
    let daly_known = clamped_interval(Duration::from_secs_f64(cell.cost), losing).as_secs_f64();
    let (best_tau, best_training) =
        best_fixed(|tau| run_on(&training, training_seed, Policy::Fixed(tau)));
    Row {
        best_tau,
        best_training,
        best: run(Policy::Fixed(best_tau)),
        adaptive_high: run(adaptive(cell, 10.0, Knows::Nothing)),
        adaptive_low: run(adaptive(cell, 0.1, Knows::Nothing)),
        learned_high: run(adaptive(cell, 10.0, Knows::Lengths)),
        learned_low: run(adaptive(cell, 0.1, Knows::Lengths)),
        knowing_high: run(adaptive(cell, 10.0, Knows::End)),
        knowing_low: run(adaptive(cell, 0.1, Knows::End)),
        knowing_history: run(Policy::Adaptive {
            seed: cell.evictions_per_hour,
            ignore_notice: false,
            knows: Knows::End,
            history: true,
        }),
        ignoring: run(Policy::Adaptive {
            seed: cell.evictions_per_hour,
            ignore_notice: true,
            knows: Knows::Nothing,
            history: false,
        }),
        ten_minutes: run(Policy::Fixed(600.0)),
        ten_seconds: run(Policy::Fixed(10.0)),
        daly_known: run(Policy::Fixed(daly_known)),
        in_sample: options
            .in_sample
            .then(|| best_fixed(|tau| run(Policy::Fixed(tau)))),
    }
}

/// The fixed interval with the least overhead on the traces `run` uses: a
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
