//! Deliveries whose worker could not count their interruption itself,
//! counted once each for the checkpoint interval by the next delivery:
//! those that ended with no outcome (a crash, a SIGKILL, a lost VM, a lease
//! lost, a release whose note could not be written) and those whose
//! release was noted but never settled (a late notice whose worker was
//! killed before it released the message). They are the interruptions no
//! notice saved (see [`cadence`](spot_worker_decisions::cadence)); which is which is
//! [`interruption_kind`](super::interruption_kind).
//!
//! Nobody is left to count such a delivery when it ends, so the next
//! delivery of the message counts it: a redelivery reads the message's
//! attempt record (the crash-loop guard's, one read), works out how many
//! earlier deliveries of each kind nobody counted yet, and counts them,
//! marking them counted in the record (one write, only when there are any).
//! A first delivery costs nothing. A mark that cannot be written leaves
//! them for the next delivery to count: counted late, never twice.

use spot_worker_decisions::cadence::Interruption;

use super::Consumer;
use super::in_flight::Delivery;
use super::interruption_kind::uncounted;
use spot_worker_storage::attempts::{Attempts, ReadAttempts};

impl Consumer {
    /// Counts the earlier deliveries that `read` (this delivery's read of
    /// the record) shows their worker did not count, and nobody counted
    /// yet; returns the record as it stands afterwards.
    pub(super) async fn count_no_outcome(
        &self,
        delivery: &Delivery,
        read: ReadAttempts,
    ) -> ReadAttempts {
        let earlier = delivery.message.dequeue_count.saturating_sub(1);
        let uncounted = uncounted(&read.attempts, earlier);
        if uncounted.is_empty() {
            return read;
        }
        let marked = Attempts {
            no_outcome_counted: read
                .attempts
                .no_outcome_counted
                .saturating_add(uncounted.no_outcome),
            unsettled_counted: read
                .attempts
                .unsettled_counted
                .saturating_add(uncounted.late),
            ..read.attempts.clone()
        };
        let rewrite = self.attempts.rewrite(&delivery.message.id, &read, &marked);
        match tokio::time::timeout(self.note_deadline(), rewrite).await {
            Ok(Ok(now)) => {
                for _ in 0..uncounted.no_outcome {
                    self.cadence.note(Interruption::NoOutcome);
                }
                for _ in 0..uncounted.late {
                    self.cadence.note(Interruption::Late);
                }
                tracing::debug!(
                    no_outcome = uncounted.no_outcome,
                    late = uncounted.late,
                    "earlier deliveries their workers could not count; counted"
                );
                now
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not mark earlier deliveries counted; the next delivery counts them");
                read
            }
            Err(_) => {
                tracing::debug!(
                    "marking earlier deliveries counted timed out; the next delivery counts them"
                );
                read
            }
        }
    }
}
