//! The fleet's bill under each scale-in policy (issue 39, item 4):
//! `cargo bench --bench fleet_bill -- --jobs FILE --vms N --scale-in
//! POLICY… [--min M --startup S --evaluation S --cooldown S --window-minutes M
//! --step N --checkpoint S --visibility S --arm-latency S --idle-grace S]`
//! (durations in seconds).
//!
//! FILE holds one job length in seconds per line (blank lines and lines
//! starting with `#` are skipped); without `--jobs`, the checked-in
//! heavy-tailed batch `benches/fleet_bill/heavy_tailed.txt` (1,000 jobs,
//! log-normal lengths, median 30 min, σ = 1, seed 39), which
//! `--write-heavy-tailed FILE` writes again. POLICY is one or more of
//! `today`, `no-protection`, `protect-per-busy-period`, `ours` (space- or
//! comma-separated; all four without `--scale-in`). The batch arrives at
//! once on N VMs; see `sim.rs` for what is modelled. Prints one JSON line
//! per policy (`{"policy", "paid_vm_hours", "busy_vm_hours",
//! "idle_vm_hours", "busy_removed", "lost_work_hours",
//! "makespan_hours"}`), then a table, then the goal checked for
//! `ours` against `today` when both ran.
//!
//! "ours" runs the worker's own rule,
//! [`spot_worker::decisions::scale_in::wants_protection`], the function
//! the worker calls.
//!
//! Under `cargo test --all-targets` (no `--bench`) it runs a smoke version
//! (the first 200 jobs of the batch on 20 VMs) and checks what must hold
//! whatever the numbers: ours removes no busy VM, every job's work is paid
//! for as busy time, idle is what is left of paid.

mod sim;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sim::{Bill, Model, Policy, simulate};
use spot_worker_testkit::bench::BenchArgs;

/// The checked-in batch, relative to the workspace.
const HEAVY_TAILED: &str = "benches/fleet_bill/heavy_tailed.txt";
/// The heavy-tailed batch: its jobs, median length (s), σ and seed.
const HEAVY_TAILED_JOBS: usize = 1000;
const HEAVY_TAILED_MEDIAN_SECS: f64 = 1800.0;
const HEAVY_TAILED_SIGMA: f64 = 1.0;
const HEAVY_TAILED_SEED: u64 = 39;

