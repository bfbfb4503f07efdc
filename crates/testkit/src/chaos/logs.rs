//! The workers' JSON logs as the harness reads them: one [`Line`] per JSON
//! line, and the consumer's log messages the checks look for. The logs are
//! the only window into what a worker process did with each delivery.

use std::path::Path;

use serde_json::Value;

/// The consumer's log message for a delivery released by a drain.
pub(super) const RELEASED: &str = "released on shutdown (not counted as a failure)";
/// ... for a delivery that found another holder of its job making progress.
pub(super) const WAITED_FOR_PEER: &str =
    "another holder of this job wrote newer progress; checking again later (not a failure)";
/// ... for a delivery of a job completed on an earlier one.
pub(super) const ALREADY_COMPLETED: &str =
    "the job is completed already; deleted without running it";

/// One JSON log line of a worker.
pub(super) struct Line {
    /// RFC 3339, UTC: orders lines across VMs as text.
    pub(super) timestamp: String,
    pub(super) level: String,
    pub(super) message: String,
    pub(super) fields: serde_json::Map<String, Value>,
    pub(super) span: serde_json::Map<String, Value>,
}

/// The line, if it is one of the worker's JSON lines (with a message).
pub(super) fn parse_line(text: &str) -> Option<Line> {
    let value: Value = serde_json::from_str(text).ok()?;
    let fields = value.get("fields")?.as_object()?.clone();
    Some(Line {
        timestamp: value
            .get("timestamp")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        level: value.get("level")?.as_str()?.to_owned(),
        message: fields.get("message")?.as_str()?.to_owned(),
        span: value
            .get("span")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        fields,
    })
}

impl Line {
    /// The message this line is about: its delivery's span (the consumer's
    /// or the handler's) or its own field (lease renewals).
    pub(super) fn message_id(&self) -> Option<&str> {
        ["message_id", "messaging.message.id"]
            .iter()
            .find_map(|name| self.span.get(*name).or_else(|| self.fields.get(*name)))
            .and_then(Value::as_str)
    }

    /// The message of the delivery whose span this line is in (the
    /// consumer's span names it `message_id`, the handler's by the messaging
    /// conventions); lines outside a delivery have none.
    pub(super) fn span_message_id(&self) -> Option<&str> {
        ["message_id", "messaging.message.id"]
            .iter()
            .find_map(|name| self.span.get(*name))
            .and_then(Value::as_str)
    }

    /// The delivery's `DequeueCount`: the consumer's span names it
    /// `dequeue_count`, the handler's (OpenTelemetry) span by the messaging
    /// conventions.
    pub(super) fn dequeue_count(&self) -> Option<u64> {
        [
            "dequeue_count",
            "messaging.azure_storage_queue.message.dequeue_count",
        ]
        .iter()
        .find_map(|name| self.span.get(*name))
        .and_then(Value::as_u64)
    }
}

/// A worker's log so far, its JSON lines only (a missing file reads as
/// empty: the worker has not started writing).
pub(super) fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(parse_line)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_their_message_and_delivery_from_either_span() {
        let consumer = r#"{"timestamp":"t","level":"INFO","fields":{"message":"m"},"span":{"message_id":"a","dequeue_count":3}}"#;
        let handler = r#"{"timestamp":"t","level":"INFO","fields":{"message":"m"},"span":{"messaging.message.id":"b","messaging.azure_storage_queue.message.dequeue_count":2}}"#;
        let renewal =
            r#"{"timestamp":"t","level":"DEBUG","fields":{"message":"m","message_id":"c"}}"#;
        for (text, id, count) in [
            (consumer, Some("a"), Some(3)),
            (handler, Some("b"), Some(2)),
            (renewal, Some("c"), None),
        ] {
            let line = parse_line(text).expect("a JSON line");
            assert_eq!((line.message_id(), line.dequeue_count()), (id, count));
            let in_span = id.filter(|_| !line.span.is_empty());
            assert_eq!(line.span_message_id(), in_span);
        }
        assert!(parse_line("error: plain text from main").is_none());
        assert!(parse_line(r#"{"level":"INFO","fields":{}}"#).is_none());
    }
}
