//! The checks from the workers' logs: every drain met its deadline, and
//! each VM's drains are what its ending requires (see `endings`); plus the
//! delivery figures (retries, releases, lost leases, work redone), and the
//! redone work the workers reported against what their logs show.

use std::collections::{HashMap, HashSet};

use anyhow::{Context as _, Result};
use serde_json::Value;
use spot_worker_primes::PrimesJob;

use super::endings::{Drains, LastDrain, freeze_drains, judge_ending};
use super::fleet::Ending;
use super::fleet::VmRecord;
use super::logs::{ALREADY_COMPLETED, Line, RELEASED, WAITED_FOR_PEER, parse_line};
use super::overlaps::{Run, SLACK, overlapping, primes_counted, runs_in_log};
use super::report::Report;

/// Per job, across every VM.
#[derive(Default)]
struct Deliveries {
    /// The highest `DequeueCount` seen.
    seen: HashMap<usize, u64>,
    /// Deliveries that saved where they got (released by a drain, failed
    /// and retried, or found the job completed already).
    saved: HashMap<usize, u64>,
    /// (VM, delivery) whose lease was lost, each counted once.
    lost_leases: HashSet<(String, String)>,
}

/// The drains, deliveries and conflicts the workers logged, checked against
/// how each VM ended.
pub(super) fn analyse_logs(
    report: &mut Report,
    vms: &[VmRecord],
    job_of_message: &HashMap<String, usize>,
    jobs: &[PrimesJob],
    deadline_jobs: &[usize],
) -> Result<()> {
    let mut texts = Vec::with_capacity(vms.len());
    for vm in vms {
        let text = std::fs::read_to_string(&vm.log)
            .with_context(|| format!("reading {}", vm.log.display()))?;
        texts.push(text);
    }
    // A job moved between lanes travels in a new message: the handler's
    // lines name its job, which names the message.
    let mut job_of_message = job_of_message.clone();
    for text in &texts {
        learn_messages(
            &mut job_of_message,
            text.lines().filter_map(parse_line),
            jobs,
        );
    }
    let job_of_message = &job_of_message;
    let mut deliveries = Deliveries::default();
    let mut logs = Vec::with_capacity(vms.len());
    let mut runs = Vec::new();
    for (vm, text) in vms.iter().zip(texts) {
        let drains = read_vm_log(report, vm, &text, job_of_message, &mut deliveries);
        let lines: Vec<Line> = text.lines().filter_map(parse_line).collect();
        if vm.regular {
            count_regular_lane(report, &lines, job_of_message, deadline_jobs);
        }
        // Only a process killed without a word leaves a run without its
        // ending line; one that drained logged every delivery's end.
        let cut = matches!(vm.ending, Some(Ending::Killed | Ending::Unexpected(_)));
        let ended_at = vm.ended_at.filter(|_| cut).and_then(|at| {
            at.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|since| since.as_secs_f64())
        });
        runs.extend(runs_in_log(
            &vm.name,
            &lines,
            job_of_message,
            ended_at,
            primes_counted,
        ));
        logs.push((vm.name.clone(), text));
        for failure in freeze_drains(&drains.triggers) {
            report.fail(format!("{}: {failure}", vm.name));
        }
        let (failures, last) = judge_ending(vm, &drains);
        for failure in failures {
            report.fail(format!("{}: {failure}", vm.name));
        }
        match last {
            Some(LastDrain::AfterPreempt(ms)) => report.preempt_drains.push((vm.name.clone(), ms)),
            Some(LastDrain::AfterStop(ms)) => report.stop_drains.push((vm.name.clone(), ms)),
            None => {}
        }
    }
    check_runs(report, &runs, jobs);
    if !deadline_jobs.is_empty() && report.finished_regular == 0 {
        report.fail(format!(
            "none of the {} jobs with a deadline finished in the regular lane",
            deadline_jobs.len()
        ));
    }
    report.deliveries = deliveries.seen.values().sum();
    for (job, count) in &deliveries.seen {
        let cut = cut_deliveries(*count, deliveries.saved.get(job).copied().unwrap_or(0));
        report.cut_deliveries += cut;
        // A cut delivery loses what it counted since its last checkpoint
        // (at the worker's checkpoint interval); the logs do not say how
        // much that was, so the job's whole range bounds it.
        report.redone_bound += cut * (jobs[*job].end - jobs[*job].start);
    }
    let (figures, failures) =
        super::goodput::compare(&logs, spot_worker_primes::DEFAULT_CHECKPOINT_EVERY);
    report.goodput = figures;
    for failure in failures {
        report.fail(format!("goodput: {failure}"));
    }
    Ok(())
}

