//! The chaos run: three worker processes of the example job (the real
//! `examples/primes` binary) on one queue in a real Azurite, each on its own
//! emulated Spot VM, while a seeded random schedule of faults hits them:
//! Preempt notices (the worker must drain in time and exit 0; the scale set
//! then replaces the VM), `SIGKILL` without notice (replaced too), short
//! Freezes (which must not drain), a brief Azurite outage (stopped and
//! started again on the same data), and slow or failing IMDS.
//!
//! At the end the harness checks, with its own reads of storage, that every
//! job has exactly one, correct result, that the queue is empty and the
//! poison queue holds exactly the malformed messages, and, from the
//! workers' JSON logs and exit statuses, that every graceful drain met its
//! deadline. It prints the figures and the failed checks.
//!
//! The workers reach Azurite through a front that drops the answer to some
//! of their writes after Azurite applied them (see `front.rs`); some jobs
//! carry a deadline and one regular VM serves the regular lane (see
//! `lanes.rs`); and the verdict counts, besides lost and wrong results, the
//! runs of one job unsettled at the same moment (see `overlaps.rs`).
//!
//! Besides the `primes` VMs, a run may have jobs of the real `spot-worker
//! run -- PROGRAM` on VMs of their own, whose checkpoints are directories
//! of several chunks, SIGKILLed and Preempted just after a save (see
//! `command_jobs.rs`).
//!
//! Two scripted faults go beyond single VMs: one long job, enqueued first,
//! is Preempted on whichever VM holds it more times than `max_failures`
//! (see `long_job.rs`), and one Reboot listing two VMs is posted to both,
//! then cancelled or left to start (see `shared_reboot.rs`).
//!
//! [`run`] reads as that description: plan (the workload and the fault
//! schedule, drawn from the seed), start (Azurite, the queue, the VMs),
//! supervise (inject the faults until storage shows the work done), drain
//! (stop every worker with SIGTERM), analyse (storage, then the logs) and
//! report. The pieces, one module each: `options`, `workload`, `plan`,
//! `storage`, `front`, `lanes`, `command_jobs`, `fleet`, `vm`, `supervise`, `faults`,
//! `logs`, `analyse`, `overlaps`,
//! `goodput` (reported against observed redone work),
//! `endings`, `verdict`, `report`, and the binary in `worker_binary`.
//!
//! Shared by `benches/chaos.rs` (the long run, `cargo bench --bench chaos`)
//! and `tests/it/chaos.rs` (a short, seed-fixed run in CI).

mod analyse;
mod command_jobs;
mod endings;
mod faults;
mod fleet;
mod front;
mod goodput;
mod lanes;
mod logs;
mod long_job;
mod options;
mod overlaps;
mod plan;
mod report;
mod shared_reboot;
mod storage;
mod supervise;
mod verdict;
mod vm;
mod worker_binary;
mod workload;

pub use command_jobs::{COMMAND_STATE_BYTES, CommandJobs};
pub use front::DroppedAnswer;
pub use goodput::GoodputFigures;
pub use long_job::LongJob;
pub use options::{FaultMix, Options, parse_args};
pub use report::Report;
pub use shared_reboot::SharedReboots;
pub use worker_binary::{cli_binary, example_binary, static_binaries, worker_binary};
pub use workload::MALFORMED;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::task::JoinHandle;

use fleet::Shared;
use plan::{FaultKind, PlannedFault, plan_faults};
use storage::{Enqueued, RunStorage};
use supervise::Fleet;
use workload::{Workload, expected_results};

/// The queue the workers consume (a fresh Azurite per run).
const QUEUE: &str = "chaos";
/// Where the example job writes its results (its default).
const RESULTS: &str = "results";
/// How long a Preempted worker may take to exit: the notice itself.
const PREEMPT_EXIT_BOUND: Duration = Duration::from_secs(30);
/// How long a worker may take to exit after SIGTERM (the drain budget, 25 s,
/// plus margin).
const STOP_EXIT_BOUND: Duration = Duration::from_secs(30);

