//! The tables of parts 1 and 2: throughput per loop against the raw SDK
//! loop and Azurite's ceiling, and what checkpoints cost, with Azurite's
//! blob and queue in one process and in two.

use std::time::Duration;

use crate::Options;
use crate::rounds::{Drained, Loop, Rounds};
use crate::setup::median;

/// Prints the throughput table and the cost of checkpoints.
pub fn print_throughput(rounds: &Rounds, options: &Options) {
    let loops = [
        Loop::SpotWorker,
        Loop::RawRust,
        Loop::PythonThreads,
        Loop::PythonSequential,
        Loop::SpotWorkerCheckpoints,
    ];
    let of = |which: Loop| runs_of(rounds, which);
    let ratio = |which: Loop, base: Loop| ratio(rounds, which, base);
    println!(
        "## 1. Throughput: draining {} pre-filled messages, trivial handler ({} round(s), medians)\n",
        options.messages, options.rounds
    );
    println!(
        "Azurite ceiling = messages/s if Azurite's node process had a whole core (1 / its CPU seconds per message).\n"
    );
    println!(
        "| loop | msg/s | min | max | ratio to raw Rust | Azurite CPU, cores | Azurite CPU per msg | client CPU per msg | msgs per receive | % of Azurite ceiling |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for which in loops {
        let runs = of(which);
        if runs.is_empty() {
            continue;
        }
        let rates: Vec<f64> = runs.iter().map(Drained::rate).collect();
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        let az_cores = median(
            runs.iter()
                .map(|d| d.azurite_cpu.total().as_secs_f64() / d.cpu_window.as_secs_f64())
                .collect(),
        );
        let az_per_msg = median(
            runs.iter()
                .map(|d| d.azurite_cpu.total().as_secs_f64() / d.messages as f64)
                .collect(),
        );
        let client_per_msg = median(
            runs.iter()
                .map(|d| d.client_cpu.as_secs_f64() / d.messages as f64)
                .collect(),
        );
        let per_receive = median(
            runs.iter()
                .map(|d| d.messages as f64 / d.receives.max(1) as f64)
                .collect(),
        );
        let of_ceiling = median(
            runs.iter()
                .map(|d| d.rate() * d.azurite_cpu.total().as_secs_f64() / d.messages as f64)
                .collect(),
        );
        println!(
            "| {} | {:.0} | {min:.0} | {max:.0} | {:.2} | {az_cores:.2} | {:.0} µs | {:.0} µs | {per_receive:.1} | {:.0} % |",
            which.label(),
            median(rates.clone()),
            ratio(which, Loop::RawRust),
            az_per_msg * 1e6,
            client_per_msg * 1e6,
            of_ceiling * 100.0
        );
    }
    let worker_vs_raw = ratio(Loop::SpotWorker, Loop::RawRust);
    println!(
        "\ngoal spot-worker ≥ 0.9 × raw Rust loop: {} (median per-round ratio {worker_vs_raw:.2})",
        if worker_vs_raw >= 0.9 {
            "met"
        } else {
            "NOT met"
        }
    );
    if !of(Loop::PythonThreads).is_empty() {
        println!(
            "spot-worker / Python (32 delete threads): {:.2}; / Python (sequential): {:.2}",
            ratio(Loop::SpotWorker, Loop::PythonThreads),
            ratio(Loop::SpotWorker, Loop::PythonSequential)
        );
    }
    let checkpoints = ratio(Loop::SpotWorkerCheckpoints, Loop::SpotWorker);
    println!(
        "\n## 2. Cost of checkpoints (same rounds)\n\nspot-worker with one checkpoint write per message / without: {checkpoints:.2} of the throughput \
         (goal ≥ 0.75: {}; each message costs 1 blob request more, the write: a first delivery keyed by its message id reads no checkpoint)",
        if checkpoints >= 0.75 {
            "met"
        } else {
            "NOT met"
        }
    );
    // Where the time goes: what the extra requests cost Azurite and the
    // client, per request.
    let per_message = |which: Loop, cpu: fn(&Drained) -> Duration| {
        median(
            of(which)
                .iter()
                .map(|d| cpu(d).as_secs_f64() / d.messages as f64)
                .collect(),
        )
    };
    let blob_requests = |which: Loop| {
        median(
            of(which)
                .iter()
                .map(|d| {
                    let per_job = d.requests.per(d.messages);
                    per_job.blob_read + per_job.blob_write + per_job.create
                })
                .collect(),
        )
    };
    let extra = blob_requests(Loop::SpotWorkerCheckpoints) - blob_requests(Loop::SpotWorker);
    if extra > 0.0 {
        let azurite = |d: &Drained| d.azurite_cpu.total();
        let client = |d: &Drained| d.client_cpu;
        let cost = |cpu: fn(&Drained) -> Duration| {
            (per_message(Loop::SpotWorkerCheckpoints, cpu) - per_message(Loop::SpotWorker, cpu))
                / extra
                * 1e6
        };
        println!(
            "where the time goes: {extra:.2} blob requests more per message, each costing Azurite {:.0} µs of CPU and the client {:.0} µs \
             (Azurite CPU per message without checkpoints: {:.0} µs)\n",
            cost(azurite),
            cost(client),
            per_message(Loop::SpotWorker, azurite) * 1e6
        );
    }
    print_topologies(rounds);
}

/// The cost of checkpoints again for each Azurite topology: the throughput
/// ratio, and the CPU each Azurite process spent per message.
fn print_topologies(rounds: &Rounds) {
    println!(
        "Azurite topology: Azure's blob and queue services are separate front ends, one Azurite process serves both on one Node thread.\n"
    );
    println!(
        "| Azurite processes | with / without checkpoints (throughput) | Azurite CPU per message without checkpoints | with checkpoints |"
    );
    println!("|---|---|---|---|");
    for (label, without, with) in [
        (
            "one (`azurite`)",
            Loop::SpotWorker,
            Loop::SpotWorkerCheckpoints,
        ),
        (
            "two (`azurite-blob`, `azurite-queue`)",
            Loop::SpotWorkerSeparate,
            Loop::SpotWorkerCheckpointsSeparate,
        ),
    ] {
        println!(
            "| {label} | {:.2} | {} | {} |",
            ratio(rounds, with, without),
            cpu_per_message(rounds, without),
            cpu_per_message(rounds, with)
        );
    }
    println!();
}

/// The runs of `which`, one per round.
fn runs_of(rounds: &Rounds, which: Loop) -> Vec<Drained> {
    rounds
        .iter()
        .filter_map(|r| r.get(&which).cloned())
        .collect()
}

/// Per-round throughput ratio of `which` to `base`, then the median of
/// those.
fn ratio(rounds: &Rounds, which: Loop, base: Loop) -> f64 {
    median(
        rounds
            .iter()
            .filter_map(|r| Some(r.get(&which)?.rate() / r.get(&base)?.rate()))
            .collect(),
    )
}

/// `name N µs` for each Azurite process of the runs of `which`: its CPU
/// per message (median of the runs).
fn cpu_per_message(rounds: &Rounds, which: Loop) -> String {
    let runs = runs_of(rounds, which);
    let Some(first) = runs.first() else {
        return "-".to_owned();
    };
    let processes = first.azurite_cpu.0.iter().enumerate();
    let cells: Vec<String> = processes
        .map(|(i, (name, _))| {
            let per_message = runs
                .iter()
                .filter_map(|d| Some(d.azurite_cpu.0.get(i)?.1.as_secs_f64() / d.messages as f64));
            format!("{name} {:.0} µs", median(per_message.collect()) * 1e6)
        })
        .collect();
    cells.join(", ")
}
