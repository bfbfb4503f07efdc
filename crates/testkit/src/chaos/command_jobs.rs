//! Jobs of the real `spot-worker run -- PROGRAM` in the chaos run: VMs of
//! their own run the `spot-worker` command on a queue of their own, and
//! the program (`state_job.py`, beside this file) keeps its state in a
//! checkpoint directory of several chunks, writing each version whole
//! (a temporary directory in its work directory, renamed into place), and
//! leaves as its result a
//! digest of every step it took, which [`StateJob::expected`] computes
//! independently. The scale set replaces these VMs like the others.
//!
//! The faults: [`evict_holders`] SIGKILLs or Preempts (alternately) a
//! command VM each time it has just saved a job's checkpoint, so the next
//! delivery of that job restores it. The verdict ([`check`]): every job has
//! its result, equal to the expected digest (a restore that was wrong or
//! mixed makes the program fail, and a step lost or done twice changes the
//! digest); the queue and its poison queue are empty; no job ran twice at
//! once; and every restore walked the chunked path: the runner's log line
//! "resuming from the saved checkpoint" names more than one chunk.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, Result};
use rand::Rng as _;
use rand::rngs::StdRng;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use spot_worker::azure::AzureQueue;
use spot_worker::storage::{MessageQueue as _, ResultStore as _};
use tokio::sync::mpsc;

use super::fleet::{Order, Shared, VmRecord};
use super::logs::{ALREADY_COMPLETED, Line, read_log};
use super::overlaps::{SLACK, overlapping, runs_in_log};
use super::plan::FaultKind;
use super::report::Report;
use super::storage::RunStorage;

/// The bytes of each of a command job's two data files the runs use:
/// one or two chunks each (a version is never fewer than two chunks, as
/// each file is over what a manifest keeps whole, 48 KiB).
pub const COMMAND_STATE_BYTES: usize = 512 * 1024;

/// The command VMs' queue.
pub(super) const COMMAND_QUEUE: &str = "chaos-command";
/// How often the command VMs' logs are read while waiting for a save.
const POLL: Duration = Duration::from_millis(250);
/// The runner's line for a restore of a manifest's files.
const RESUMED: &str = "resuming from the saved checkpoint";
/// The runner's line for a restore of a checkpoint saved whole in the
/// document (an older runner's): never the chunked path.
const RESUMED_WHOLE: &str = "resuming from the saved checkpoint file";
/// The runner's line for each save it completed.
const SAVED: &str = "checkpoint saved";

/// The command jobs of a run.
#[derive(Clone, Debug)]
pub struct CommandJobs {
    /// VMs running `spot-worker run` (one job at a time each).
    pub workers: usize,
    /// Jobs enqueued on their queue.
    pub jobs: usize,
    /// Steps of each job, drawn uniformly from this range.
    pub steps: (u32, u32),
    /// SHA-256 rounds in a step (the work between two versions).
    pub rounds: u32,
    /// The least a step takes (the program's pace): a job lasts long
    /// enough for several saves however loaded the machine is.
    pub step_time: Duration,
    /// Bytes of each of the two data files of a version (over 48 KiB:
    /// each is one chunk or more).
    pub bytes: usize,
    /// SIGKILLs and Preempts (alternately) of a command VM that has just
    /// saved a job's checkpoint.
    pub evictions: usize,
    /// `SPOT_WORKER_CHECKPOINT_EVERY` of the command VMs.
    pub checkpoint_every: Duration,
}

/// One job of the program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StateJob {
    pub(super) job_id: String,
    steps: u32,
    rounds: u32,
    bytes: usize,
    step_ms: u128,
}

impl StateJob {
    /// The message body the program reads.
    pub(super) fn message(&self) -> String {
        serde_json::json!({
            "job_id": self.job_id, "steps": self.steps, "rounds": self.rounds, "bytes": self.bytes,
            "step_ms": self.step_ms
        })
        .to_string()
    }