/// The goal for ours: idle at most this share of paid VM-hours,
/// and a makespan within this share of today's rule's.
const GOAL_IDLE_SHARE: f64 = 0.10;
const GOAL_MAKESPAN_SHARE: f64 = 0.05;

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut jobs_file: PathBuf = workspace.join(HEAVY_TAILED);
    let mut model = default_model();
    let mut policies: Vec<Policy> = Vec::new();
    let mut in_policies = false;
    let mut write_to: Option<PathBuf> = None;
    args.each_flag(|flag, value| {
        if !flag.starts_with("--") && in_policies {
            policies.extend(parse_policies(flag)?);
            return Ok(());
        }
        in_policies = false;
        match flag {
            "--jobs" => jobs_file = PathBuf::from(value.text()?),
            "--vms" => model.vms = value.parse()?,
            "--min" => model.minimum = value.parse()?,
            "--startup" => model.startup = value.seconds()?,
            "--evaluation" => model.evaluation = value.seconds()?,
            "--cooldown" => model.cooldown = value.seconds()?,
            "--window-minutes" => model.window_minutes = value.parse()?,
            "--step" => model.scale_in_step = value.parse()?,
            "--checkpoint" => model.checkpoint = value.seconds()?,
            "--visibility" => model.visibility = value.seconds()?,
            "--arm-latency" => model.arm_latency = value.seconds()?,
            "--idle-grace" => model.idle_grace = value.seconds()?,
            "--write-heavy-tailed" => write_to = Some(PathBuf::from(value.text()?)),
            "--scale-in" => {
                policies.extend(parse_policies(&value.text()?)?);
                in_policies = true;
            }
            _ => {}
        }
        Ok(())
    })?;
    if let Some(path) = write_to {
        let text: String = heavy_tailed()
            .iter()
            .map(|seconds| format!("{seconds}\n"))
            .collect();
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {HEAVY_TAILED_JOBS} jobs to {}", path.display());
        return Ok(());
    }
    if policies.is_empty() {
        policies = Policy::ALL.to_vec();
    }
    let jobs = read_jobs(&jobs_file)?;
    if !args.benchmarking() {
        return smoke(&jobs);
    }
    ensure!(!jobs.is_empty(), "{}: no jobs", jobs_file.display());
    let mut bills = Vec::new();
    for &policy in &policies {
        let bill = simulate(&jobs, &model, policy)?;
        println!("{}", json_line(policy, &bill));
        bills.push((policy, bill));
    }
    let work_hours = jobs.iter().sum::<u64>() as f64 / 3600.0;
    println!();
    println!(
        "{} jobs, {work_hours:.1} h of work, on {} VMs (minimum {}); {:?}",
        jobs.len(),
        model.vms,
        model.minimum,
        model
    );
    println!();
    println!(
        "| policy | paid VM-h | busy VM-h | idle VM-h | idle share | busy removed | lost work h | makespan h | ARM calls |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (policy, bill) in &bills {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} % | {} | {:.2} | {:.2} | {} |",
            policy.name(),
            bill.paid_vm_hours,
            bill.busy_vm_hours,
            bill.idle_vm_hours,
            100.0 * idle_share(bill),
            bill.busy_removed,
            bill.lost_work_hours,
            bill.makespan_hours,
            bill.arm_calls
        );
    }
    let find = |wanted: Policy| bills.iter().find(|(p, _)| *p == wanted).map(|(_, b)| *b);
    if let (Some(today), Some(ours)) = (find(Policy::Today), find(Policy::Ours)) {
        let makespan_ratio = ours.makespan_hours / today.makespan_hours;
        println!();
        println!(
            "goal: idle {:.1} % of paid (at most {:.0} %): {}; busy removed {} (0): {}; makespan {:.3} of today's (within {:.0} %): {}",
            100.0 * idle_share(&ours),
            100.0 * GOAL_IDLE_SHARE,
            met(idle_share(&ours) <= GOAL_IDLE_SHARE),
            ours.busy_removed,
            met(ours.busy_removed == 0),
            makespan_ratio,
            100.0 * GOAL_MAKESPAN_SHARE,
            met((makespan_ratio - 1.0).abs() <= GOAL_MAKESPAN_SHARE),
        );
    }
    Ok(())
}

/// The model unless flags say otherwise: 100 VMs, a minimum of 1, 3 min
/// of start-up, autoscale every minute with the prompt rule as
/// `bicep/main.bicep` ships it (5 min window, 5 min cool-down, 5 VMs a
/// step), a save every 20 min, the worker's 30 s lease, ARM calls landing after 15 s, 2 min of
/// idle grace.
fn default_model() -> Model {
    Model {
        vms: 100,
        minimum: 1,
        startup: Duration::from_secs(180),
        evaluation: Duration::from_secs(60),
        cooldown: Duration::from_secs(PROMPT_COOLDOWN_MINUTES * 60),
        window_minutes: PROMPT_WINDOW_MINUTES,
        scale_in_step: PROMPT_STEP,
        checkpoint: Duration::from_secs(20 * 60),
        visibility: Duration::from_secs(30),
        arm_latency: Duration::from_secs(15),
        idle_grace: Duration::from_secs(120),
    }
}

/// The prompt rule as `bicep/main.bicep` ships it by default
/// (`scaleInWindowMinutes`, `scaleInCooldownMinutes`, `scaleInStep`); the
/// smoke run checks these against the template.
const PROMPT_WINDOW_MINUTES: usize = 5;
const PROMPT_COOLDOWN_MINUTES: u64 = 5;
const PROMPT_STEP: usize = 5;

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn idle_share(bill: &Bill) -> f64 {
    if bill.paid_vm_hours > 0.0 {
        bill.idle_vm_hours / bill.paid_vm_hours
    } else {
        0.0
    }
}

fn parse_policies(text: &str) -> Result<Vec<Policy>> {
    text.split(',')
        .filter(|name| !name.is_empty())
        .map(Policy::parse)
        .collect()
}

