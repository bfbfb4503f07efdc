//! Moving a job to the other lane: its lane record says so first, then the
//! new message goes to the other lane's queue; whoever holds the old
//! message deletes it after (see [`record`](super::record) for why a crash
//! between any two steps neither loses the job nor runs it twice). The
//! intent is written only by a mover whose receive of the message is the
//! latest the record names, fenced by the ETag it read: a mover whose hold
//! ran out while another receive claimed the job to run sends nothing.

use spot_worker_decisions::lanes::Lane;

use spot_worker_storage::DatedAnew;
use spot_worker_storage::MessageEncoding;
use spot_worker_storage::MessageId;
use spot_worker_storage::StorageError;

use super::Lanes;
use super::record::{Arrival, LaneRecord, LaneRecords, ReadRecord, arrival, may_move};
use spot_worker_envelope::{Carried, Envelope};

/// Why a mover whose hold ran out sends nothing.
const LATER_RECEIVE: &str =
    "a later receive of its message claimed the job (this mover's hold ran out)";

/// Why the live message of a job being poisoned is not moved.
const POISONING: &str = "the job is being poisoned (its lane record is its tombstone)";

/// Dates the job's checkpoint files anew before its message is sent
/// with a fresh time-to-live (see [`spot_worker_storage::date_anew`]), so the
/// container's retention rule cannot reach them before the new message
/// expires. `Some(reason)` if that could not be done for now: then the
/// move waits (the record's intent only makes the next try move again).
async fn date_checkpoint_anew(records: &LaneRecords, key: &str) -> Option<String> {
    match spot_worker_storage::date_anew(records.store(), key).await {
        Ok(DatedAnew::NoFiles | DatedAnew::Recent) => None,
        Ok(DatedAnew::Touched { blobs } | DatedAnew::Superseded { blobs }) => {
            tracing::info!(job = %key, blobs, "the job's checkpoint files were dated anew before its message was sent again");
            None
        }
        // A blob is gone already: no wait brings it back, and the job's
        // next delivery reports the broken checkpoint as it stands.
        Err(error @ StorageError::InvalidData { .. }) => {
            tracing::error!(job = %key, %error, "the job's checkpoint names a missing blob; it is moved all the same");
            None
        }
        Err(error) => Some(format!(
            "dating its checkpoint files anew, so the retention rule spares them while the new message lives: {error}"
        )),
    }
}

/// The job to move: its message as held, and what goes with it.
pub struct MoveJob<'a> {
    /// The job's key.
    pub key: &'a str,
    /// The message held (leased) by the mover.
    pub message: &'a MessageId,
    /// Which receive of it the mover holds (its dequeue count).
    pub held: u32,
    /// The envelope that message carries.
    pub envelope: &'a Envelope,
    /// The body, as the handler reads it.
    pub body: &'a [u8],
    /// The lane of the held message's queue.
    pub from: Lane,
    /// Where it goes.
    pub to: Lane,
    /// What the new message carries from the held one and those before it.
    pub carried: Carried,
}

/// How a move ended.
#[derive(Debug)]
pub enum Moved {
    /// The new message is in the other lane's queue: delete the held one.
    Sent(MessageId),
    /// The held message turned out to be an old copy: delete it unrun.
    Stale,
    /// Nothing was sent (the reason says why): the held message stays the
    /// job's, in its lane.
    NotSent(String),
}

impl Lanes {
    /// Moves `job`, whose lane record was read as `read`: writes the
    /// intent, then sends. The caller deletes the held message when this
    /// says [`Moved::Sent`] or [`Moved::Stale`].
    pub async fn send_moved(
        &self,
        records: &LaneRecords,
        encoding: MessageEncoding,
        job: &MoveJob<'_>,
        read: ReadRecord,
    ) -> Moved {
        let envelope = job.envelope;
        if !may_move(read.record.as_ref(), job.message.as_str(), job.held) {
            return Moved::NotSent(LATER_RECEIVE.into());
        }
        if read
            .record
            .as_ref()
            .is_some_and(|record| record.poisoned && record.message == job.message.as_str())
        {
            return Moved::NotSent(POISONING.into());
        }
        let mut intent = match &read.record {
            Some(record) => record.clone(),
            None => {
                LaneRecord::claimed_by(job.message.as_str(), envelope, job.from, job.held, None)
            }
        };
        intent.held = job.held;
        intent.moving = Some(job.to);
        intent.updated_at = time::OffsetDateTime::now_utc();
        match records.write(job.key, &read, &intent).await {
            Ok(_) => {}
            Err(StorageError::Conflict { .. }) => {
                // Someone wrote the record since it was read: only an
                // arrival of a newer copy can have, so look again.
                return match records.read_fenced(job.key).await {
                    Ok(now) => match arrival(
                        now.record.as_ref(),
                        envelope.generation,
                        job.message.as_str(),
                        envelope.moved_from.as_deref(),
                    ) {
                        Arrival::Stale => Moved::Stale,
                        Arrival::Poisoning => Moved::NotSent(POISONING.into()),
                        _ if !may_move(now.record.as_ref(), job.message.as_str(), job.held) => {
                            Moved::NotSent(LATER_RECEIVE.into())
                        }
                        _ => Moved::NotSent("its lane record changed meanwhile".into()),
                    },
                    Err(error) => Moved::NotSent(format!("reading its lane record: {error}")),
                };
            }
            Err(error) => return Moved::NotSent(format!("writing its lane record: {error}")),
        };
        if let Some(reason) = date_checkpoint_anew(records, job.key).await {
            return Moved::NotSent(reason);
        }
        let moved = Envelope {
            deadline: envelope.deadline,
            generation: envelope.generation.saturating_add(1),
            key: Some(job.key.to_owned()),
            lane: Some(job.to),
            moved_from: Some(job.message.as_str().to_owned()),
            carried: job.carried,
        };
        let sent = match encoding.encode(&moved.wrap(job.body)) {
            Ok(text) => self
                .queue(job.to)
                .send(&text, std::time::Duration::ZERO)
                .await
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match sent {
            Ok(id) => Moved::Sent(id),
            Err(reason) => {
                // The intent stays: a send that failed may have landed
                // (its answer lost), and another mover's send of the same
                // move may still be in flight. The held message's next
                // delivery completes the move instead of running, and a
                // second copy the move makes is stale by the record.
                Moved::NotSent(format!(
                    "sending it to the {} lane's queue {}: {reason}",
                    job.to.as_str(),
                    self.queue(job.to).name()
                ))
            }
        }
    }
}