/// Runs the chaos run and returns its report (with its failed checks).
pub async fn run(options: Options) -> Result<Report> {
    // Plan: the workload and the fault schedule, from the seed; the
    // expected results are counted meanwhile.
    let plan = Plan::draw(&options);
    let mut report = Report::planned(&options, &plan.workload);
    announce(&options, &plan);
    let expected = {
        let jobs = plan.workload.jobs.clone();
        tokio::task::spawn_blocking(move || expected_results(&jobs))
    };

    // Start: Azurite with the workload enqueued, the front the workers
    // reach it through, then the VMs.
    let storage = RunStorage::start().await?;
    let enqueued = storage
        .enqueue(&plan.workload, options.long_job.is_some())
        .await?;
    let command_messages = command_jobs::enqueue(&storage.command, &plan.command_jobs).await?;
    // The run's clock starts here, shared by the fleet and the front.
    let started = std::time::Instant::now();
    let front = storage
        .front(options.lost_answers, plan.front_seed, started)
        .await?;
    let log_dir = log_dir(&options)?;
    let shared = Arc::new(Shared::new(
        &options,
        front.connection_string(),
        log_dir.clone(),
        started,
        command_program(&options)?,
    )?);
    let fleet = Fleet::start(Arc::clone(&shared));
    let command_evictions = options.command_jobs.as_ref().map(|command| {
        let first = options.workers + options.regular_workers;
        let slots = fleet.slots[first..].iter().cloned().enumerate();
        let slots = slots.map(|(i, sender)| (first + i, sender)).collect();
        tokio::spawn(command_jobs::evict_holders(
            Arc::clone(&shared),
            slots,
            command.evictions,
        ))
    });

    // Supervise: the faults, until storage shows the work done.
    let evictions = supervise_until_done(&mut report, &plan, &enqueued, &fleet, &storage).await;

    // Drain: the scripted steps end, every worker gets SIGTERM.
    let evicted = stop_evictions(&shared, evictions).await?;
    let command_evicted = match command_evictions {
        Some(task) => Some(
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .map_err(|_| anyhow::anyhow!("the command VMs' evictions did not stop"))??,
        ),
        None => None,
    };
    fleet.stop().await;
    report.answers_dropped = front.dropped();
    report.covered_writes = front.writes();
    drop(front);

    // Analyse: storage, then what the fleet recorded and the workers logged.
    verdict::check_storage(&mut report, &storage, &plan.workload, &expected.await?).await?;
    if let Some(evicted) = command_evicted {
        let vms: Vec<_> = shared.vms.lock().unwrap().clone();
        let vms: Vec<_> = vms.into_iter().filter(|vm| vm.command).collect();
        let (jobs, messages) = (&plan.command_jobs, &command_messages);
        command_jobs::check(&mut report, &storage, jobs, messages, &vms, evicted).await?;
    }
    analyse(&mut report, &options, &plan, &enqueued, &shared, evicted)?;
    verdict::check_totals(&mut report);

    // Report.
    keep_or_remove_logs(&mut report, &options, log_dir);
    Ok(report)
}

/// What the command VMs run, if the run has command jobs.
fn command_program(options: &Options) -> Result<Option<fleet::CommandProgram>> {
    let Some(command) = &options.command_jobs else {
        return Ok(None);
    };
    let (python, script) = command_jobs::program()?;
    Ok(Some(fleet::CommandProgram {
        cli: cli_binary()?,
        python,
        script,
        checkpoint_every: command.checkpoint_every,
    }))
}

/// What the seed decides.
struct Plan {
    workload: Workload,
    schedule: Vec<PlannedFault>,
    /// Seeds the long job's evictions (their holds).
    eviction_seed: u64,
    /// Seeds which writes lose their answer at the Azurite front.
    front_seed: u64,
    /// The jobs of `spot-worker run` (none without command jobs).
    command_jobs: Vec<command_jobs::StateJob>,
}

impl Plan {
    /// Draws, in this order, the workload, the fault schedule, the
    /// evictions' seed, the front's and the command jobs: the order is
    /// what makes a seed replay a run (and the command jobs, drawn last,
    /// leave the rest as it was without them).
    fn draw(options: &Options) -> Plan {
        let mut rng = StdRng::seed_from_u64(options.seed);
        let workload = Workload::draw(&mut rng, options);
        let schedule = plan_faults(&mut rng, options);
        let eviction_seed = rng.random();
        let front_seed = rng.random();
        let command_jobs = options
            .command_jobs
            .as_ref()
            .map_or_else(Vec::new, |command| command_jobs::draw(&mut rng, command));
        Plan {
            workload,
            schedule,
            eviction_seed,
            front_seed,
            command_jobs,
        }
    }
}

