//! [`LaneRecord`]: which message of a job with a deadline is the live one,
//! kept in the checkpoint store under `.spot-worker/lanes/<job key>`, so
//! that a move between lanes (send to the other queue, then delete) never
//! loses the job and never leaves two copies that both run.
//!
//! A move cannot be one atomic step: a queue offers no way to send a
//! message and delete another together. So every message of such a job
//! carries a generation (0 as enqueued, one more per move), the record
//! names the generation and the message that holds it, and:
//!
//! - a delivery **claims** the record before its handler runs (an
//!   ETag-fenced write), every delivery, a redelivery of the live message
//!   too: it names the receive (the message's dequeue count, `held`) that
//!   runs the job from then on;
//! - a mover first writes its intent (`moving`: to which lane, as which
//!   generation), then sends the new message, then deletes its own. The
//!   intent is fenced by the ETag of the record the mover read, and is
//!   refused when the record names a later receive of the mover's message
//!   than the mover's own ([`may_move`]): so a mover whose hold ran out
//!   while another receive of the same message claimed it to run never
//!   sends a copy. Either the claim lands first (the mover's write
//!   conflicts, or it reads the later receive and stops) or the intent
//!   does (the claim conflicts, reads the intent, and finishes the move
//!   instead of running): one of them, by construction, not by timing;
//! - a delivery of an **older** generation than the record's, or of the
//!   same generation once another copy made by the same move has claimed
//!   it, is **stale**: deleted unrun;
//! - a delivery of the live message whose record says it was being moved
//!   (its mover died between the intent and the delete, or the send
//!   failed) **completes the move** instead of running: sends again, then
//!   deletes. A second copy this may make is stale by the rule above.
//!
//! A message is deleted as stale only once another copy has claimed a
//! generation at least as new, so the job always has a message (or is
//! done, or poisoned). What [`arrival`] decides is a pure function of the
//! record and the message, with a table test; the storage calls are in
//! [`LaneRecords`].
//!
//! When the job finishes, its record is kept, marked finished: a copy a
//! crash left behind that turns up later is then discarded too, even for a
//! handler that marks no completion of its own. The job enqueued anew (a
//! new first message) starts afresh. The record also keeps the job's
//! deadline and lane for `spot-worker status` (the jobs still running,
//! their slack, those at risk). When the job is poisoned the record is
//! kept as a tombstone, marked poisoned: a copy a half-finished move left
//! behind (an older generation, a second copy of the same move, a copy a
//! late mover sends on from the poisoned message) is stale and deleted
//! unrun, so a poisoned job runs no more. `poison requeue` sends the
//! original back as moved from the poisoned message, which a tombstone
//! tells apart from those copies: the job asked for anew. Records go with
//! the checkpoint container's retention rule, after the queue's messages
//! have expired.

use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use spot_worker_decisions::lanes::{Deadline, Lane};
use time::OffsetDateTime;

use spot_worker_storage::StorageError;
use spot_worker_storage::{CheckpointStore, ETag, FencedJson};

use spot_worker_envelope::Envelope;

pub use spot_worker_storage::LANE_RECORD_PREFIX;