/// Reads one VM's log into the report's figures and `deliveries`; fails
/// the report for lines that are not JSON and for drains that missed their
/// deadline. Returns the VM's drains.
fn read_vm_log(
    report: &mut Report,
    vm: &VmRecord,
    text: &str,
    job_of_message: &HashMap<String, usize>,
    deliveries: &mut Deliveries,
) -> Drains {
    let mut drains = Drains::default();
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some(line) = parse_line(raw) else {
            // Only `main` writes plain text, and only for an error.
            report.error_lines += 1;
            report.fail(format!("{}: {raw}", vm.name));
            continue;
        };
        if line.level == "ERROR" {
            report.error_lines += 1;
        }
        if raw.contains("a different result is stored already") {
            report.duplicates += 1;
        }
        let message_id = line.span_message_id().map(str::to_owned);
        let job = message_id
            .as_deref()
            .and_then(|id| job_of_message.get(id))
            .copied();
        let dequeue_count = line.dequeue_count();
        if let (Some(job), Some(count)) = (job, dequeue_count) {
            let seen = deliveries.seen.entry(job).or_default();
            *seen = (*seen).max(count);
        }
        let mut saved = || {
            if let Some(job) = job {
                *deliveries.saved.entry(job).or_default() += 1;
            }
        };
        match line.message.as_str() {
            "draining: intake stopped, handlers asked to checkpoint" => {
                drains.triggers.push(field_str(&line, "trigger"));
            }
            "drained" => {
                let ms = line
                    .fields
                    .get("notice_to_drained_ms")
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                let met = line.fields.get("met_deadline").and_then(Value::as_bool);
                if met != Some(true) {
                    report.fail(format!(
                        "{}: a drain missed its deadline ({ms} ms)",
                        vm.name
                    ));
                }
                drains.times.push(ms);
            }
            RELEASED => {
                report.released_on_drain += 1;
                saved();
            }
            "handler failed; will retry" => {
                if job.is_some() {
                    report.retried += 1;
                }
                saved();
            }
            "resuming from the checkpoint" => report.resumed += 1,
            "the identical result already existed" => report.identical_rewrites += 1,
            "lane keeper: moved to the regular lane" | "the job moved to the regular lane" => {
                report.moved_to_regular += 1;
            }
            WAITED_FOR_PEER => report.fenced_out += 1,
            ALREADY_COMPLETED => {
                report.already_completed += 1;
                saved();
            }
            message if message.starts_with("lease lost") => {
                let delivery = format!("{message_id:?}/{dequeue_count:?}");
                if deliveries.lost_leases.insert((vm.name.clone(), delivery)) {
                    report.leases_lost += 1;
                }
            }
            _ => {}
        }
    }
    drains
}

/// Adds to `job_of_message` the messages whose delivery's lines name a job
/// by its `job_id`.
fn learn_messages(
    job_of_message: &mut HashMap<String, usize>,
    lines: impl Iterator<Item = Line>,
    jobs: &[PrimesJob],
) {
    let index: HashMap<&str, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| (job.job_id.as_str(), i))
        .collect();
    for line in lines {
        let (Some(message), Some(job)) = (
            line.span_message_id(),
            line.fields.get("job_id").and_then(Value::as_str),
        ) else {
            continue;
        };
        if let Some(job) = index.get(job) {
            job_of_message.entry(message.to_owned()).or_insert(*job);
        }
    }
}

