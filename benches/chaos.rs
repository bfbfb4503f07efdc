//! The long chaos run: `cargo bench --bench chaos [-- --seed N --jobs N
//! --timeout SECS --keep-logs]`.
//!
//! Three worker processes of the example job (release build, built first if
//! needed) on one Azurite queue, each on its own emulated Spot VM; a few
//! hundred jobs and a few malformed messages; a seeded random schedule of
//! about thirty faults (Preempt notices, SIGKILLs, short Freezes, Azurite
//! outages, slow and failing IMDS), plus one long job Preempted on whichever
//! VM holds it seven times (max_failures is 5) and four Reboots shared by
//! two VMs (two cancelled, two left to start); the workers reach Azurite
//! through a front that drops the answer to 2 % of their writes after Azurite
//! applied them. It then checks every result, the queues
//! and the drains, prints the figures and exits non-zero if a check failed.
//! The seed is printed; `--seed` replays the same schedule.
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it does nothing:
//! `tests/it/chaos.rs` runs the same harness, short and seed-fixed.

use std::process::ExitCode;
use std::time::Duration;

use spot_worker_testkit::bench::{self, BenchArgs};
use spot_worker_testkit::chaos::{
    self as harness, COMMAND_STATE_BYTES, CommandJobs, FaultMix, LongJob, Options, SharedReboots,
};

/// The share of the workers' writes whose answer the Azurite front drops
/// after Azurite applied them: twice the CI run's.
const LOST_ANSWERS: f64 = 0.02;

/// Jobs with a deadline (of the 300), served by one regular VM besides.
const DEADLINE_JOBS: usize = 10;

fn main() -> ExitCode {
    let args = BenchArgs::from_env();
    if !args.benchmarking() {
        println!("chaos: the long run is `cargo bench --bench chaos`; CI runs tests/it/chaos.rs");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &BenchArgs) -> anyhow::Result<bool> {
    let mut options = Options {
        seed: rand::random(),
        workers: 3,
        jobs: 300,
        malformed: harness::MALFORMED.len(),
        job_span: (50_000_000, 250_000_000),
        faults: FaultMix {
            preempt: 8,
            kill: 6,
            freeze: 4,
            azurite_outage: 2,
            imds_slow: 5,
            imds_failing: 5,
        },
        gap: (Duration::from_secs(2), Duration::from_secs(8)),
        concurrency: 2,
        // The contract's defaults: 30 s leases, five deliveries.
        visibility_timeout: Duration::from_secs(30),
        max_failures: 5,
        // Evicted twice more than max_failures: evictions must not count.
        // Long enough that it outlasts seven holds even when it runs alone
        // on a core at the end (about 100 M numbers/s in a release build).
        long_job: Some(LongJob {
            span: 8_000_000_000,
            evictions: 7,
            hold: (Duration::from_secs(1), Duration::from_secs(4)),
        }),
        shared_reboots: SharedReboots {
            cancelled: 2,
            started: 2,
        },
        timeout: Duration::from_secs(20 * 60),
        binary: Default::default(),
        keep_logs: false,
        lost_answers: LOST_ANSWERS,
        // Sent last, they wait longer than their deadline allows in the
        // Spot lane: moved to the regular lane, they finish there.
        deadline_jobs: DEADLINE_JOBS,
        regular_workers: 1,
        // Jobs of the real `spot-worker run` whose checkpoints are several
        // chunks, evicted just after their saves (see tests/it/chaos.rs).
        command_jobs: Some(CommandJobs {
            workers: 2,
            jobs: 24,
            steps: (8, 24),
            rounds: 20_000,
            step_time: Duration::from_millis(2500),
            bytes: COMMAND_STATE_BYTES,
            evictions: 12,
            checkpoint_every: Duration::from_secs(2),
        }),
    };
    harness::parse_args(&mut options, args.all())?;
    options.binary = harness::worker_binary()?;
    let report = bench::runtime()?.block_on(harness::run(options))?;
    println!("{report}");
    Ok(report.passed())
}
