//! A poison queue message as the operator's commands see it: its id in the
//! poison queue, the [`PoisonRecord`] it holds (or why it does not parse),
//! which records a command selects, and the original body, fetched and
//! verified when it is a claim-check blob.

use anyhow::{Context as _, Result, bail};
use spot_worker_consumer::PoisonRecord;
use spot_worker_storage::{MessageId, ResultStore as _};

use crate::operate::Fleet;

/// One message of the poison queue.
pub struct Entry {
    /// Its id in the poison queue (what `show`, `requeue` and `purge` take).
    pub id: MessageId,
    /// The record, or why the message is not one.
    pub record: Result<PoisonRecord, String>,
}

impl Entry {
    pub fn new(id: MessageId, text: &str) -> Self {
        Entry {
            id,
            record: PoisonRecord::from_message_text(text).map_err(|e| e.to_string()),
        }
    }
}

/// Which records a command acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// These ids: a poison message id, or the original message's id.
    Ids(Vec<String>),
    /// Records whose reason contains this text.
    ReasonContains(String),
    /// Every record.
    All,
}

impl Selection {
    /// Whether `entry` is selected. A message that is not a record is only
    /// selected by its id: a filter on reasons cannot judge it, and `--all`
    /// never sends one to the work queue (see [`original_text`]).
    pub fn matches(&self, entry: &Entry) -> bool {
        match (self, &entry.record) {
            (Selection::All, _) => true,
            (Selection::Ids(ids), record) => ids.iter().any(|id| {
                id == entry.id.as_str()
                    || record
                        .as_ref()
                        .is_ok_and(|record| *id == record.original_id)
            }),
            (Selection::ReasonContains(text), Ok(record)) => record.last_error.contains(text),
            (Selection::ReasonContains(_), Err(_)) => false,
        }
    }
}

/// The reason on one line of a table: its first line, at most `max` chars.
pub fn short_reason(reason: &str, max: usize) -> String {
    let first_line = reason.lines().next().unwrap_or("");
    let mut short: String = first_line.chars().take(max).collect();
    if short.len() < first_line.len() || reason.lines().nth(1).is_some() {
        short.push('…');
    }
    short
}

/// Size of the original in bytes, and where it is kept.
pub fn original_size(record: &PoisonRecord) -> (usize, &'static str) {
    match (&record.body, &record.body_blob) {
        (Some(body), _) => (body.len(), "inline"),
        (None, Some(blob)) => (blob.len, "blob"),
        (None, None) => (0, "missing"),
    }
}

/// The original message text exactly as it was on the work queue: the
/// record's `body`, or its claim-check blob, downloaded and checked against
/// the recorded length and SHA-256.
pub async fn original_text(fleet: &Fleet, record: &PoisonRecord) -> Result<String> {
    if let Some(body) = &record.body {
        return Ok(body.clone());
    }
    let Some(blob) = &record.body_blob else {
        bail!(
            "the record of message {} has neither a body nor a body_blob",
            record.original_id
        );
    };
    let place = format!("claim-check blob {}/{}", blob.container, blob.name);
    let bytes = fleet
        .blobs(&blob.container)?
        .get(&blob.name)
        .await
        .with_context(|| format!("reading {place}"))?
        .with_context(|| format!("{place} does not exist"))?;
    if !blob.matches(&bytes) {
        bail!(
            "{place} does not match its record ({} bytes, sha256 {} expected; got {} bytes): \
             left untouched",
            blob.len,
            blob.sha256,
            bytes.len()
        );
    }
    String::from_utf8(bytes).with_context(|| format!("{place} is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, original: &str, reason: &str) -> Entry {
        let record = serde_json::json!({
            "queue": "jobs", "original_id": original, "dequeue_count": 1,
            "inserted_at": null, "poisoned_at": "2026-01-01T00:00:00Z",
            "last_error": reason, "body": "x",
        });
        Entry::new(MessageId::new(id), &record.to_string())
    }

    #[test]
    fn selections_pick_what_they_say() {
        let timeout = entry("p1", "o1", "timed out after 30 s");
        let refused = entry("p2", "o2", "refused");
        let garbage = Entry::new(MessageId::new("p3"), "not json");
        let ids = Selection::Ids(vec!["p1".into(), "o2".into(), "p3".into()]);
        let reason = Selection::ReasonContains("timed out".into());
        let table = [
            (&ids, &timeout, true),
            (&ids, &refused, true),
            (&ids, &garbage, true),
            (&Selection::Ids(vec!["o9".into()]), &timeout, false),
            (&reason, &timeout, true),
            (&reason, &refused, false),
            (&reason, &garbage, false),
            (&Selection::All, &refused, true),
            (&Selection::All, &garbage, true),
        ];
        for (selection, entry, expected) in table {
            assert_eq!(
                selection.matches(entry),
                expected,
                "{selection:?} {}",
                entry.id
            );
        }
    }

    #[test]
    fn reasons_are_cut_to_one_short_line() {
        assert_eq!(short_reason("short", 10), "short");
        assert_eq!(short_reason("exactly10!", 10), "exactly10!");
        assert_eq!(short_reason("longer than ten", 10), "longer tha…");
        assert_eq!(short_reason("one\ntwo", 10), "one…");
        assert_eq!(short_reason("", 10), "");
        assert_eq!(short_reason("héllo wörld", 5), "héllo…");
    }
}

#[cfg(test)]
mod bad_input;
