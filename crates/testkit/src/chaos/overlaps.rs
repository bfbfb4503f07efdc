//! Run twice at once: from the workers' logs, every run of a job (a
//! delivery whose handler counted: from its first line to the line that
//! ends it, or, cut without one by a SIGKILL, to its process's end) and
//! the pairs of runs of one job that were unsettled at the same moment.
//!
//! A holder that loses its lease stops when its lease runs out, which is
//! also the earliest the message can be received again; the two events
//! are logged by two processes whose timers the machine may serve late, so
//! an overlap up to [`SLACK`] is not counted (nor reported as one).

use std::collections::HashMap;
use std::time::Duration;

use super::goodput::seconds;
use super::logs::{ALREADY_COMPLETED, Line, RELEASED, WAITED_FOR_PEER};

/// The overlap two processes' timers can explain (see above).
pub(super) const SLACK: Duration = Duration::from_secs(1);

/// One run of a job as its worker logged it (seconds since the epoch).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Run {
    pub(super) vm: String,
    pub(super) job: usize,
    /// `<message id>#<dequeue count>`.
    pub(super) delivery: String,
    pub(super) from: f64,
    pub(super) to: f64,
}

/// A delivery's lines, as they are read.
#[derive(Default)]
struct Delivery {
    from: Option<f64>,
    last: f64,
    counted: bool,
    ended: bool,
}

/// Whether the line ends its delivery's run: settled (or its settling
/// failed), released, failed, fenced out, the store out of reach or its
/// lease lost.
fn ends_the_run(message: &str) -> bool {
    matches!(
        message,
        RELEASED
            | WAITED_FOR_PEER
            | ALREADY_COMPLETED
            | "handler failed; will retry"
            | "job completed"
            | "the identical result already existed"
    ) || (message.contains("lease") && message.contains("lost"))
        || message.starts_with("settling failed")
        || message.starts_with("the checkpoint store could not be reached")
}

/// Whether a line shows that the `primes` handler ran its delivery.
pub(super) fn primes_counted(line: &Line) -> bool {
    line.message == "chunk counted"
}

/// The runs in one VM's log: deliveries of a known job whose handler
/// ran, as `ran` tells from one of their lines ([`primes_counted`] for
/// the `primes` worker). `ended_at`: when the process ended if it was
/// killed, for a run it cut without an ending line.
pub(super) fn runs_in_log(
    vm: &str,
    lines: &[Line],
    job_of_message: &HashMap<String, usize>,
    ended_at: Option<f64>,
    ran: fn(&Line) -> bool,
) -> Vec<Run> {
    let mut deliveries: HashMap<(usize, String), Delivery> = HashMap::new();
    for line in lines {
        let (Some(message), Some(count), Some(at)) =
            (line.span_message_id(), line.dequeue_count(), seconds(line))
        else {
            continue;
        };
        let Some(job) = job_of_message.get(message) else {
            continue;
        };
        let delivery = deliveries
            .entry((*job, format!("{message}#{count}")))
            .or_default();
        delivery.from.get_or_insert(at);
        delivery.last = delivery.last.max(at);
        delivery.counted |= ran(line);
        delivery.ended |= ends_the_run(&line.message);
    }
    let mut runs: Vec<Run> = deliveries
        .into_iter()
        .filter(|(_, d)| d.counted)
        .filter_map(|((job, delivery), d)| {
            let to = match ended_at {
                Some(end) if !d.ended => end.max(d.last),
                _ => d.last,
            };
            Some(Run {
                vm: vm.to_owned(),
                job,
                delivery,
                from: d.from?,
                to,
            })
        })
        .collect();
    runs.sort_by(|a, b| a.from.total_cmp(&b.from));
    runs
}

/// The pairs of runs of one job that overlap by more than `slack`, with
/// the overlap in seconds, in the order of the later run's start.
pub(super) fn overlapping(runs: &[Run], slack: Duration) -> Vec<(Run, Run, f64)> {
    let mut by_job: HashMap<usize, Vec<&Run>> = HashMap::new();
    for run in runs {
        by_job.entry(run.job).or_default().push(run);
    }
    let mut pairs = Vec::new();
    for runs in by_job.values_mut() {
        runs.sort_by(|a, b| a.from.total_cmp(&b.from));
        for (i, later) in runs.iter().enumerate() {
            for earlier in &runs[..i] {
                let overlap = earlier.to.min(later.to) - later.from;
                if overlap > slack.as_secs_f64() {
                    pairs.push(((*earlier).clone(), (*later).clone(), overlap));
                }
            }
        }
    }
    pairs.sort_by(|a, b| a.1.from.total_cmp(&b.1.from));
    pairs
}

