//! The end of a delivery: what [`settle`] decides once its handler has
//! stopped (or never started), carried out under the lease: delete,
//! release, wait for a peer or the store, retry, poison, or leave it.

use crate::cadence::Interruption;
use crate::checkpoint::CheckpointNotes;

use super::Consumer;
use super::attempts::ReadAttempts;
use super::backoff::retry_delay;
use super::delivery::Delivery;
use super::outcome::DeliveryOutcome;
use super::settlement::{Departure, Ending, PoisonCause, Settlement, settle};
use super::signals::DrainSignals;

impl Consumer {
    /// Decides and carries out the settlement of a delivery whose handler
    /// has stopped (or never started).
    pub(super) async fn finish(
        &self,
        mut delivery: Delivery,
        signals: &DrainSignals,
        ending: Ending<'_>,
        notes: &CheckpointNotes,
        earlier: ReadAttempts,
    ) {
        // Claimed before the stage is looked at: a note not started now
        // never starts, so nothing below races it for the record.
        let noting = delivery.note.close();
        let shutting_down = signals.wind_down.is_cancelled();
        let lease_lost = delivery.lease.is_lost();
        let store_unreachable = notes.unreachable.get();
        // The record is read when it decides something: after a failure that
        // is not shutdown's doing, while its store can be reached.
        let record = if matches!(ending, Ending::Failed { .. })
            && !shutting_down
            && !lease_lost
            && store_unreachable.is_none()
        {
            self.read_attempts(&delivery).await
        } else {
            earlier
        };
        let departure = Departure {
            ending,
            lease_lost,
            shutting_down,
            fenced_by_peer: notes.fenced_on_own_key(),
            store_unreachable: store_unreachable.is_some(),
            attempts: &record.attempts,
        };
        match settle(&departure, self.limits()) {
            Settlement::Poison(cause) => {
                let failures = match &cause {
                    PoisonCause::Failed { failures, .. } => *failures,
                    _ => record.attempts.failures,
                };
                self.poison(delivery, cause, failures).await;
            }
            Settlement::Retry { attempts } => {
                self.record_attempts(&delivery, &record, &attempts).await;
                let delay = self.backoff(attempts.failures);
                tracing::warn!(error = attempts.last_error.as_deref().unwrap_or_default(), failures = attempts.failures, retry_in = ?delay, "handler failed; will retry");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    self.settled(DeliveryOutcome::Retried);
                }
            }
            Settlement::WaitForPeer { attempts } => {
                self.record_attempts(&delivery, &record, &attempts).await;
                let delay = self.backoff(attempts.waits);
                tracing::info!(retry_in = ?delay, waits = attempts.waits, "another holder of this job wrote newer progress; checking again later (not a failure)");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    self.settled(DeliveryOutcome::WaitedForPeer);
                }
            }
            Settlement::WaitForStore => {
                let delay = self.backoff(delivery.message.dequeue_count);
                tracing::warn!(error = store_unreachable.map(String::as_str).unwrap_or_default(), retry_in = ?delay, "the checkpoint store could not be reached; trying the message again later (not a failure)");
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery)
                    && self.make_visible_after(&delivery.lease, delay).await
                {
                    self.settled(DeliveryOutcome::WaitedForStore);
                }
            }
            Settlement::Delete => {
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
                    self.settled(DeliveryOutcome::Succeeded);
                    tracing::debug!("handled and deleted");
                    self.forget_attempts(&mut delivery).await;
                    self.remove_leftover(&delivery).await;
                }
            }
            Settlement::Release => {
                // An interruption of a running job: drained in time if the
                // handler returned (it saved), too late if it was dropped.
                if delivery.handler_started {
                    self.cadence.note(match departure.ending {
                        Ending::Dropped => Interruption::Late,
                        _ => Interruption::Drained,
                    });
                }
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) {
                    self.release_noted(&mut delivery, noting, signals).await;
                }
            }
            Settlement::Leave(why) => {
                delivery.stop_renewing().await;
                if delivery.lease.is_lost() {
                    self.settled(DeliveryOutcome::LeaseLost);
                    tracing::warn!("{why}; nothing written");
                } else {
                    tracing::error!("{why}; leaving the message to its visibility timeout");
                }
            }
        }
    }

    /// Whether the lease survived until settling; counts it if not.
    pub(super) fn settled_lease(&self, delivery: &Delivery) -> bool {
        if delivery.lease.is_lost() {
            self.settled(DeliveryOutcome::LeaseLost);
            tracing::warn!(
                "lease lost before settling; the message belongs to another consumer now"
            );
            return false;
        }
        true
    }

    /// The retry delay after the `n`th recorded failure or wait.
    pub(super) fn backoff(&self, n: u32) -> std::time::Duration {
        retry_delay(
            self.config.retry_backoff_base,
            self.config.retry_backoff_max,
            n,
        )
    }

    /// Deletes a message whose job is completed, without running it.
    pub(super) async fn delete_completed(&self, mut delivery: Delivery) {
        delivery.stop_renewing().await;
        if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
            self.settled(DeliveryOutcome::SkippedCompleted);
            tracing::info!("the job is completed already; deleted without running it");
            self.forget_attempts(&mut delivery).await;
            self.remove_leftover(&delivery).await;
        }
    }
}
