//! What a delivery of a job with a deadline carries ([`LaneDelivery`]): its
//! envelope and body, what its lane plugin keeps between calls (the lanes:
//! the lane record as they last read or wrote it), and a move the running
//! check asked for; and what the lane record lets the
//! delivery do ([`LaneStart`]). The steps that use them are in
//! [`lane_delivery`](super::lane_delivery).

use std::sync::{Mutex, PoisonError};

use spot_worker_decisions::lanes::{Lane, Reason};
use spot_worker_envelope::Envelope;
use spot_worker_storage::{QueueMessage, StorageError};

use super::lane_plugin::{LaneJob, LaneMemo};

/// What a delivery knows of its job's deadline and lane.
#[derive(Debug)]
pub(crate) struct LaneDelivery {
    /// The envelope the message carries.
    pub(crate) envelope: Envelope,
    /// The body the handler reads (a move sends it on).
    pub(crate) body: Vec<u8>,
    /// What the lane plugin keeps for this delivery.
    memo: LaneMemo,
    /// A move the running check asked for: where, and why.
    requested: Mutex<Option<(Lane, Reason)>>,
}

impl LaneDelivery {
    pub(crate) fn new(envelope: Envelope, body: Vec<u8>) -> Self {
        LaneDelivery {
            envelope,
            body,
            memo: LaneMemo::default(),
            requested: Mutex::new(None),
        }
    }

    /// The move the running check asked for, if any.
    pub(crate) fn requested(&self) -> Option<(Lane, Reason)> {
        *self
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn request(&self, to: Lane, reason: Reason) {
        *self
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((to, reason));
    }

    /// The lane plugin's view of this delivery of job `key` by `message`.
    pub(crate) fn job<'a>(&'a self, key: &'a str, message: &'a QueueMessage) -> LaneJob<'a> {
        LaneJob {
            key,
            message: &message.id,
            held: message.dequeue_count,
            envelope: &self.envelope,
            body: &self.body,
            memo: &self.memo,
        }
    }
}

/// What the lane record lets a delivery do.
pub(super) enum LaneStart {
    /// Run the handler.
    Run,
    /// Settled without running (an old copy deleted, a move finished).
    Settled,
    /// The record could not be read or written: the store is down.
    StoreDown(StorageError),
    /// The record is this message's tombstone: an earlier delivery began
    /// poisoning it; finish that, never run it.
    Poisoning,
}
