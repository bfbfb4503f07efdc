//! Goodput as the workers reported it, against what their own logs show
//! was redone.
//!
//! Reported: the consumer's `job finished: where its time went` line of
//! each job (its `redone_s`, summed from the job's checkpoints and attempt
//! record). Observed: for each delivery of the job that did not finish it,
//! the time from its last `progress saved` line (or its first line, if it
//! saved nothing) to its last `chunk counted` line: the work it did that
//! no checkpoint kept. Both timestamps come from the same worker process's
//! log, so no two machines' clocks are subtracted.
//!
//! The worker cannot see a delivery cut without a word (SIGKILL, a lost
//! lease): it reports nothing for its unsaved work, which is at most one
//! checkpoint interval. A job passes when the two differ by at most one
//! checkpoint interval per interrupted delivery, plus a small slack for
//! what the log cannot place exactly (the chunk in progress at a cut, the
//! lines' own latency).

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

/// One delivery as its worker logged it (times in seconds since the epoch).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Delivery {
    first: Option<f64>,
    last_chunk: Option<f64>,
    last_save: Option<f64>,
    /// The `redone_s` the delivery reported, if it finished the job.
    reported_redone: Option<f64>,
}

impl Delivery {
    /// Seconds of work after its last save (or its start): what it lost.
    fn lost(&self) -> f64 {
        let Some(chunk) = self.last_chunk else {
            return 0.0;
        };
        let from = self.last_save.or(self.first).unwrap_or(chunk);
        (chunk - from).max(0.0)
    }
}

/// The figures of the comparison, for the report.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GoodputFigures {
    /// Jobs with a reported ledger.
    pub jobs: u64,
    /// Their deliveries that did not finish them.
    pub interrupted: u64,
    /// Redone work the workers reported, in seconds.
    pub reported_redone_s: f64,
    /// Redone work their logs show, in seconds.
    pub observed_redone_s: f64,
    /// The largest observed minus reported of one job, in seconds.
    pub worst_gap_s: f64,
}

fn seconds(line: &Line) -> Option<f64> {
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
        let interrupted: Vec<&&Delivery> = deliveries
            .iter()
            .filter(|d| d.reported_redone.is_none())
            .collect();
        let observed: f64 = interrupted.iter().map(|d| d.lost()).sum();
        let gap = observed - reported;
        let allowed = interval.as_secs_f64() * interrupted.len() as f64 + SLACK.as_secs_f64();
        figures.jobs += 1;
        figures.interrupted += interrupted.len() as u64;
        figures.reported_redone_s += reported;
        figures.observed_redone_s += observed;
        figures.worst_gap_s = figures.worst_gap_s.max(gap);
        if gap.abs() > allowed {
            failures.push(format!(
                "message {message}: reported {reported:.3} s redone, its logs show {observed:.3} s \
                 over {} interrupted deliveries (allowed difference {allowed:.3} s)",
                interrupted.len()
            ));
        }
    }
    (figures, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at: &str, message: &str, count: u64, extra: &str) -> String {
        format!(
            r#"{{"timestamp":"2026-11-26T00:00:{at}Z","level":"DEBUG","fields":{{"message":"{message}"{extra}}},"span":{{"message_id":"m1","dequeue_count":{count}}}}}"#
        )
    }

    #[test]
    fn redone_work_is_what_an_interrupted_delivery_did_after_its_last_save() {
        let first_vm = [
            line("01.000000", "received", 1, ""),
            line("02.000000", "chunk counted", 1, ""),
            line("02.500000", "progress saved", 1, ""),
            line("03.000000", "chunk counted", 1, ""),
            // Cut here: 1.25 s after its last save.
            line("03.750000", "chunk counted", 1, ""),
        ]
        .join("\n");
        let second_vm = [
            line("10.000000", "chunk counted", 2, ""),
            line("11.000000", FINISHED, 2, r#","redone_s":1.0"#),
        ]
        .join("\n");
        let logs = [("vm0".to_owned(), first_vm), ("vm1".to_owned(), second_vm)];
        let (figures, failures) = compare(&logs, Duration::from_secs(10));
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!((figures.jobs, figures.interrupted), (1, 1));
        assert!(
            (figures.observed_redone_s - 1.25).abs() < 1e-6,
            "{figures:?}"
        );
        assert!((figures.worst_gap_s - 0.25).abs() < 1e-6, "{figures:?}");
        // With a 100 ms interval, a 250 ms gap is too much... plus slack:
        // only a gap past interval + 0.5 s fails.
        let (_, failures) = compare(&logs, Duration::ZERO);
        assert!(failures.is_empty(), "{failures:?}");
        let wrong = [
            logs[0].clone(),
            (
                "vm1".to_owned(),
                line("11.000000", FINISHED, 2, r#","redone_s":9.0"#),
            ),
        ];
        let (_, failures) = compare(&wrong, Duration::from_secs(1));
        assert_eq!(failures.len(), 1, "{failures:?}");
    }

    #[test]
    fn a_delivery_that_saved_nothing_lost_all_it_counted() {
        let delivery = Delivery {
            first: Some(1.0),
            last_chunk: Some(4.0),
            last_save: None,
            reported_redone: None,
        };
        assert_eq!(delivery.lost(), 3.0);
        assert_eq!(Delivery::default().lost(), 0.0);
    }
}