/// Which message of a job is live, and what the job is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaneRecord {
    /// The live generation.
    pub generation: u32,
    /// The id of the message that claimed it.
    pub message: String,
    /// The message that one replaced at a move (its `moved_from`), if any:
    /// copies sent by the same move share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// The job's first message (generation 0), which every later one
    /// descends from.
    #[serde(default)]
    pub origin: String,
    /// The job finished: every copy of it is stale.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finished: bool,
    /// The job was poisoned by its live message: every copy of it is
    /// stale; a requeue of its poison record is not (a tombstone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poisoned: bool,
    /// Which receive of the live message claimed it last (its dequeue
    /// count): a mover holding an earlier receive of it does not move it.
    #[serde(default)]
    pub held: u32,
    /// The lane of the live message.
    pub lane: Lane,
    /// A move under way from the live message: to which lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<Lane>,
    /// When the job started.
    #[serde(with = "time::serde::rfc3339")]
    pub start: OffsetDateTime,
    /// When it is due.
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
    /// Its work, seconds.
    pub work_s: f64,
    /// When the record was last written (this VM's clock).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl LaneRecord {
    /// The record a delivery of `message` (carrying `envelope`, in `lane`,
    /// its receive number `held`) writes to claim the job, over the
    /// `previous` one if there is one.
    pub fn claimed_by(
        message: &str,
        envelope: &Envelope,
        lane: Lane,
        held: u32,
        previous: Option<&LaneRecord>,
    ) -> LaneRecord {
        // The same job's lineage keeps its first message; a first message,
        // or the job enqueued anew, starts one.
        let origin = match previous {
            Some(previous)
                if envelope.generation > 0 && !previous.finished && !previous.poisoned =>
            {
                previous.origin.clone()
            }
            _ => match &envelope.moved_from {
                Some(from) if envelope.generation > 0 => from.clone(),
                _ => message.to_owned(),
            },
        };
        LaneRecord {
            generation: envelope.generation,
            message: message.to_owned(),
            moved_from: envelope.moved_from.clone(),
            origin,
            finished: false,
            poisoned: false,
            held,
            lane,
            moving: None,
            start: OffsetDateTime::from(envelope.deadline.start),
            deadline: OffsetDateTime::from(envelope.deadline.due),
            work_s: envelope.deadline.work.as_secs_f64(),
            updated_at: OffsetDateTime::now_utc(),
        }
    }

    /// The job's deadline, as the lane rule takes it.
    pub fn deadline(&self) -> Deadline {
        Deadline {
            start: SystemTime::from(self.start),
            due: SystemTime::from(self.deadline),
            work: std::time::Duration::try_from_secs_f64(self.work_s).unwrap_or_default(),
        }
    }
}

/// What a delivery of a message does, by the job's lane record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The live message, claimed already: run it.
    Run,
    /// Claim the record for this message, then run it.
    Claim,
    /// An older or duplicate copy: delete it unrun.
    Stale,
    /// The live message, whose move to this lane was begun: finish it.
    CompleteMove(Lane),
    /// The live message of a job being poisoned (the record is its
    /// tombstone): neither run nor moved; its poisoning is finished (the
    /// poison record sent unless its attempt record says it was, then the
    /// message deleted). Deleting it as a copy could lose a job whose
    /// poison record was not sent yet.
    Poisoning,
}

/// What a delivery of the message `message`, of generation `generation`
/// (moved from `moved_from`), does by the job's `record` (see the module
/// documentation).
pub fn arrival(
    record: Option<&LaneRecord>,
    generation: u32,
    message: &str,
    moved_from: Option<&str>,
) -> Arrival {
    let Some(record) = record else {
        return Arrival::Claim;
    };
    if record.finished {
        // A copy of the finished job (a later generation, its first
        // message, the message that finished it) is stale; a new first
        // message is the job asked for anew.
        let copy = generation > 0 || message == record.origin || message == record.message;
        return if copy { Arrival::Stale } else { Arrival::Claim };
    }
    if record.poisoned {
        if message == record.message {
            return Arrival::Poisoning;
        }
        return if copy_of_poisoned(record, generation, message, moved_from) {
            Arrival::Stale
        } else {
            Arrival::Claim
        };
    }
    if record.generation > generation {
        return Arrival::Stale;
    }
    if record.generation < generation {
        return Arrival::Claim;
    }
    if record.message == message {
        return match record.moving {
            Some(to) => Arrival::CompleteMove(to),
            None => Arrival::Run,
        };
    }
    // The same generation, claimed by another message: a second copy sent
    // by the same move is stale. Anything else (the job enqueued again, a
    // poison record requeued) is a job asked for anew: it takes over, and
    // the checkpoint's fencing keeps one of them at a time.
    match (moved_from, record.moved_from.as_deref()) {
        (Some(mine), Some(theirs)) if mine == theirs => Arrival::Stale,
        _ => Arrival::Claim,
    }
}

/// Whether a message other than its live one is a copy of the job a
/// `record` marked poisoned: a generation older than the live message's,
/// the job's first, a second copy of the move that sent the live one, or a
/// copy a late mover sent on from it.
/// A requeue of its poison record (moved from it, its generation) is not.
fn copy_of_poisoned(
    record: &LaneRecord,
    generation: u32,
    message: &str,
    moved_from: Option<&str>,
) -> bool {
    let sibling = generation == record.generation
        && moved_from.is_some()
        && moved_from == record.moved_from.as_deref();
    let sent_on = generation > record.generation && moved_from == Some(record.message.as_str());
    // A first message (generation 0) other than the job's own is the job
    // enqueued anew, as for a finished job.
    let older = generation > 0 && generation < record.generation;
    older || message == record.origin || sibling || sent_on
}

