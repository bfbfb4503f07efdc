//! What a chaos run is asked to do: its [`Options`] (workers, jobs, the
//! [`FaultMix`], bounds) and the few command-line flags the long run takes
//! on top of its defaults.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::{CommandJobs, LongJob, SharedReboots};

/// One run's settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seeds every random choice: the jobs, the fault schedule, the VMs.
    pub seed: u64,
    /// Worker processes (VMs) at any time.
    pub workers: usize,
    /// Valid jobs enqueued.
    pub jobs: usize,
    /// Malformed messages enqueued (the first N of [`MALFORMED`](super::MALFORMED)).
    pub malformed: usize,
    /// Numbers per job, drawn uniformly from this range.
    pub job_span: (u64, u64),
    /// Faults of each kind in the schedule (shuffled).
    pub faults: FaultMix,
    /// Pause between two faults, drawn uniformly from this range.
    pub gap: (Duration, Duration),
    /// `SPOT_WORKER_CONCURRENCY` of each worker.
    pub concurrency: usize,
    /// `SPOT_WORKER_VISIBILITY_TIMEOUT`.
    pub visibility_timeout: Duration,
    /// `SPOT_WORKER_MAX_FAILURES`.
    pub max_failures: u32,
    /// Bound of the whole run, from the first worker start to the last result.
    pub timeout: Duration,
    /// The worker binary (`examples/primes`).
    pub binary: PathBuf,
    /// Keep the workers' logs even if every check passes.
    pub keep_logs: bool,
    /// One long job, enqueued first and evicted repeatedly.
    pub long_job: Option<LongJob>,
    /// Reboots shared by two VMs, in the schedule besides `faults`.
    pub shared_reboots: SharedReboots,
    /// The share (0 to 1) of the workers' writes on blobs and queue
    /// messages whose answer the Azurite front drops after Azurite applied
    /// them (see `front.rs`); 0: none.
    pub lost_answers: f64,
    /// Jobs (of `jobs`) that carry a deadline, sent last (see `lanes.rs`).
    pub deadline_jobs: usize,
    /// Regular-priority VMs serving the regular lane (no faults hit them);
    /// with none, the workers run without lanes.
    pub regular_workers: usize,
    /// Jobs of the real `spot-worker run -- PROGRAM` on VMs of their own,
    /// with checkpoints of several chunks (see `command_jobs.rs`).
    pub command_jobs: Option<CommandJobs>,
}

impl Options {
    /// Worker slots: the Spot VMs', then the regular VMs', then the
    /// command VMs'.
    pub fn slots(&self) -> usize {
        self.workers + self.regular_workers + self.command_workers()
    }

    /// The command VMs at any time (none without command jobs).
    pub fn command_workers(&self) -> usize {
        self.command_jobs.as_ref().map_or(0, |c| c.workers)
    }
}

/// How many faults of each kind the schedule holds.
#[derive(Clone, Copy, Debug)]
pub struct FaultMix {
    /// Preempt notices to one VM (drain, exit 0, replaced).
    pub preempt: usize,
    /// SIGKILLs without notice (replaced).
    pub kill: usize,
    /// Short Freezes (must not drain).
    pub freeze: usize,
    /// Azurite stopped and started again on the same data.
    pub azurite_outage: usize,
    /// IMDS answering slowly for a while.
    pub imds_slow: usize,
    /// IMDS failing (503, malformed, dropped) for a while.
    pub imds_failing: usize,
}

impl FaultMix {
    /// Faults of every kind together.
    pub fn total(&self) -> usize {
        self.preempt
            + self.kill
            + self.freeze
            + self.azurite_outage
            + self.imds_slow
            + self.imds_failing
    }
}

/// Parses `--seed N`, `--jobs N`, `--timeout SECS`, `--keep-logs` on top of
/// `options`; ignores what is not ours (`cargo bench` passes `--bench`).
pub fn parse_args(options: &mut Options, args: &[String]) -> Result<()> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().context("a value after the flag");
        match arg.as_str() {
            "--seed" => options.seed = value()?.parse().context("--seed")?,
            "--jobs" => options.jobs = value()?.parse().context("--jobs")?,
            "--timeout" => {
                options.timeout = Duration::from_secs(value()?.parse().context("--timeout")?);
            }
            "--keep-logs" => options.keep_logs = true,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Options {
        Options {
            seed: 1,
            workers: 3,
            jobs: 10,
            malformed: 0,
            job_span: (1, 2),
            faults: FaultMix {
                preempt: 1,
                kill: 2,
                freeze: 3,
                azurite_outage: 4,
                imds_slow: 5,
                imds_failing: 6,
            },
            gap: (Duration::ZERO, Duration::ZERO),
            concurrency: 1,
            visibility_timeout: Duration::from_secs(30),
            max_failures: 5,
            timeout: Duration::from_secs(60),
            binary: PathBuf::new(),
            keep_logs: false,
            long_job: None,
            shared_reboots: SharedReboots::default(),
            lost_answers: 0.0,
            deadline_jobs: 0,
            regular_workers: 0,
            command_jobs: None,
        }
    }

    #[test]
    fn flags_override_the_defaults_and_foreign_flags_are_ignored() {
        // (arguments, seed, jobs, timeout in s, keep logs)
        let table: [(&[&str], u64, usize, u64, bool); 4] = [
            (&["--bench"], 1, 10, 60, false),
            (&["--bench", "--seed", "7"], 7, 10, 60, false),
            (
                &["--jobs", "5", "--timeout", "9", "--keep-logs"],
                1,
                5,
                9,
                true,
            ),
            (&["--seed", "3", "--other", "--seed", "4"], 4, 10, 60, false),
        ];
        for (args, seed, jobs, timeout, keep_logs) in table {
            let mut options = defaults();
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            parse_args(&mut options, &args).unwrap();
            assert_eq!(
                (
                    options.seed,
                    options.jobs,
                    options.timeout,
                    options.keep_logs
                ),
                (seed, jobs, Duration::from_secs(timeout), keep_logs),
                "{args:?}"
            );
        }
    }

    #[test]
    fn a_flag_without_a_valid_value_is_an_error() {
        for args in [&["--seed"][..], &["--seed", "x"], &["--timeout", "-1"]] {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            assert!(parse_args(&mut defaults(), &args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn the_total_counts_every_kind() {
        assert_eq!(defaults().faults.total(), 21);
    }
}