#[cfg(test)]
mod tests {
    use super::super::logs::parse_line;
    use super::*;

    fn line(second: u32, message: &str, count: u64) -> Line {
        parse_line(&format!(
            r#"{{"timestamp":"2026-01-01T00:00:{second:02}.000000Z","level":"INFO","fields":{{"message":"{message}"}},"span":{{"message_id":"m1","dequeue_count":{count}}}}}"#
        ))
        .expect("a JSON line")
    }

    const T0: f64 = 1_767_225_600.0;

    #[test]
    fn a_run_spans_its_delivery_and_a_cut_one_reaches_its_process_end() {
        let jobs = HashMap::from([("m1".to_owned(), 7)]);
        let lines = [
            line(1, "resuming from the checkpoint", 1),
            line(2, "chunk counted", 1),
            line(4, "job completed", 1),
            // Deleted without counting: not a run.
            line(5, "reading the checkpoint", 2),
            line(6, ALREADY_COMPLETED, 2),
            line(8, "chunk counted", 3),
            // Its settling failed: it ends there, however late its process.
            line(10, "chunk counted", 4),
            line(
                11,
                "settling failed; the message reappears after its visibility timeout",
                4,
            ),
        ];
        let runs = runs_in_log("vm", &lines, &jobs, Some(T0 + 20.0), primes_counted);
        let spans: Vec<(String, f64, f64)> = runs
            .iter()
            .map(|r| (r.delivery.clone(), r.from - T0, r.to - T0))
            .collect();
        assert_eq!(
            spans,
            [
                ("m1#1".to_owned(), 1.0, 4.0),
                ("m1#3".to_owned(), 8.0, 20.0),
                ("m1#4".to_owned(), 10.0, 11.0)
            ]
        );
        // Without a process end, the last line ends it.
        let runs = runs_in_log("vm", &lines, &jobs, None, primes_counted);
        assert_eq!(runs[1].to - T0, 8.0);
        // Lines of messages that are no job's are not runs.
        assert!(runs_in_log("vm", &lines, &HashMap::new(), None, primes_counted).is_empty());
    }

    #[test]
    fn runs_of_one_job_overlapping_beyond_the_slack_are_reported() {
        let run = |vm: &str, job: usize, from: f64, to: f64| Run {
            vm: vm.to_owned(),
            job,
            delivery: format!("{vm}-{from}"),
            from,
            to,
        };
        let slack = Duration::from_secs(1);
        /// An overlap expected: (earlier VM, later VM, seconds).
        type Overlap<'a> = (&'a str, &'a str, f64);
        // (runs, overlaps expected)
        let table: [(Vec<Run>, Vec<Overlap>); 5] = [
            (
                vec![run("a", 1, 0.0, 10.0), run("b", 1, 10.0, 20.0)],
                vec![],
            ),
            (vec![run("a", 1, 0.0, 10.0), run("b", 1, 9.5, 20.0)], vec![]),
            (
                vec![run("a", 1, 0.0, 10.0), run("b", 1, 5.0, 20.0)],
                vec![("a", "b", 5.0)],
            ),
            // Inside the other, and in another order.
            (
                vec![run("b", 1, 2.0, 4.0), run("a", 1, 0.0, 10.0)],
                vec![("a", "b", 2.0)],
            ),
            // Different jobs never overlap.
            (vec![run("a", 1, 0.0, 10.0), run("b", 2, 5.0, 20.0)], vec![]),
        ];
        for (runs, expected) in table {
            let found: Vec<(String, String, f64)> = overlapping(&runs, slack)
                .into_iter()
                .map(|(a, b, s)| (a.vm, b.vm, s))
                .collect();
            let expected: Vec<(String, String, f64)> = expected
                .into_iter()
                .map(|(a, b, s)| (a.to_owned(), b.to_owned(), s))
                .collect();
            assert_eq!(found, expected, "{runs:?}");
        }
    }
}