/// The jobs with a deadline a regular VM finished.
fn count_regular_lane(
    report: &mut Report,
    lines: &[Line],
    job_of_message: &HashMap<String, usize>,
    deadline_jobs: &[usize],
) {
    for line in lines {
        let job = line.span_message_id().and_then(|id| job_of_message.get(id));
        if line.message == "job completed" && job.is_some_and(|job| deadline_jobs.contains(job)) {
            report.finished_regular += 1;
        }
    }
}

/// No two runs of one job unsettled at the same moment.
fn check_runs(report: &mut Report, runs: &[Run], jobs: &[PrimesJob]) {
    report.runs = runs.len() as u64;
    let pairs = overlapping(runs, SLACK);
    report.run_twice_at_once = pairs.len() as u64;
    for (earlier, later, overlap) in pairs {
        report.fail(format!(
            "{}: run twice at once for {overlap:.1} s: delivery {} on {} and delivery {} on {}",
            jobs[earlier.job].job_id, earlier.delivery, earlier.vm, later.delivery, later.vm
        ));
    }
}

fn field_str(line: &Line, name: &str) -> String {
    line.fields
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Deliveries of a job cut without a checkpoint of where they got: one
/// delivery completed the job; drained and failed ones saved where they
/// got; the rest were cut (killed, lease lost) and lost what they counted
/// since their last checkpoint.
fn cut_deliveries(deliveries: u64, saved: u64) -> u64 {
    deliveries.saturating_sub(1).saturating_sub(saved)
}

#[cfg(test)]
mod tests {
    use super::super::endings::tests::vm;
    use super::*;

    #[test]
    fn deliveries_that_saved_nothing_are_cut() {
        // (deliveries, saved, cut)
        for (deliveries, saved, cut) in [(1, 0, 0), (3, 0, 2), (3, 2, 0), (3, 5, 0), (0, 0, 0)] {
            assert_eq!(
                cut_deliveries(deliveries, saved),
                cut,
                "{deliveries} {saved}"
            );
        }
    }

    #[test]
    fn a_log_yields_its_figures_and_failures() {
        let line = |message: &str, extra: &str| {
            format!(
                r#"{{"timestamp":"t","level":"INFO","fields":{{"message":"{message}"{extra}}},"span":{{"message_id":"m1","dequeue_count":2}}}}"#
            )
        };
        let text = [
            line(
                "draining: intake stopped, handlers asked to checkpoint",
                r#","trigger":"Preempt event 1""#,
            ),
            line(
                "drained",
                r#","notice_to_drained_ms":70,"met_deadline":false"#,
            ),
            line(RELEASED, ""),
            line("handler failed; will retry", ""),
            line("lease lost before settling", ""),
            line("lease lost before settling", ""),
            "panic: plain text".to_owned(),
        ]
        .join("\n");
        let jobs = HashMap::from([("m1".to_owned(), 0)]);
        let mut report = Report::default();
        let mut deliveries = Deliveries::default();
        let drains = read_vm_log(&mut report, &vm(None, true), &text, &jobs, &mut deliveries);
        assert_eq!(drains.triggers, ["Preempt event 1"]);
        assert_eq!(drains.times, [70]);
        assert_eq!(
            (
                report.released_on_drain,
                report.retried,
                report.leases_lost,
                report.error_lines
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(deliveries.seen[&0], 2);
        assert_eq!(deliveries.saved[&0], 2);
        assert_eq!(
            report.failures,
            [
                "chaos_0: a drain missed its deadline (70 ms)",
                "chaos_0: panic: plain text"
            ]
        );
    }
}