    /// The result's blob (`--result-name '{job_key}.digest'`).
    pub(super) fn result_name(&self) -> String {
        format!("{}.digest", self.job_id)
    }

    /// The result the program must leave, computed here: the digest after
    /// every step, in hex, with a line end.
    pub(super) fn expected(&self) -> String {
        let mut digest: [u8; 32] =
            Sha256::digest(format!("state-job:{}", self.job_id).as_bytes()).into();
        for step in 0..u64::from(self.steps) {
            for _ in 0..self.rounds {
                let mut hasher = Sha256::new();
                hasher.update(digest);
                hasher.update(step.to_be_bytes());
                digest = hasher.finalize().into();
            }
        }
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}\n")
    }
}

/// Draws the jobs from `rng`.
pub(super) fn draw(rng: &mut StdRng, options: &CommandJobs) -> Vec<StateJob> {
    (0..options.jobs)
        .map(|i| StateJob {
            job_id: format!("state-{i:04}"),
            steps: rng.random_range(options.steps.0..=options.steps.1),
            rounds: options.rounds,
            bytes: options.bytes,
            step_ms: options.step_time.as_millis(),
        })
        .collect()
}

/// The program the command VMs run, and the Python that runs it (resolved
/// here: the workers' environment is cleared, and a shim on `PATH` may
/// need more of it than they pass).
pub(super) fn program() -> Result<(PathBuf, PathBuf)> {
    let script = crate::workspace_root().join("crates/testkit/src/chaos/state_job.py");
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("running python3 (the command jobs' program is Python)")?;
    let python = String::from_utf8(output.stdout).context("python3's path")?;
    let python = PathBuf::from(python.trim());
    anyhow::ensure!(
        output.status.success() && python.is_file(),
        "python3 did not name its executable"
    );
    Ok((python, script))
}

/// Sends every job to the command queue; returns each message's job.
pub(super) async fn enqueue(
    queue: &AzureQueue,
    jobs: &[StateJob],
) -> Result<HashMap<String, usize>> {
    let mut job_of_message = HashMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let id = queue.send(&job.message(), Duration::ZERO).await?;
        job_of_message.insert(id.as_str().to_owned(), i);
    }
    Ok(job_of_message)
}

/// Whether every job has its result and the command queue is empty.
pub(super) async fn done(storage: &RunStorage, jobs: &[StateJob]) -> Result<bool> {
    for job in jobs {
        if storage.results.get(&job.result_name()).await?.is_none() {
            return Ok(false);
        }
    }
    Ok(storage.command.approximate_message_count().await? == 0)
}

