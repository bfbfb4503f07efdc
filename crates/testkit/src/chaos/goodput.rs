//! Goodput as the workers reported it, against what their own logs show
//! was redone.
//!
//! Reported: the consumer's `job finished: where its time went` line of
//! each job (its `redone_s`, summed from the job's checkpoints and attempt
//! record). Observed, for each delivery of the job that did not finish it:
//! the time from its last `progress saved` line (or its first line, the
//! consumer's `handler started`, if it saved nothing) to its last
//! `chunk counted` line, the work no checkpoint
//! kept; and, for a delivery whose ending the log shows (released, failed,
//! fenced out, lease lost), to that ending line, since the worker counts
//! all handler time not blocked on a save (a result write retried through
//! an outage too). Both timestamps come from the same worker process's
//! log, so no two machines' clocks are subtracted.
//!
//! A job passes when the redone work reported lies between what its
//! deliveries that ended alive observably lost (last chunk) and what they
//! held (ending line), give or take a small slack for what the log cannot
//! place exactly (the chunk in progress, the lines' own latency); and when
//! each delivery the worker could not report (cut without a word by a
//! SIGKILL, or whose tail could not be written through an outage, which
//! its worker logs) lost at most one checkpoint interval.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::logs::{Line, parse_line};

/// What the log cannot place exactly, per job.
const SLACK: Duration = Duration::from_millis(500);

/// The consumer's line for a finished job's ledger.
const FINISHED: &str = "job finished: where its time went";
/// How the consumer's lines end when a tail could not be recorded.
const UNRECORDED: &str = "its redone work goes unreported";

/// Lines that show a delivery ending alive, without finishing its job: the
/// worker then records its tail.
fn ends_alive(message: &str) -> bool {
    message == super::logs::RELEASED
        || message == super::logs::WAITED_FOR_PEER
        || message == "handler failed; will retry"
        || message == "tail recorded"
        || (message.contains("lease") && message.contains("lost"))
}

/// One delivery as its worker logged it (times in seconds since the epoch).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Delivery {
    first: Option<f64>,
    last_chunk: Option<f64>,
    last_save: Option<f64>,
    /// The first line showing it ended alive.
    ended: Option<f64>,
    /// Its worker said it could not record its tail: unreported, like a cut.
    unrecorded: bool,
    /// The `redone_s` the delivery reported, if it finished the job.
    reported_redone: Option<f64>,
}

impl Delivery {
    fn since_save(&self, until: Option<f64>) -> f64 {
        let Some(until) = until else {
            return 0.0;
        };
        let from = self.last_save.or(self.first).unwrap_or(until);
        (until - from).max(0.0)
    }

    /// Seconds of work after its last save (or its start), to its last
    /// chunk: what it observably lost.
    fn lost(&self) -> f64 {
        self.since_save(self.last_chunk)
    }

    /// Seconds from its last save (or its start) to its ending: the most it
    /// can have reported.
    fn held(&self) -> f64 {
        self.since_save(self.ended.or(self.last_chunk))
            .max(self.lost())
    }
}

/// The figures of the comparison, for the report.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GoodputFigures {
    /// Jobs with a reported ledger.
    pub jobs: u64,
    /// Their deliveries that ended alive without finishing them.
    pub ended_alive: u64,
    /// Their deliveries cut without a word (no ending in the log), or whose
    /// tail could not be recorded (an outage): unreported.
    pub cut: u64,
    /// Redone work the workers reported, in seconds.
    pub reported_redone_s: f64,
    /// Work the deliveries that ended alive observably lost (to their last
    /// chunk), in seconds.
    pub observed_alive_s: f64,
    /// ... and held after their last save (to their ending line).
    pub held_alive_s: f64,
    /// Work the cut deliveries lost, unreported by design, in seconds.
    pub observed_cut_s: f64,
    /// The most one cut delivery lost, in seconds.
    pub worst_cut_s: f64,
}

/// When the line was written, in seconds since the epoch.
pub(super) fn seconds(line: &Line) -> Option<f64> {
    let at = OffsetDateTime::parse(&line.timestamp, &Rfc3339).ok()?;
    Some(at.unix_timestamp_nanos() as f64 / 1e9)
}

