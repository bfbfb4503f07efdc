//! Deliveries that ended with no outcome (a crash, a SIGKILL, a lost VM, a
//! lease lost, a release whose note came too late), counted once each for
//! the checkpoint interval: they are the interruptions no notice saved
//! (see [`cadence`](crate::cadence)).
//!
//! Nobody is left to count such a delivery when it ends, so the next
//! delivery of the message counts it: a redelivery reads the message's
//! attempt record (the crash-loop guard's, one read), works out how many
//! earlier deliveries left no outcome, and counts those not counted before,
//! marking them counted in the record (one write, only when there are any).
//! A first delivery costs nothing. A mark that cannot be written leaves
//! them for the next delivery to count: counted late, never twice.

use crate::cadence::Interruption;

use super::Consumer;
use super::attempts::{Attempts, ReadAttempts};
use super::delivery::Delivery;

impl Consumer {
    /// Counts the earlier deliveries without an outcome that `read` (this
    /// delivery's read of the record) shows and nobody counted yet;
    /// returns the record as it stands afterwards.
    pub(super) async fn count_no_outcome(
        &self,
        delivery: &Delivery,
        read: ReadAttempts,
    ) -> ReadAttempts {
        let earlier = delivery.message.dequeue_count.saturating_sub(1);
        let without_outcome = read.attempts.unexplained(earlier);
        let uncounted = without_outcome.saturating_sub(read.attempts.no_outcome_counted);
        if uncounted == 0 {
            return read;
        }
        let marked = Attempts {
            no_outcome_counted: without_outcome,
            ..read.attempts.clone()
        };
        let rewrite = self.attempts.rewrite(&delivery.message.id, &read, &marked);
        match tokio::time::timeout(self.note_deadline(), rewrite).await {
            Ok(Ok(now)) => {
                for _ in 0..uncounted {
                    self.cadence.note(Interruption::NoOutcome);
                }
                tracing::debug!(
                    uncounted,
                    "earlier deliveries ended with no outcome; counted"
                );
                now
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not mark deliveries without an outcome counted; the next delivery counts them");
                read
            }
            Err(_) => {
                tracing::debug!(
                    "marking deliveries without an outcome counted timed out; the next delivery counts them"
                );
                read
            }
        }
    }
}