/// Whether a mover holding receive `held` of `message` may move it, by
/// the job's `record`: not once a later receive of the same message
/// claimed it (the mover's hold ran out and that receive runs the job).
pub fn may_move(record: Option<&LaneRecord>, message: &str, held: u32) -> bool {
    match record {
        Some(record) if record.message == message => record.held <= held,
        _ => true,
    }
}

/// What a delivery of `message` that is being poisoned does to the job's
/// record (as `read`).
#[derive(Clone, Debug, PartialEq)]
pub enum Tombstone {
    /// Write this tombstone.
    Write(LaneRecord),
    /// The record is this message's tombstone already.
    Written,
    /// The message is an old copy, not the job's live one: the record is
    /// left as it is, and the job lives on in the copy that claimed it.
    Superseded,
}

/// The tombstone a delivery of `message` that is being poisoned leaves in
/// the job's record (as `read`); see [`Tombstone`].
pub fn poisoned_record(
    read: Option<&LaneRecord>,
    message: &str,
    envelope: &Envelope,
    lane: Lane,
    held: u32,
) -> Tombstone {
    let live = match arrival(
        read,
        envelope.generation,
        message,
        envelope.moved_from.as_deref(),
    ) {
        Arrival::Stale => return Tombstone::Superseded,
        Arrival::Poisoning => return Tombstone::Written,
        Arrival::Run | Arrival::CompleteMove(_) => read.cloned(),
        Arrival::Claim => None,
    };
    let mut record =
        live.unwrap_or_else(|| LaneRecord::claimed_by(message, envelope, lane, held, read));
    record.poisoned = true;
    record.moving = None;
    record.updated_at = OffsetDateTime::now_utc();
    Tombstone::Write(record)
}

/// A record as read, with the ETag its next write is fenced by.
#[derive(Clone, Debug)]
pub struct ReadRecord {
    /// The record, if the job has one.
    pub record: Option<LaneRecord>,
    /// The ETag it was read at (none when there is no record).
    pub etag: Option<ETag>,
}

/// Lane records in a checkpoint store.
#[derive(Clone, Debug)]
pub struct LaneRecords {
    store: Arc<dyn CheckpointStore>,
}

