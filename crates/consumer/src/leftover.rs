//! Removing what a delivery left under its job's own checkpoint key once
//! the job has succeeded (what is left, and whether it goes, is
//! [`Leftover`](spot_worker_storage::Leftover) in the store).

use super::Consumer;
use super::in_flight::Delivery;

impl Consumer {
    /// Deletes the job's checkpoint after its message was deleted, if one
    /// is left that nobody can use (see [`remove_after_success`]). A
    /// failure is logged and left to the retention rule.
    pub(super) async fn remove_leftover(&self, delivery: &Delivery) {
        let (Some(store), leftover) = (&self.checkpoints, &delivery.leftover) else {
            return;
        };
        // The chunks of its files first: the checkpoint names them.
        if let Some((chunks, names)) = leftover.take_files() {
            // The job is done: it resumes nothing, whoever restores.
            let _ = spot_worker_storage::spawn_removal(chunks, names);
        }
        if leftover.remove_after_success() {
            let removed = self
                .settle_call(
                    "delete the finished job's checkpoint",
                    store.delete(leftover.key()),
                )
                .await;
            if removed.is_some() {
                tracing::debug!(
                    key = leftover.key(),
                    "the finished job's checkpoint is removed"
                );
            }
        }
    }
}