/// Resolves once every job has its result and the queue is empty (polled:
/// storage has no notifications); at once without jobs.
pub(super) async fn wait_until_done(storage: &RunStorage, jobs: &[StateJob]) {
    if jobs.is_empty() {
        return;
    }
    while !matches!(done(storage, jobs).await, Ok(true)) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What [`evict_holders`] did.
#[derive(Clone, Debug, Default)]
pub(super) struct Evicted {
    /// SIGKILLs sent to a command VM that had just saved a checkpoint.
    pub(super) kills: usize,
    /// Preempts sent likewise.
    pub(super) preempts: usize,
}

/// Evicts `planned` times, alternately by SIGKILL and Preempt, the command
/// VM that has logged a checkpoint save since the last eviction; stops
/// early once the run is over.
pub(super) async fn evict_holders(
    shared: std::sync::Arc<Shared>,
    slots: Vec<(usize, mpsc::Sender<Order>)>,
    planned: usize,
) -> Evicted {
    let mut evicted = Evicted::default();
    // Saves already seen, per VM: an eviction waits for a newer one.
    let mut seen: HashMap<String, usize> = HashMap::new();
    while evicted.kills + evicted.preempts < planned {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let mut target = None;
        for (slot, sender) in &slots {
            let Some(vm) = shared.current(*slot) else {
                continue;
            };
            let saves = read_log(&vm.log)
                .iter()
                .filter(|line| line.message == SAVED)
                .count();
            let before = seen.insert(vm.name.clone(), saves).unwrap_or(0);
            if saves > before && target.is_none() {
                target = Some(sender.clone());
            }
        }
        let Some(sender) = target else {
            tokio::time::sleep(POLL).await;
            continue;
        };
        let kind = if (evicted.kills + evicted.preempts) % 2 == 0 {
            evicted.kills += 1;
            FaultKind::Kill
        } else {
            evicted.preempts += 1;
            FaultKind::Preempt
        };
        let _exclusive = shared.exclusive_step.lock().await;
        if sender.send(Order::Fault(kind)).await.is_err() {
            break;
        }
    }
    evicted
}

/// The command jobs' figures, for the report.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub jobs: usize,
    /// Jobs without a result.
    pub lost: u64,
    /// Jobs whose result is not the expected digest.
    pub wrong: u64,
    /// Runs of a job (deliveries that ran the program) the logs show.
    pub runs: u64,
    /// Pairs of runs of one job unsettled at the same moment.
    pub run_twice_at_once: u64,
    /// Restores of a manifest's files.
    pub restores: u64,
    /// The fewest chunks a restore downloaded.
    pub fewest_chunks: Option<u64>,
    pub kills: usize,
    pub preempts: usize,
    /// Records in the command queue's poison queue.
    pub poisoned: usize,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} jobs of `spot-worker run`: {} lost, {} wrong, {} poisoned, {} runs, {} run twice at once; {} SIGKILLs and {} Preempts after a save, {} restores of at least {} chunks",
            self.jobs,
            self.lost,
            self.wrong,
            self.poisoned,
            self.runs,
            self.run_twice_at_once,
            self.kills,
            self.preempts,
            self.restores,
            self.fewest_chunks
                .map_or("-".to_owned(), |chunks| chunks.to_string())
        )
    }
}

/// The checks of the command jobs, from storage (read by the harness) and
/// the command VMs' logs; failures go into `report`.
pub(super) async fn check(
    report: &mut Report,
    storage: &RunStorage,
    jobs: &[StateJob],
    job_of_message: &HashMap<String, usize>,
    vms: &[VmRecord],
    evicted: Evicted,
) -> Result<()> {
    let mut figures = Figures {
        jobs: jobs.len(),
        kills: evicted.kills,
        preempts: evicted.preempts,
        ..Figures::default()
    };
    for job in jobs {
        match storage.results.get(&job.result_name()).await? {
            None => {
                figures.lost += 1;
                report.fail(format!("{}: no result", job.job_id));
            }
            Some(bytes) if bytes != job.expected().as_bytes() => {
                figures.wrong += 1;
                report.fail(format!(
                    "{}: result {:?} but {:?} expected",
                    job.job_id,
                    String::from_utf8_lossy(&bytes),
                    job.expected()
                ));
            }
            Some(_) => {}
        }
    }
    let queued = storage.command.approximate_message_count().await?;
    if queued != 0 {
        report.fail(format!("{queued} messages left in {COMMAND_QUEUE}"));
    }
    let poison = storage.command_poison.peek(32).await?;
    figures.poisoned = poison.len();
    for record in poison {
        report.fail(format!("poisoned in {COMMAND_QUEUE}: {}", record.body));
    }
    let mut runs = Vec::new();
    for vm in vms {
        let lines = read_log(&vm.log);
        check_restores(report, &mut figures, &vm.name, &lines);
        let ended_at = vm.ended_at.and_then(|at| {
            at.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|since| since.as_secs_f64())
        });
        let killed = matches!(
            vm.ending,
            Some(super::fleet::Ending::Killed | super::fleet::Ending::Unexpected(_))
        );
        runs.extend(runs_in_log(
            &vm.name,
            &lines,
            job_of_message,
            ended_at.filter(|_| killed),
            ran_the_program,
        ));
    }
    figures.runs = runs.len() as u64;
    for (earlier, later, overlap) in overlapping(&runs, SLACK) {
        figures.run_twice_at_once += 1;
        report.fail(format!(
            "{}: run twice at once for {overlap:.1} s: delivery {} on {} and delivery {} on {}",
            jobs[earlier.job].job_id, earlier.delivery, earlier.vm, later.delivery, later.vm
        ));
    }
    if figures.kills + figures.preempts < 1 {
        report.fail("no command VM was evicted after a save".to_owned());
    } else if figures.restores == 0 {
        report.fail("no command job resumed from a checkpoint after its evictions".to_owned());
    }
    report.lost += figures.lost;
    report.wrong += figures.wrong;
    report.run_twice_at_once += figures.run_twice_at_once;
    report.command = Some(figures);
    Ok(())
}