/// The JSON line, its keys in the order.
fn json_line(policy: Policy, bill: &Bill) -> String {
    format!(
        "{{\"policy\":\"{}\",\"paid_vm_hours\":{},\"busy_vm_hours\":{},\"idle_vm_hours\":{},\"busy_removed\":{},\"lost_work_hours\":{},\"makespan_hours\":{}}}",
        policy.name(),
        round(bill.paid_vm_hours),
        round(bill.busy_vm_hours),
        round(bill.idle_vm_hours),
        bill.busy_removed,
        round(bill.lost_work_hours),
        round(bill.makespan_hours),
    )
}

/// Three decimals: a VM-hour to 3.6 s.
fn round(hours: f64) -> f64 {
    (hours * 1000.0).round() / 1000.0
}

/// Job lengths in whole seconds (a fraction rounds up), one a line.
fn read_jobs(path: &Path) -> Result<Vec<u64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut jobs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let seconds: f64 = line.parse().with_context(|| {
            format!(
                "{} line {}: {line:?} is not a number of seconds",
                path.display(),
                number + 1
            )
        })?;
        ensure!(
            seconds.is_finite() && seconds > 0.0 && seconds < 1e9,
            "{} line {}: a job of {line} s (more than 0, under 10⁹)",
            path.display(),
            number + 1
        );
        jobs.push(seconds.ceil() as u64);
    }
    Ok(jobs)
}

/// The default of `param NAME int = N` in a template, if it has one.
fn param_default(template: &str, name: &str) -> Option<u64> {
    let prefix = format!("param {name} int = ");
    template
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse().ok())
}

/// The heavy-tailed batch: log-normal lengths (Box–Muller from a seeded
/// generator), whole seconds, at least one.
fn heavy_tailed() -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(HEAVY_TAILED_SEED);
    (0..HEAVY_TAILED_JOBS)
        .map(|_| {
            let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln is finite
            let u2: f64 = rng.random::<f64>();
            let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let seconds = HEAVY_TAILED_MEDIAN_SECS * (HEAVY_TAILED_SIGMA * normal).exp();
            (seconds.round() as u64).max(1)
        })
        .collect()
}

/// What must hold whatever the numbers, on a small batch; and that the
/// prompt rule modelled is the one `bicep/main.bicep` ships.
fn smoke(jobs: &[u64]) -> Result<()> {
    let main_bicep = Path::new(env!("CARGO_MANIFEST_DIR")).join("bicep/main.bicep");
    let template = std::fs::read_to_string(&main_bicep)
        .with_context(|| format!("reading {}", main_bicep.display()))?;
    for (param, modelled) in [
        ("scaleInWindowMinutes", PROMPT_WINDOW_MINUTES as u64),
        ("scaleInCooldownMinutes", PROMPT_COOLDOWN_MINUTES),
        ("scaleInStep", PROMPT_STEP as u64),
    ] {
        let shipped = param_default(&template, param)
            .with_context(|| format!("{}: no `param {param} int = N`", main_bicep.display()))?;
        ensure!(
            shipped == modelled,
            "bicep/main.bicep ships {param} = {shipped}, the bench models {modelled}: \
             change the bench's constant (and rerun its figures) with the template"
        );
    }
    let jobs = &jobs[..jobs.len().min(200)];
    let model = Model {
        vms: 20,
        ..default_model()
    };
    let work_hours = jobs.iter().sum::<u64>() as f64 / 3600.0;
    for policy in Policy::ALL {
        let bill = simulate(jobs, &model, policy)?;
        let line = json_line(policy, &bill);
        ensure!(
            bill.busy_vm_hours + 1e-9 >= work_hours + bill.lost_work_hours - 1e-6,
            "{line}: less busy time than the work ({work_hours} h)"
        );
        ensure!(
            (bill.paid_vm_hours - bill.busy_vm_hours - bill.idle_vm_hours).abs() < 1e-9,
            "{line}: paid is not busy + idle"
        );
        if matches!(policy, Policy::Ours | Policy::Today) {
            ensure!(bill.busy_removed == 0, "{line}: a busy VM removed");
        }
    }
    Ok(())
}
