//! The seam through which lanes plug into the consumer ([`LanePlugin`]),
//! owned here as tower owns `Layer`: the consumer knows that a job with a
//! deadline may be claimed, moved, checked while it runs and marked when
//! it ends, and asks its plugin each time; how (the lane records, the
//! mover, the rule, Spot capacity) is the plugin's. `spot-worker-lanes`
//! implements it for its `Lanes`.
//!
//! The consumer keeps every step of its own: the loop around a claim, the
//! delete and its count, the attempt record, the lease, the checkpoint
//! interval. A plugin gets a view of the delivery ([`LaneJob`]) and a slot
//! for what it keeps between its calls ([`LaneMemo`]), and answers with
//! what the consumer does next ([`Claim`], [`LaneMove`]).

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use spot_worker_decisions::lanes::{Deadline, Lane, Reason};
use spot_worker_envelope::{Carried, Envelope};
use spot_worker_storage::{CheckpointStore, MessageEncoding, MessageId, SaveClock, StorageError};
use tokio_util::sync::CancellationToken;

/// Lanes, as the consumer sees them: see the module doc. Every call gets
/// what it needs from the consumer as arguments; a plugin keeps nothing of
/// a delivery but what it puts in the delivery's [`LaneMemo`].
#[async_trait]
pub trait LanePlugin: LaneFinish {
    /// The lane whose queue this consumer serves.
    fn lane(&self) -> Lane;

    /// A probe for Spot capacity came to this worker (of the Spot lane):
    /// tell the fleet. The consumer deletes the probe once this succeeds.
    async fn took_probe(&self) -> Result<(), StorageError>;

    /// One try at claiming the job for this delivery before its handler
    /// runs, by the job's lane record in `store`: run it, try again, or
    /// settle it without running. Logs what the consumer does not.
    async fn claim(&self, store: &Arc<dyn CheckpointStore>, job: &LaneJob<'_>) -> Claim;

    /// Moves the job to lane `to` (writes the intent, sends the new message
    /// carrying `carried`), within `how.settle_timeout`; the consumer then
    /// deletes the held message unless it [`LaneMove::Stayed`]. Logs the
    /// outcome.
    async fn move_job(
        &self,
        store: &Arc<dyn CheckpointStore>,
        how: MoveSettings,
        job: &LaneJob<'_>,
        to: Lane,
        carried: Carried,
    ) -> LaneMove;

    /// While the job runs, a check that ends with the lane it should move
    /// to, and why (once it has asked its handler to stop, the consumer
    /// moves it); `None` if it never needs one here. It ends, with `None`,
    /// when `token` is cancelled.
    fn watch_running(
        &self,
        deadline: Deadline,
        clock: Arc<SaveClock>,
        token: CancellationToken,
        encoding: MessageEncoding,
    ) -> Option<BoxFuture<'static, Option<(Lane, Reason)>>>;

    /// The lane a job let go (released) goes to, from its progress as of
    /// its last save. Logs the rule's answer.
    fn lane_at_release(&self, deadline: Deadline, clock: &SaveClock) -> Lane;

    /// Marks the job being poisoned poisoned (a tombstone): true once it
    /// is, false if this message is an old copy of the job.
    async fn poison(
        &self,
        store: &Arc<dyn CheckpointStore>,
        job: &LaneJob<'_>,
    ) -> Result<bool, StorageError>;

    /// What one part of a switch between lanes took, measured by the
    /// consumer.
    fn sample(&self, part: SwitchPart, took: Duration);
}

/// The one lane step a worker takes whether it serves a lane or not: a job
/// with a deadline that finishes there is marked finished, so that a copy
/// of it a worker with lanes left behind is discarded unrun. Every
/// [`LanePlugin`] is one; a worker without lanes is given one of its own
/// ([`Consumer::with_lane_finish`](super::Consumer::with_lane_finish)).
#[async_trait]
pub trait LaneFinish: Send + Sync + 'static {
    /// Marks the job `key` finished: a copy of it that turns up later is
    /// discarded unrun.
    async fn finish(&self, store: &Arc<dyn CheckpointStore>, key: &str)
    -> Result<(), StorageError>;
}