impl LaneRecords {
    /// The records in `store`.
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        LaneRecords { store }
    }

    /// The checkpoint store the records are kept in (the jobs' own
    /// checkpoints are there too).
    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.store
    }

    /// The checkpoint key of `job`'s record.
    pub fn key(job: &str) -> String {
        format!("{LANE_RECORD_PREFIX}{job}")
    }

    /// `job`'s record, if it has one.
    pub async fn read(&self, job: &str) -> Result<Option<LaneRecord>, StorageError> {
        Ok(self.read_fenced(job).await?.record)
    }

    /// `job`'s record with the ETag its next write is fenced by.
    pub async fn read_fenced(&self, job: &str) -> Result<ReadRecord, StorageError> {
        let key = Self::key(job);
        Ok(match Self::document(&key).read(&*self.store).await? {
            Some((record, etag)) => ReadRecord {
                record: Some(record),
                etag: Some(etag),
            },
            None => ReadRecord {
                record: None,
                etag: None,
            },
        })
    }

    /// The record under `key`, for errors about it.
    fn document(key: &str) -> FencedJson<'_> {
        FencedJson {
            key,
            what: "lane record",
            kind: "a lane record",
        }
    }

    /// Replaces what `read` read with `record`, fenced by its ETag (or
    /// create-only if there was none); a conflict is
    /// [`StorageError::Conflict`]. Returns the new ETag.
    pub async fn write(
        &self,
        job: &str,
        read: &ReadRecord,
        record: &LaneRecord,
    ) -> Result<ETag, StorageError> {
        let key = Self::key(job);
        Self::document(&key)
            .write(&*self.store, read.etag.as_ref(), record)
            .await
    }

    /// Deletes `job`'s record.
    #[cfg(test)]
    pub async fn delete(&self, job: &str) -> Result<(), StorageError> {
        self.store.delete(&Self::key(job)).await
    }

    /// Marks `job`'s record poisoned by `message` (see [`poisoned_record`]),
    /// over whatever it holds now: true once it is, false if `message` is
    /// an old copy of the job (the record is left as it is).
    pub async fn poison(
        &self,
        job: &str,
        message: &str,
        envelope: &Envelope,
        lane: Lane,
        held: u32,
    ) -> Result<bool, StorageError> {
        for _ in 0..4 {
            let read = self.read_fenced(job).await?;
            let record = match poisoned_record(read.record.as_ref(), message, envelope, lane, held)
            {
                Tombstone::Write(record) => record,
                Tombstone::Written => return Ok(true),
                Tombstone::Superseded => return Ok(false),
            };
            match self.write(job, &read, &record).await {
                Ok(_) => return Ok(true),
                Err(StorageError::Conflict { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StorageError::Conflict {
            key: Self::key(job),
        })
    }

    /// Marks `job`'s record finished (its copies are stale from now on),
    /// over whatever it holds now.
    pub async fn finish(&self, job: &str) -> Result<(), StorageError> {
        for _ in 0..4 {
            let read = self.read_fenced(job).await?;
            let Some(mut record) = read.record.clone() else {
                return Ok(());
            };
            record.finished = true;
            record.moving = None;
            record.updated_at = OffsetDateTime::now_utc();
            match self.write(job, &read, &record).await {
                Ok(_) => return Ok(()),
                Err(StorageError::Conflict { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StorageError::Conflict {
            key: Self::key(job),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        generation: u32,
        message: &str,
        moved_from: Option<&str>,
        moving: Option<Lane>,
    ) -> LaneRecord {
        LaneRecord {
            generation,
            message: message.to_owned(),
            moved_from: moved_from.map(str::to_owned),
            origin: "m".to_owned(),
            finished: false,
            poisoned: false,
            held: 1,
            lane: Lane::Spot,
            moving,
            start: OffsetDateTime::UNIX_EPOCH,
            deadline: OffsetDateTime::UNIX_EPOCH,
            work_s: 1.0,
            updated_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_delivery_runs_claims_completes_a_move_or_is_stale() {
        use Arrival::*;
        let r = Some(record(1, "n", Some("m"), None));
        let moving = Some(record(1, "n", Some("m"), Some(Lane::Regular)));
        let finished = Some(LaneRecord {
            finished: true,
            ..record(1, "n", Some("m"), None)
        });
        let poisoned = Some(LaneRecord {
            poisoned: true,
            ..record(1, "n", Some("m"), None)
        });
        // (record, message generation, message id, moved from, verdict)
        type Row<'a> = (Option<LaneRecord>, u32, &'a str, Option<&'a str>, Arrival);
        let rows: Vec<Row<'_>> = vec![
            // The first delivery of a job claims it.
            (None, 0, "m", None, Claim),
            // Its redeliveries run.
            (Some(record(0, "m", None, None)), 0, "m", None, Run),
            // The message a move sent claims the newer generation, even if
            // the mover died before deleting the old one...
            (
                Some(record(0, "m", None, Some(Lane::Regular))),
                1,
                "n",
                Some("m"),
                Claim,
            ),
            // ... which is then stale.
            (r.clone(), 0, "m", None, Stale),
            // A second copy of the same move is stale too.
            (r.clone(), 1, "n2", Some("m"), Stale),
            (r.clone(), 1, "n", Some("m"), Run),
            // The live message whose move was begun finishes it.
            (
                moving.clone(),
                1,
                "n",
                Some("m"),
                CompleteMove(Lane::Regular),
            ),
            // A copy of an older move's generation is stale.
            (
                Some(record(3, "q", Some("p"), None)),
                2,
                "p",
                Some("n"),
                Stale,
            ),
            // The job enqueued anew (or a poison record requeued) takes
            // over the same generation.
            (Some(record(0, "m", None, None)), 0, "m2", None, Claim),
            (r.clone(), 1, "x", Some("other"), Claim),
            (r.clone(), 1, "x", None, Claim),
            // Once the job finished, its copies are stale: a second copy
            // of its last move, its first message, the message that
            // finished it; a new first message is the job asked for anew.
            (finished.clone(), 1, "n2", Some("m"), Stale),
            (finished.clone(), 0, "m", None, Stale),
            (finished.clone(), 1, "n", Some("m"), Stale),
            (finished.clone(), 3, "z", Some("y"), Stale),
            (finished, 0, "m3", None, Claim),
            // Once the job was poisoned, its copies are stale too: an older
            // generation, the job's first, a second
            // copy of the move that sent it, a copy a late mover sent on
            // from it. Its poison record requeued (moved from the poisoned
            // message, its generation) and the job enqueued anew are not.
            (poisoned.clone(), 0, "m", None, Stale),
            (poisoned.clone(), 1, "n2", Some("m"), Stale),
            (poisoned.clone(), 2, "o", Some("n"), Stale),
            (poisoned.clone(), 1, "r", Some("n"), Claim),
            (poisoned.clone(), 0, "m4", None, Claim),
            // The poisoned message itself is neither run nor discarded as
            // a copy: its poisoning is finished (its record may not have
            // been sent yet).
            (poisoned, 1, "n", Some("m"), Poisoning),
        ];
        for (record, generation, message, moved_from, expected) in rows {
            assert_eq!(
                arrival(record.as_ref(), generation, message, moved_from),
                expected,
                "{record:?} / generation {generation}, {message}, from {moved_from:?}"
            );
        }
    }

    #[test]
    fn a_mover_holding_an_earlier_receive_of_the_live_message_does_not_move_it() {
        let live = record(0, "m", None, None);
        // (record, mover's message, mover's receive, may move)
        let rows = [
            (None, "m", 1, true),
            (Some(&live), "m", 1, true),
            (Some(&live), "m", 2, true),
            (Some(&live), "m", 0, false),
            // Another message's record: the generations decide, not this.
            (Some(&live), "x", 0, true),
        ];
        for (record, message, held, expected) in rows {
            assert_eq!(
                may_move(record, message, held),
                expected,
                "{record:?} / {message} receive {held}"
            );
        }
    }

    #[test]
    fn a_poisoned_live_message_leaves_a_tombstone_and_an_old_copy_leaves_none() {
        let envelope = |generation: u32, moved_from: Option<&str>| Envelope {
            deadline: spot_worker_decisions::lanes::Deadline {
                start: SystemTime::UNIX_EPOCH,
                due: SystemTime::UNIX_EPOCH,
                work: std::time::Duration::from_secs(1),
            },
            generation,
            key: Some("j".into()),
            lane: Some(Lane::Spot),
            moved_from: moved_from.map(str::to_owned),
            carried: Default::default(),
        };
        let live = record(1, "n", Some("m"), None);
        // The live message: its record, marked.
        let Tombstone::Write(tomb) =
            poisoned_record(Some(&live), "n", &envelope(1, Some("m")), Lane::Spot, 5)
        else {
            panic!("a tombstone");
        };
        assert!(tomb.poisoned && tomb.message == "n" && tomb.generation == 1);
        // Marked again (a later delivery finishing its poisoning): done.
        assert_eq!(
            poisoned_record(Some(&tomb), "n", &envelope(1, Some("m")), Lane::Spot, 6),
            Tombstone::Written
        );
        // An old copy poisoned: the live record stays as it is.
        assert_eq!(
            poisoned_record(Some(&live), "m", &envelope(0, None), Lane::Spot, 9),
            Tombstone::Superseded
        );
        // No record yet: one made for the poisoned message.
        let Tombstone::Write(fresh) =
            poisoned_record(None, "m", &envelope(0, None), Lane::Regular, 3)
        else {
            panic!("a tombstone");
        };
        assert!(fresh.poisoned && fresh.message == "m" && fresh.held == 3);
        // A stale copy of the tombstone's job leaves it as it is.
        assert_eq!(
            poisoned_record(Some(&tomb), "n2", &envelope(1, Some("m")), Lane::Spot, 1),
            Tombstone::Superseded
        );
    }

    #[tokio::test]
    async fn records_are_written_fenced_and_read_back() {
        let store: Arc<dyn CheckpointStore> =
            Arc::new(spot_worker_storage::InMemoryCheckpointStore::new());
        let records = LaneRecords::new(store);
        let first = records.read_fenced("j1").await.unwrap();
        assert!(first.record.is_none());
        let mine = record(0, "m", None, None);
        records.write("j1", &first, &mine).await.unwrap();
        // A second writer from the same read loses.
        let err = records.write("j1", &first, &mine).await.unwrap_err();
        assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
        let read = records.read_fenced("j1").await.unwrap();
        assert_eq!(read.record.as_ref(), Some(&mine));
        let moving = LaneRecord {
            moving: Some(Lane::Regular),
            ..mine
        };
        records.write("j1", &read, &moving).await.unwrap();
        assert_eq!(records.read("j1").await.unwrap(), Some(moving));
        records.finish("j1").await.unwrap();
        let finished = records.read("j1").await.unwrap().unwrap();
        assert!(finished.finished && finished.moving.is_none());
        records.delete("j1").await.unwrap();
        assert_eq!(records.read("j1").await.unwrap(), None);
        assert_eq!(LaneRecords::key("j1"), ".spot-worker/lanes/j1");
    }
}
