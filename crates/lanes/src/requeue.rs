//! What `spot-worker poison requeue` sends back for a job with a
//! deadline: the original message, its envelope marked as moved from the
//! poisoned message. The job's lane record keeps a tombstone once the job
//! is poisoned (see [`record`](super::record)), under which every copy a
//! move left behind is stale; the original sent back as it was would be
//! one of them (the same generation, moved from the same message). Marked
//! so, it is the job asked for anew, and a second copy of the same
//! requeue is stale again.

use spot_worker_storage::MessageEncoding;
use spot_worker_storage::StorageError;

use spot_worker_envelope::Envelope;

/// The text to requeue for the poisoned message `original_id`, whose text
/// was `text` in a queue of `encoding`: unchanged without a deadline (or
/// if it does not decode: the poison record says why), else with its
/// envelope's `moved_from` set to `original_id`. The body is unchanged.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use spot_worker_decisions::lanes::Deadline;
/// use spot_worker_storage::MessageEncoding;
/// use spot_worker_lanes::{Envelope, requeue_text};
///
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
/// let deadline = Deadline { start, due: start + Duration::from_secs(3600), work: Duration::from_secs(600) };
/// let text = String::from_utf8(Envelope::new(deadline).wrap(b"body")).unwrap();
/// let requeued = requeue_text(MessageEncoding::Text, &text, "poisoned-id").unwrap();
/// let (envelope, body) = Envelope::unwrap(requeued.as_bytes()).unwrap();
/// assert_eq!(envelope.unwrap().moved_from.as_deref(), Some("poisoned-id"));
/// assert_eq!(body, b"body");
/// assert_eq!(requeue_text(MessageEncoding::Text, "plain", "x").unwrap(), "plain");
/// ```
pub fn requeue_text(
    encoding: MessageEncoding,
    text: &str,
    original_id: &str,
) -> Result<String, StorageError> {
    let Ok(bytes) = encoding.decode(text) else {
        return Ok(text.to_owned());
    };
    let Ok((Some(envelope), body)) = Envelope::unwrap(&bytes) else {
        return Ok(text.to_owned());
    };
    let requeued = Envelope {
        moved_from: Some(original_id.to_owned()),
        ..envelope
    };
    encoding.encode(&requeued.wrap(body))
}
