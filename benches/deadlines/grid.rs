//! `--grid DIR`: the goal grid. Every trace under DIR × D ∈ {52,
//! 70} h × d ∈ {0.05, 0.2} h, with W = 48 h and k = 3, then a table and
//! the goal judged for each policy of the workers' and ours, in the two
//! senses "on average" can have:
//!
//! - **per cell**: in every cell, no missed deadline, a mean cost no more
//!   than greedy's, and at least half of greedy's excess over the optimum
//!   removed (a cell where greedy is already optimal passes that part);
//! - **over the grid**: no missed deadline anywhere, and the costs summed
//!   over every start of every cell no more than greedy's, removing at
//!   least half of greedy's summed excess over the optimum. Every cell has
//!   the same number of starts, so this is the mean over all of them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::model::Job;
use crate::report::{Runs, gap_closed, json_lines, run_all};
use crate::trace::Trace;
use crate::{fail, policies};

/// The policies judged against the goal (the baselines are not).
const JUDGED: [&str; 3] = ["uniform-progress-blind", "uniform-progress", "patient"];

/// The traces under `dir`, sorted by path.
fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        let entries =
            std::fs::read_dir(&at).unwrap_or_else(|e| fail(&format!("{}: {e}", at.display())));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// One cell of the grid: its trace and settings, and every policy's runs.
struct Cell {
    trace: String,
    availability: f64,
    deadline: f64,
    overhead: f64,
    runs: Vec<Runs>,
}

impl Cell {
    fn get(&self, policy: &str) -> &Runs {
        self.runs
            .iter()
            .find(|r| r.policy == policy)
            .unwrap_or_else(|| fail(&format!("no runs of {policy}")))
    }

    fn name(&self) -> String {
        format!("{} D={} d={}", self.trace, self.deadline, self.overhead)
    }

    /// Whether `policy` meets the goal in this cell.
    fn meets_goal(&self, policy: &str) -> bool {
        let (runs, greedy, optimum) = (self.get(policy), self.get("greedy"), self.get("optimum"));
        runs.missed() == 0
            && runs.mean_cost() <= greedy.mean_cost() + 1e-9
            && gap_closed(runs, greedy, optimum).is_none_or(|c| c >= 0.5)
    }
}

/// Runs the grid over the traces under `dir`, `starts` starts per cell.
pub fn run(dir: &Path, starts: usize) {
    let started = Instant::now();
    let mut cells = Vec::new();
    for file in trace_files(dir) {
        let trace = Trace::read(&file).unwrap_or_else(|e| fail(&e));
        for deadline in [52.0, 70.0] {
            for overhead in [0.05, 0.2] {
                let job = Job {
                    work: 48.0 * 3600.0,
                    deadline: deadline * 3600.0,
                    overhead: overhead * 3600.0,
                    price_ratio: 3.0,
                };
                let runs = run_all(&trace, &job, &trace.starts(starts), &mut policies());
                for line in json_lines(&trace, &job, &runs) {
                    println!("{line}");
                }
                cells.push(Cell {
                    trace: trace.name.clone(),
                    availability: trace.availability(),
                    deadline,
                    overhead,
                    runs,
                });
            }
        }
    }
    println!();
    table(&cells);
    println!();
    verdicts(&cells, starts);
    println!();
    println!(
        "{} cells, {starts} starts each, in {:.0} s",
        cells.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The mean cost of each policy per cell, with the share of the gap each
/// judged policy closes and the misses of all.
fn table(cells: &[Cell]) {
    let mut header =
        "| trace | Spot | D | d | on-demand | greedy | optimum | greedy − optimum |".to_string();
    let mut rule = "|---|---|---|---|---|---|---|---|".to_string();
    for policy in JUDGED {
        header.push_str(&format!(" {policy} | closed |"));
        rule.push_str("---|---|");
    }
    header.push_str(" missed |");
    rule.push_str("---|");
    println!("{header}");
    println!("{rule}");
    for cell in cells {
        let (greedy, optimum) = (cell.get("greedy"), cell.get("optimum"));
        let mut row = format!(
            "| {} | {:.2} | {} | {} | {:.2} | {:.2} | {:.2} | {:.3} |",
            cell.trace,
            cell.availability,
            cell.deadline,
            cell.overhead,
            cell.get("on-demand").mean_cost(),
            greedy.mean_cost(),
            optimum.mean_cost(),
            // (Float noise where greedy is optimal is not a negative gap.)
            (greedy.mean_cost() - optimum.mean_cost()).max(0.0),
        );
        for policy in JUDGED {
            let runs = cell.get(policy);
            let closed = gap_closed(runs, greedy, optimum)
                .map_or("—".to_string(), |c| format!("{:.0} %", c * 100.0));
            let mark = if cell.meets_goal(policy) { " ✓" } else { "" };
            row.push_str(&format!(" {:.2}{mark} | {closed} |", runs.mean_cost()));
        }
        let missed: usize = cell.runs.iter().map(Runs::missed).sum();
        row.push_str(&format!(" {missed} |"));
        println!("{row}");
    }
}

/// The goal judged per cell and over the grid, for each judged policy.
fn verdicts(cells: &[Cell], starts: usize) {
    let total = |policy: &str| -> f64 { cells.iter().map(|c| c.get(policy).mean_cost()).sum() };
    let (greedy, optimum) = (total("greedy"), total("optimum"));
    let n = cells.len().max(1) as f64;
    println!(
        "over the grid ({} cells × {starts} starts), mean cost per job: on-demand {:.3}, greedy {:.3}, optimum {:.3}",
        cells.len(),
        total("on-demand") / n,
        greedy / n,
        optimum / n
    );
    for policy in JUDGED {
        let failing: Vec<String> = cells
            .iter()
            .filter(|c| !c.meets_goal(policy))
            .map(Cell::name)
            .collect();
        let missed: usize = cells.iter().map(|c| c.get(policy).missed()).sum();
        let dearer = cells
            .iter()
            .filter(|c| c.get(policy).mean_cost() > c.get("greedy").mean_cost() + 1e-9)
            .count();
        let sum = total(policy);
        let closed = (greedy - sum) / (greedy - optimum);
        let aggregate = missed == 0 && sum <= greedy + 1e-9 && closed >= 0.5;
        println!(
            "{policy}: per cell, the goal holds in {} of {} cells (dearer than greedy in {dearer}); over the grid: mean cost {:.3} ({:+.3} against greedy), {:.0} % of the gap closed, {missed} missed: the goal {} over the grid",
            cells.len() - failing.len(),
            cells.len(),
            sum / n,
            (sum - greedy) / n,
            closed * 100.0,
            if aggregate { "holds" } else { "fails" },
        );
        if !failing.is_empty() {
            println!("  fails in: {}", failing.join(", "));
        }
    }
}