/// One delivery of a job with a deadline, as the consumer shows it to its
/// [`LanePlugin`].
#[derive(Clone, Copy)]
pub struct LaneJob<'a> {
    /// The job's key.
    pub key: &'a str,
    /// The message delivered.
    pub message: &'a MessageId,
    /// Which receive of it this delivery is (its dequeue count).
    pub held: u32,
    /// The envelope it carries.
    pub envelope: &'a Envelope,
    /// The body the handler reads (a move sends it on).
    pub body: &'a [u8],
    /// What the plugin keeps for this delivery between its calls.
    pub memo: &'a LaneMemo,
}

/// What a [`LanePlugin`] keeps for one delivery between its calls (the
/// lanes keep the job's lane record as they last read or wrote it, so
/// that a move is fenced by it): one value of any type, empty at first.
#[derive(Default)]
pub struct LaneMemo(Mutex<Option<Box<dyn Any + Send>>>);

impl LaneMemo {
    /// Keeps `value`, in place of what was kept.
    pub fn set<T: Any + Send>(&self, value: T) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(value));
    }

    /// Takes what was kept, if it is a `T`; the memo is empty after.
    pub fn take<T: Any + Send>(&self) -> Option<T> {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        kept.downcast::<T>().ok().map(|value| *value)
    }
}

impl std::fmt::Debug for LaneMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("LaneMemo").field("kept", &kept).finish()
    }
}

/// What a try at claiming a job tells the consumer to do.
#[derive(Debug)]
pub enum Claim {
    /// Run the handler: the job is this delivery's (or its record could not
    /// be used, which the plugin logged).
    Run,
    /// Another write to the record came first: try again.
    Conflict,
    /// A later receive of this message claimed the job: this delivery's
    /// hold ran out before it started. Run nothing, settle nothing.
    LaterReceive,
    /// An old copy of the job (of a `poisoned` one: it stays poisoned):
    /// delete it unrun.
    Stale {
        /// Whether the job it is a copy of was poisoned.
        poisoned: bool,
    },
    /// The record is this message's tombstone: an earlier delivery began
    /// poisoning it; finish that, never run it.
    Poisoning,
    /// A move of the job to this lane was begun and not finished: finish
    /// it, then look again if it could not be.
    CompleteMove(Lane),
    /// The record could not be read or written: the store is down.
    StoreDown(StorageError),
}

/// How a move a [`LanePlugin`] was asked for ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneMove {
    /// The new message is in the other lane's queue: delete the held one.
    Moved,
    /// The held message turned out to be an old copy: delete it unrun.
    Superseded,
    /// Nothing was sent: the held message stays the job's, in its lane.
    Stayed,
}

/// What a move needs of the consumer's settings.
#[derive(Clone, Copy, Debug)]
pub struct MoveSettings {
    /// How the queues encode message bodies.
    pub encoding: MessageEncoding,
    /// How long a settling call may take.
    pub settle_timeout: Duration,
}

/// A part of what a switch between lanes costs a job, as a delivery
/// measures it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchPart {
    /// From release until a worker takes the job.
    QueueWait,
    /// From the receive until the handler starts.
    StartUp,
    /// Reading the checkpoint back.
    Restore,
    /// Work lost by the interruption, done again.
    LostWork,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_gives_back_what_it_kept_once_and_only_as_its_type() {
        let memo = LaneMemo::default();
        assert_eq!(memo.take::<u32>(), None);
        memo.set(7_u32);
        memo.set(8_u32);
        assert_eq!(memo.take::<u32>(), Some(8));
        assert_eq!(memo.take::<u32>(), None, "taken once");
        memo.set("text");
        assert_eq!(memo.take::<u32>(), None, "another type is not a u32");
        assert_eq!(memo.take::<&str>(), None, "and a wrong take empties it");
    }
}
