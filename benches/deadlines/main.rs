//! Deadlines, proven on real Spot traces (issue 31, docs/deadlines.md):
//!
//! ```text
//! cargo bench --bench deadlines -- --trace FILE [--work-hours 48]
//!     [--deadline-hours 52] [--overhead-hours 0.2] [--price-ratio 3]
//!     [--starts 300]
//! cargo bench --bench deadlines -- --grid DIR [--starts 300]
//! ```
//!
//! One job of W hours of work, due D hours after it is enqueued, started
//! at N ticks spread evenly through the trace, under each policy: on
//! regular capacity only (`on-demand`), the paper's `greedy`, Uniform
//! Progress (`uniform-progress`: the workers' own `choose_lane`, told
//! whether Spot is there; `uniform-progress-blind`, told it always is),
//! the workers' default `patient` (`choose_lane_patiently`, learning from
//! the trace's past), and the omniscient `optimum` (dynamic programming
//! with the trace's future known). One JSON line per policy: the mean, median and worst cost in
//! Spot-hours, the deadlines missed, the share of the gap between greedy
//! and the optimum closed, the hours by lane. The model is in `model.rs`.
//! `--grid DIR` runs every trace under DIR with the issue's settings
//! (W = 48 h; D = 52 h and 70 h; d = 0.05 h and 0.2 h; k = 3) and ends
//! with a table and whether the goal holds in every cell.
//!
//! `DEADLINES_DUMP=1` also prints each start's cost by policy to stderr.
//!
//! Under `cargo test --all-targets` (no `--bench`) it runs the smoke
//! checks in `smoke.rs` on synthetic traces.

mod grid;
mod model;
mod optimum;
mod ours;
mod policies;
mod report;
mod smoke;
mod trace;

use std::path::Path;
use std::time::Instant;

use model::{Job, LanePolicy};
use report::{json_lines, run_all};
use trace::Trace;

/// The policies compared, in the order printed (the optimum comes last).
pub fn policies() -> Vec<Box<dyn LanePolicy>> {
    let mut all: Vec<Box<dyn LanePolicy>> = vec![
        Box::new(policies::OnDemand),
        Box::new(policies::Greedy),
        Box::new(policies::UniformProgress { sees_spot: false }),
        Box::new(policies::UniformProgress { sees_spot: true }),
    ];
    all.push(Box::new(ours::Patient::default()));
    all
}

fn value(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

fn number(args: &[String], flag: &str, default: f64) -> f64 {
    match value(args, flag) {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| fail(&format!("{flag}: not a number: {v}"))),
    }
}

/// Ends the bench with `message` and exit status 2 (bad arguments or input).
pub fn fail(message: &str) -> ! {
    eprintln!("deadlines: {message}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        smoke::run();
        return;
    }
    let starts = number(&args, "--starts", 300.0) as usize;
    if let Some(dir) = value(&args, "--grid") {
        grid::run(Path::new(&dir), starts);
        return;
    }
    let Some(file) = value(&args, "--trace") else {
        fail("--trace FILE or --grid DIR is needed (the traces: docs/deadlines.md)");
    };
    let trace = Trace::read(Path::new(&file)).unwrap_or_else(|e| fail(&e));
    let job = Job {
        work: number(&args, "--work-hours", 48.0) * 3600.0,
        deadline: number(&args, "--deadline-hours", 52.0) * 3600.0,
        overhead: number(&args, "--overhead-hours", 0.2) * 3600.0,
        price_ratio: number(&args, "--price-ratio", 3.0),
    };
    let started = Instant::now();
    let all = run_all(&trace, &job, &trace.starts(starts), &mut policies());
    for line in json_lines(&trace, &job, &all) {
        println!("{line}");
    }
    if std::env::var_os("DEADLINES_DUMP").is_some() {
        let starts = trace.starts(starts);
        for (i, s) in starts.iter().enumerate() {
            let costs: Vec<String> = all
                .iter()
                .map(|r| format!("{}={:.2}", r.policy, r.outcomes[i].cost))
                .collect();
            eprintln!("start {s}: {}", costs.join(" "));
        }
    }
    eprintln!(
        "deadlines: {} starts in {:.1} s",
        starts,
        started.elapsed().as_secs_f64()
    );
}