/// Reads the workers' logs (`(vm, text)`) and compares, per job, what was
/// reported with what was observed; returns the figures and one failure
/// per job off by more than `interval` per interrupted delivery.
pub(super) fn compare(
    logs: &[(String, String)],
    interval: Duration,
) -> (GoodputFigures, Vec<String>) {
    // (VM, message, dequeue count) -> delivery
    let mut deliveries: HashMap<(String, String, u64), Delivery> = HashMap::new();
    for (vm, text) in logs {
        for line in text.lines().filter_map(parse_line) {
            let (Some(message), Some(count), Some(at)) =
                (line.span_message_id(), line.dequeue_count(), seconds(&line))
            else {
                continue;
            };
            let delivery = deliveries
                .entry((vm.clone(), message.to_owned(), count))
                .or_default();
            delivery.first.get_or_insert(at);
            match line.message.as_str() {
                "chunk counted" => delivery.last_chunk = Some(at),
                "progress saved" => delivery.last_save = Some(at),
                message if message.ends_with(UNRECORDED) => delivery.unrecorded = true,
                message if ends_alive(message) => {
                    delivery.ended.get_or_insert(at);
                }
                FINISHED => {
                    delivery.reported_redone = line.fields.get("redone_s").and_then(Value::as_f64);
                }
                _ => {}
            }
        }
    }
    let mut by_message: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for ((_, message, _), delivery) in &deliveries {
        by_message.entry(message).or_default().push(delivery);
    }
    let mut figures = GoodputFigures::default();
    let mut failures = Vec::new();
    let mut messages: Vec<_> = by_message.into_iter().collect();
    messages.sort_by_key(|(message, _)| *message);
    for (message, deliveries) in messages {
        let Some(reported) = deliveries.iter().find_map(|d| d.reported_redone) else {
            continue;
        };
        let interrupted = deliveries.iter().filter(|d| d.reported_redone.is_none());
        let (alive, cut): (Vec<&&Delivery>, Vec<&&Delivery>) =
            interrupted.partition(|d| d.ended.is_some() && !d.unrecorded);
        let lost: f64 = alive.iter().map(|d| d.lost()).sum();
        let held: f64 = alive.iter().map(|d| d.held()).sum();
        figures.jobs += 1;
        figures.ended_alive += alive.len() as u64;
        figures.cut += cut.len() as u64;
        figures.reported_redone_s += reported;
        figures.observed_alive_s += lost;
        figures.held_alive_s += held;
        let slack = SLACK.as_secs_f64() * (alive.len() as f64).max(1.0);
        if reported < lost - slack || reported > held + slack {
            failures.push(format!(
                "message {message}: reported {reported:.3} s redone; its {} deliveries that ended \
                 alive lost {lost:.3} s to their last chunk and held {held:.3} s to their ending",
                alive.len()
            ));
        }
        for delivery in cut {
            let lost = delivery.lost();
            figures.observed_cut_s += lost;
            figures.worst_cut_s = figures.worst_cut_s.max(lost);
            if lost > interval.as_secs_f64() + SLACK.as_secs_f64() {
                failures.push(format!(
                    "message {message}: an unreported delivery lost {lost:.3} s, more than one \
                     checkpoint interval ({interval:?})"
                ));
            }
        }
    }
    (figures, failures)
}

#[cfg(test)]
mod tests {
    use super::super::logs::RELEASED;
    use super::*;

    fn line(at: &str, message: &str, count: u64, extra: &str) -> String {
        format!(
            r#"{{"timestamp":"2026-11-26T00:00:{at}Z","level":"DEBUG","fields":{{"message":"{message}"{extra}}},"span":{{"message_id":"m1","dequeue_count":{count}}}}}"#
        )
    }

    #[test]
    fn reported_redone_work_lies_between_what_was_lost_and_what_was_held() {
        let first_vm = [
            line("01.000000", "handler started", 1, ""),
            line("02.000000", "chunk counted", 1, ""),
            line("02.500000", "progress saved", 1, ""),
            line("03.000000", "chunk counted", 1, ""),
            // 1.25 s after its last save, then released 0.25 s later.
            line("03.750000", "chunk counted", 1, ""),
            line("04.000000", RELEASED, 1, ""),
        ]
        .join("\n");
        // Cut without a word, 2 s after it started.
        let killed = [
            line("05.000000", "handler started", 2, ""),
            line("07.000000", "chunk counted", 2, ""),
        ]
        .join("\n");
        let finished = |redone: &str| {
            [
                line("10.000000", "chunk counted", 3, ""),
                line(
                    "11.000000",
                    FINISHED,
                    3,
                    &format!(r#","redone_s":{redone}"#),
                ),
            ]
            .join("\n")
        };
        let logs = |redone: &str| {
            [
                ("vm0".to_owned(), first_vm.clone()),
                ("vm1".to_owned(), killed.clone()),
                ("vm2".to_owned(), finished(redone)),
            ]
        };
        let (figures, failures) = compare(&logs("1.4"), Duration::from_secs(10));
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!((figures.jobs, figures.ended_alive, figures.cut), (1, 1, 1));
        assert!(
            (figures.observed_alive_s - 1.25).abs() < 1e-6,
            "{figures:?}"
        );
        assert!((figures.held_alive_s - 1.5).abs() < 1e-6, "{figures:?}");
        assert!((figures.observed_cut_s - 2.0).abs() < 1e-6, "{figures:?}");
        // Reported too little, too much, or a cut longer than an interval.
        for (redone, interval) in [("0.0", 10), ("9.0", 10), ("1.4", 1)] {
            let (_, failures) = compare(&logs(redone), Duration::from_secs(interval));
            assert_eq!(failures.len(), 1, "{redone} {interval}: {failures:?}");
        }
    }

    #[test]
    fn a_delivery_released_before_its_first_chunk_held_its_handler_time() {
        // Released 1.1 s after its handler started, before it counted a
        // chunk (seed 20260606 on CI): the worker reports that time.
        let logs = |lines: &[String]| [("vm0".to_owned(), lines.join("\n"))];
        let released = [
            line("01.000000", "handler started", 1, ""),
            line("02.100000", RELEASED, 1, ""),
        ];
        let finished = line("09.000000", FINISHED, 2, r#","redone_s":1.094"#);
        let whole = [released[0].clone(), released[1].clone(), finished.clone()];
        let (figures, failures) = compare(&logs(&whole), Duration::from_secs(10));
        assert!(failures.is_empty(), "{failures:?}");
        assert!((figures.held_alive_s - 1.1).abs() < 1e-6, "{figures:?}");
        // Without the start line the log shows nothing held.
        let (_, failures) = compare(
            &logs(&[released[1].clone(), finished]),
            Duration::from_secs(10),
        );
        assert_eq!(failures.len(), 1, "{failures:?}");
    }

    #[test]
    fn a_delivery_that_saved_nothing_lost_all_it_counted() {
        let delivery = Delivery {
            first: Some(1.0),
            last_chunk: Some(4.0),
            last_save: None,
            ended: Some(4.5),
            unrecorded: false,
            reported_redone: None,
        };
        assert_eq!((delivery.lost(), delivery.held()), (3.0, 3.5));
        assert_eq!(Delivery::default().lost(), 0.0);
    }
}
