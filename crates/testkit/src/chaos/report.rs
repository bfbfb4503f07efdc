//! The run's [`Report`]: the figures and the failed checks, and how they
//! are printed (the seed first, so a failed run can be replayed).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::workload::Workload;
use super::{Options, long_job, shared_reboot};

/// What happened, for the figures and the checks.
#[derive(Debug, Default)]
pub struct Report {
    /// The seed of the schedule (replays it).
    pub seed: u64,
    /// Worker processes at a time.
    pub workers: usize,
    /// Jobs enqueued (the long one included).
    pub jobs: usize,
    /// Numbers in all the jobs' ranges.
    pub numbers: u64,
    /// Malformed messages enqueued.
    pub malformed: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Every fault injected: seconds since the start, kind, target.
    pub faults: Vec<(f64, String, String)>,
    /// VMs started, replacements included.
    pub vms_started: usize,
    /// Drains after a Preempt: (VM, notice-to-drained ms).
    pub preempt_drains: Vec<(String, u64)>,
    /// Drains after the final SIGTERM.
    pub stop_drains: Vec<(String, u64)>,
    /// Deliveries logged by the workers.
    pub deliveries: u64,
    /// Deliveries released by a drain.
    pub released_on_drain: u64,
    /// Deliveries that failed and were retried.
    pub retried: u64,
    /// Deliveries whose lease was lost.
    pub leases_lost: u64,
    /// Deliveries that waited for another holder of the job.
    pub fenced_out: u64,
    /// Deliveries of a job already completed (deleted, not run).
    pub already_completed: u64,
    /// Deliveries that ended without a checkpoint of where they got (killed,
    /// lease lost): each redid what it counted since its last checkpoint.
    pub cut_deliveries: u64,
    /// An upper bound of the numbers counted twice.
    pub redone_bound: u64,
    /// Redone work the workers reported against what their logs show.
    pub goodput: super::GoodputFigures,
    /// Deliveries that resumed from a checkpoint.
    pub resumed: u64,
    /// Results written again with the same content (harmless).
    pub identical_rewrites: u64,
    /// Jobs with conflicting results.
    pub duplicates: u64,
    /// Jobs without a result.
    pub lost: u64,
    /// Jobs whose result differs from an independent count.
    pub wrong: u64,
    /// Jobs with a deadline finished on a regular VM.
    pub finished_regular: u64,
    /// Moves to the regular lane the workers logged (the lane keeper's and
    /// releasing workers').
    pub moved_to_regular: u64,
    /// Runs of a job (deliveries whose handler counted) the logs show.
    pub runs: u64,
    /// Pairs of runs of one job unsettled at the same moment (beyond the
    /// slack two processes' timers explain).
    pub run_twice_at_once: u64,
    /// The answers the Azurite front dropped after Azurite applied the
    /// write.
    pub answers_dropped: Vec<super::DroppedAnswer>,
    /// The workers' writes on blobs and queue messages through the front.
    pub covered_writes: u64,
    /// Records in the poison queue.
    pub poisoned: usize,
    /// ERROR lines in the workers' logs.
    pub error_lines: u64,
    /// The long job's evictions, if the run had one.
    pub long_job: Option<long_job::Figures>,
    /// The jobs of `spot-worker run`, if the run had them.
    pub command: Option<super::command_jobs::Figures>,
    /// The shared Reboots, in schedule order.
    pub shared_reboots: Vec<shared_reboot::Record>,
    /// Where the logs were kept, if they were.
    pub log_dir: Option<PathBuf>,
    /// The checks that failed (empty: passed).
    pub failures: Vec<String>,
}

