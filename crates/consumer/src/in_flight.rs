//! A delivery in flight ([`Delivery`]): everything one delivery holds while
//! it is processed, which each step (the pre-checks, the lane, the handler,
//! the finish) reads and writes; the steps themselves live in their rooms.

use std::sync::Arc;

use spot_worker_storage::{Leftover, QueueMessage, SaveClock};
use tokio_util::sync::CancellationToken;

use super::lane_state::LaneDelivery;
use super::lease::{Lease, Renewal};
use super::release_note::ReleaseNote;

/// Everything one delivery holds while it is processed.
pub(super) struct Delivery {
    pub(super) message: QueueMessage,
    pub(super) lease: Arc<Lease>,
    /// The handler's token: cancelled by wind-down, release or a lost lease.
    pub(super) job_token: CancellationToken,
    /// The job's own checkpoint as this delivery knows it, removed after a
    /// success when nobody can use it.
    pub(super) leftover: Arc<Leftover>,
    pub(super) renewal: Option<Renewal>,
    /// Cancelled at the release stage: from then on settling no longer
    /// waits for a renewal in flight.
    pub(super) hurry: CancellationToken,
    /// Records a release on shutdown in the attempt record.
    pub(super) note: ReleaseNote,
    /// Where this delivery's time went (see [`spot_worker_decisions::goodput`]).
    pub(super) clock: Arc<SaveClock>,
    /// Whether the handler was started: only then can its release be an
    /// interruption of work (see `cadence`).
    pub(super) handler_started: bool,
    /// The job's deadline and lane, for a message that carries one.
    pub(super) lane: Option<Arc<LaneDelivery>>,
}

impl Delivery {
    /// Stops renewing the lease. A renewal in flight is waited for, so the
    /// settling call uses the pop receipt it brings (a job that finished
    /// while the worker winds down is then deleted, not redelivered), but
    /// only until the release stage: then it is abandoned at once. (The
    /// job's token is no use here: wind-down has cancelled it already.)
    pub(super) async fn stop_renewing(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop(&self.hurry).await;
        }
    }
}

/// Aborts a handler's task when the delivery lets go of it.
pub(super) struct AbortOnDrop(pub(super) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
