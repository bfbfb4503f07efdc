//! Probes for Spot capacity ([`PROBE_BODY`]; the fleet's view of its Spot
//! capacity is the lane plugin's): a regular worker whose job waits for
//! Spot sends one to the Spot lane, and the Spot worker the pool starts
//! for it takes it here, before anything else a delivery does, and tells
//! its plugin ([`LanePlugin::took_probe`](super::LanePlugin::took_probe)).

use spot_worker_decisions::lanes::Lane;

use spot_worker_storage::PROBE_BODY;
use spot_worker_storage::QueueMessage;

use super::{Consumer, DeliveryOutcome};

impl Consumer {
    /// Whether `message` is a probe for Spot capacity
    /// ([`PROBE_BODY`]), on a worker with lanes.
    pub(super) fn is_probe(&self, message: &QueueMessage) -> bool {
        self.lanes.is_some()
            && self
                .config
                .encoding
                .decode(&message.body)
                .is_ok_and(|body| body == PROBE_BODY)
    }

    /// A probe asked the Spot pool for a worker, and this one came: it
    /// says so to the fleet (a regular worker whose job waits for Spot
    /// then releases it here) and deletes the probe. Nothing runs. A
    /// failure is logged: the probe comes back after its hold, or expires.
    pub(super) async fn take_probe(&self, message: &QueueMessage) {
        let Some(lanes) = &self.lanes else {
            return;
        };
        if lanes.lane() == Lane::Spot {
            match lanes.took_probe().await {
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(%error, "a probe for Spot capacity came, but saying so to the fleet failed");
                    return;
                }
            }
        }
        if let Err(error) = self.queue.delete(&message.id, &message.pop_receipt).await {
            tracing::warn!(%error, "deleting a probe for Spot capacity failed; it comes back or expires");
            return;
        }
        // Never silent: a producer's body that reads as a probe (they are
        // refused at enqueue, but not every producer is ours) shows here
        // and in the `probe_taken` count.
        self.settled(DeliveryOutcome::ProbeTaken);
        tracing::info!(
            lane = lanes.lane().as_str(),
            queue = self.queue.name(),
            message_id = %message.id,
            dequeue_count = message.dequeue_count,
            inserted_at = ?message.inserted_at,
            "a probe for Spot capacity came: deleted unrun"
        );
    }
}