fn announce(options: &Options, plan: &Plan) {
    eprintln!(
        "chaos: seed {} — {} jobs, {} malformed, {} workers, {} faults planned",
        options.seed,
        plan.workload.jobs.len(),
        plan.workload.malformed.len(),
        options.workers,
        plan.schedule.len()
    );
}

/// Where the workers' logs go: a fresh directory per run.
fn log_dir(options: &Options) -> Result<PathBuf> {
    let log_dir = std::env::temp_dir().join(format!(
        "spot-worker-chaos-{}-{}",
        options.seed,
        std::process::id()
    ));
    std::fs::create_dir_all(&log_dir)?;
    Ok(log_dir)
}

/// Injects the schedule (and the long job's evictions, besides it, from the
/// start), then waits until storage shows the work done, all within the
/// run's timeout. Returns the evictions' task, still running.
async fn supervise_until_done(
    report: &mut Report,
    plan: &Plan,
    enqueued: &Enqueued,
    fleet: &Fleet,
    storage: &RunStorage,
) -> Option<JoinHandle<long_job::Evicted>> {
    let shared = &fleet.shared;
    let options = &shared.options;
    let deadline = tokio::time::Instant::now() + options.timeout;
    let evictions = match (&options.long_job, &enqueued.long_job_message) {
        (Some(long), Some(message_id)) => Some(tokio::spawn(long_job::evict_repeatedly(
            Arc::clone(shared),
            fleet.slots.clone(),
            long.clone(),
            message_id.clone(),
            StdRng::seed_from_u64(plan.eviction_seed),
        ))),
        _ => None,
    };
    let outcome = async {
        faults::run_schedule(&plan.schedule, shared, &fleet.slots, &storage.azurite).await?;
        storage.wait_until_done(&plan.workload).await;
        command_jobs::wait_until_done(storage, &plan.command_jobs).await;
        Ok::<_, anyhow::Error>(())
    };
    let finished = tokio::time::timeout_at(deadline, outcome).await;
    report.elapsed = shared.started.elapsed();
    match finished {
        Ok(Ok(())) => {}
        Ok(Err(error)) => report.fail(format!("the run failed: {error:#}")),
        Err(_) => report.fail(format!(
            "not finished within {:?} (results, poison queue or queue incomplete)",
            options.timeout
        )),
    }
    evictions
}

/// Ends the scripted steps: the long job's evictions give up once the job
/// is done or the run is over.
async fn stop_evictions(
    shared: &Shared,
    evictions: Option<JoinHandle<long_job::Evicted>>,
) -> Result<Option<long_job::Evicted>> {
    shared.stopping.store(true, Ordering::SeqCst);
    let Some(task) = evictions else {
        return Ok(None);
    };
    let evicted = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .map_err(|_| anyhow::anyhow!("the long job's evictions did not stop"))??;
    Ok(Some(evicted))
}

/// The checks from what the fleet recorded and the workers logged.
fn analyse(
    report: &mut Report,
    options: &Options,
    plan: &Plan,
    enqueued: &Enqueued,
    shared: &Shared,
    evicted: Option<long_job::Evicted>,
) -> Result<()> {
    report.faults = shared.faults.lock().unwrap().clone();
    let vms = shared.vms.lock().unwrap().clone();
    report.vms_started = vms.len();
    // The command VMs' logs are checked with their jobs (`command_jobs`).
    let vms: Vec<_> = vms.into_iter().filter(|vm| !vm.command).collect();
    let jobs = &plan.workload.jobs;
    analyse::analyse_logs(
        report,
        &vms,
        &enqueued.job_of_message,
        jobs,
        &plan.workload.deadline_jobs,
    )?;
    if let (Some(long), Some(message_id), Some(evicted)) =
        (&options.long_job, &enqueued.long_job_message, evicted)
    {
        long_job::check(report, long, options, message_id, evicted, &vms)?;
    }
    report.shared_reboots = shared.reboots.lock().unwrap().clone();
    for failure in shared.step_failures.lock().unwrap().drain(..) {
        report.fail(failure);
    }
    Ok(())
}

/// The logs are kept if asked or if a check failed, and named in the report.
fn keep_or_remove_logs(report: &mut Report, options: &Options, log_dir: PathBuf) {
    if options.keep_logs || !report.passed() {
        report.log_dir = Some(log_dir);
    } else {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
}