impl Report {
    /// A report of the run about to start: what it enqueues.
    pub(super) fn planned(options: &Options, workload: &Workload) -> Report {
        Report {
            seed: options.seed,
            workers: options.workers,
            jobs: workload.jobs.len(),
            numbers: workload.numbers(),
            malformed: workload.malformed.len(),
            ..Report::default()
        }
    }

    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub(super) fn fail(&mut self, failure: impl Into<String>) {
        self.failures.push(failure.into());
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos run, seed {} (replay: --seed {})",
            self.seed, self.seed
        )?;
        writeln!(
            f,
            "  jobs             {} ({} numbers) + {} malformed, {} workers at a time, {} VMs in all, {:.1} s",
            self.jobs,
            self.numbers,
            self.malformed,
            self.workers,
            self.vms_started,
            self.elapsed.as_secs_f64()
        )?;
        let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, kind, _) in &self.faults {
            let name = kind.split(' ').next().unwrap_or(kind);
            *by_kind.entry(name).or_default() += 1;
        }
        let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "  faults           {} ({})",
            self.faults.len(),
            kinds.join(", ")
        )?;
        let worst = |drains: &[(String, u64)]| drains.iter().map(|(_, ms)| *ms).max();
        writeln!(
            f,
            "  drains           {} after Preempt (worst {} ms), {} after the final SIGTERM (worst {} ms); budget 25000 ms",
            self.preempt_drains.len(),
            worst(&self.preempt_drains).map_or("-".to_owned(), |ms| ms.to_string()),
            self.stop_drains.len(),
            worst(&self.stop_drains).map_or("-".to_owned(), |ms| ms.to_string()),
        )?;
        writeln!(
            f,
            "  deliveries       {} ({} released by drains, {} resumed from a checkpoint, {} retried, {} leases lost, {} waited for another holder, {} already completed)",
            self.deliveries,
            self.released_on_drain,
            self.resumed,
            self.retried,
            self.leases_lost,
            self.fenced_out,
            self.already_completed
        )?;
        let share = if self.numbers == 0 {
            0.0
        } else {
            self.redone_bound as f64 * 100.0 / self.numbers as f64
        };
        writeln!(
            f,
            "  redone work      at most {} numbers ({share:.2} % of the work): {} deliveries cut without a checkpoint (SIGKILL, lost lease), each at most what it counted since its last checkpoint (at the worker's checkpoint interval, at least {:?}), bounded by its job's range; drains redo nothing",
            self.redone_bound,
            self.cut_deliveries,
            spot_worker_primes::DEFAULT_CHECKPOINT_EVERY
        )?;
        let goodput = &self.goodput;
        writeln!(
            f,
            "  goodput          {} jobs reported {:.3} s redone; their {} deliveries that ended alive lost {:.3} s after their last save (to their last chunk; {:.3} s to their ending); {} cut without a word or unrecorded through an outage lost {:.3} s unreported (worst {:.3} s; allowed one checkpoint interval, {:?})",
            goodput.jobs,
            goodput.reported_redone_s,
            goodput.ended_alive,
            goodput.observed_alive_s,
            goodput.held_alive_s,
            goodput.cut,
            goodput.observed_cut_s,
            goodput.worst_cut_s,
            spot_worker_primes::DEFAULT_CHECKPOINT_EVERY
        )?;
        writeln!(
            f,
            "  duplicates       {} (conflicting results; identical rewrites, harmless: {})",
            self.duplicates, self.identical_rewrites
        )?;
        writeln!(
            f,
            "  lost             {} (wrong results: {}; poison queue: {} records)",
            self.lost, self.wrong, self.poisoned
        )?;
        writeln!(
            f,
            "  verdict          lost {}, wrong {}, run twice at once {} ({} runs; overlaps up to {:?} not counted)",
            self.lost,
            self.wrong,
            self.run_twice_at_once,
            self.runs,
            super::overlaps::SLACK
        )?;
        writeln!(
            f,
            "  lanes            {} moves to the regular lane, {} jobs with a deadline finished there",
            self.moved_to_regular, self.finished_regular
        )?;
        writeln!(
            f,
            "  lost answers     {} of {} writes on blobs and messages applied with their answer dropped by the Azurite front",
            self.answers_dropped.len(),
            self.covered_writes
        )?;
        // Listed when they may explain a failure.
        if !self.failures.is_empty() {
            for dropped in &self.answers_dropped {
                writeln!(f, "    {dropped}")?;
            }
        }
        if let Some(long) = &self.long_job {
            writeln!(f, "  long job         {long}")?;
        }
        if let Some(command) = &self.command {
            writeln!(f, "  command jobs     {command}")?;
        }
        for reboot in &self.shared_reboots {
            writeln!(f, "  shared reboot    {reboot}")?;
        }
        writeln!(f, "  ERROR log lines  {}", self.error_lines)?;
        writeln!(f, "  fault log:")?;
        for (at, kind, target) in &self.faults {
            writeln!(f, "    {at:7.1} s  {kind:<40} {target}")?;
        }
        if let Some(dir) = &self.log_dir {
            writeln!(f, "  worker logs      {}", dir.display())?;
        }
        if self.failures.is_empty() {
            writeln!(f, "  result           PASS")?;
        } else {
            writeln!(f, "  result           FAIL")?;
            for failure in &self.failures {
                writeln!(f, "    - {failure}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_passes_only_without_failures_and_prints_them() {
        let mut report = Report {
            seed: 7,
            faults: vec![
                (
                    1.0,
                    "freeze (5 s, notice 2 s)".to_owned(),
                    "chaos_0".to_owned(),
                ),
                (
                    2.0,
                    "freeze (3 s, notice 1 s)".to_owned(),
                    "chaos_1".to_owned(),
                ),
                (3.0, "preempt".to_owned(), "chaos_1".to_owned()),
            ],
            preempt_drains: vec![("chaos_1".to_owned(), 120), ("chaos_2".to_owned(), 80)],
            ..Report::default()
        };
        assert!(report.passed());
        let printed = report.to_string();
        assert!(printed.starts_with("chaos run, seed 7 (replay: --seed 7)\n"));
        assert!(
            printed.contains("faults           3 (freeze 2, preempt 1)"),
            "{printed}"
        );
        assert!(
            printed
                .contains("2 after Preempt (worst 120 ms), 0 after the final SIGTERM (worst - ms)")
        );
        assert!(printed.ends_with("  result           PASS\n"), "{printed}");
        assert!(
            printed.contains("  verdict          lost 0, wrong 0, run twice at once 0 (0 runs;"),
            "{printed}"
        );
        report.fail("one check");
        assert!(!report.passed());
        assert!(
            report
                .to_string()
                .ends_with("  result           FAIL\n    - one check\n")
        );
    }
}