/// Counts the VM's restores; fails the report for one that was not
/// chunked (one chunk or none, or a whole file from the document).
fn check_restores(report: &mut Report, figures: &mut Figures, vm: &str, lines: &[Line]) {
    for line in lines {
        if line.message == RESUMED_WHOLE {
            report.fail(format!("{vm}: a restore of a whole file, not of chunks"));
        }
        if line.message != RESUMED {
            continue;
        }
        figures.restores += 1;
        let chunks = line.fields.get("chunks").and_then(Value::as_u64);
        figures.fewest_chunks = figures.fewest_chunks.min(chunks).or(chunks);
        if chunks.is_none_or(|chunks| chunks <= 1) {
            report.fail(format!("{vm}: a restore of {chunks:?} chunks, not several"));
        }
    }
}

/// Whether the line shows a delivery that ran the program (the runner's
/// lines name the job; a delivery of a completed job does not run it).
fn ran_the_program(line: &Line) -> bool {
    line.fields.contains_key("job_key")
        && line.message != "already completed; not run again"
        && line.message != ALREADY_COMPLETED
}

#[cfg(test)]
mod tests {
    use super::super::logs::parse_line;
    use super::*;

    #[test]
    fn the_expected_digest_chains_every_step() {
        let job = |steps| StateJob {
            job_id: "state-0001".to_owned(),
            steps,
            rounds: 2,
            bytes: 1,
            step_ms: 0,
        };
        // What state_job.py printed for this job (one step of two
        // rounds): the two computations must agree.
        assert_eq!(
            job(1).expected(),
            "ff9bc290815d8eedbb602a67bb2b774417da0dbb2fb65c1cfc0f0000d9327cf4\n"
        );
        // No step: the digest of the job's id alone.
        let none = job(0).expected();
        assert_eq!(
            none.trim(),
            format!("{:x}", Sha256::digest(b"state-job:state-0001"))
        );
    }

    #[test]
    fn a_restore_of_one_chunk_or_of_a_whole_file_fails_the_run() {
        let line = |message: &str, chunks: Option<u64>| {
            let chunks = chunks.map_or(String::new(), |c| format!(r#","chunks":{c}"#));
            parse_line(&format!(
                r#"{{"timestamp":"t","level":"INFO","fields":{{"message":"{message}"{chunks}}}}}"#
            ))
            .expect("a JSON line")
        };
        // (lines, restores, fewest chunks, failures)
        let table: [(Vec<Line>, u64, Option<u64>, usize); 4] = [
            (
                vec![line(RESUMED, Some(3)), line(RESUMED, Some(2))],
                2,
                Some(2),
                0,
            ),
            (vec![line(RESUMED, Some(1))], 1, Some(1), 1),
            (vec![line(RESUMED, None)], 1, None, 1),
            (vec![line(RESUMED_WHOLE, None)], 0, None, 1),
        ];
        for (lines, restores, fewest, failures) in table {
            let mut report = Report::default();
            let mut figures = Figures::default();
            check_restores(&mut report, &mut figures, "vm", &lines);
            assert_eq!(
                (
                    figures.restores,
                    figures.fewest_chunks,
                    report.failures.len()
                ),
                (restores, fewest, failures),
                "{:?}",
                report.failures
            );
        }
    }
}
