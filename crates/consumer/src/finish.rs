//! The end of a delivery: what [`settle`] decides once its handler has
//! stopped (or never started), carried out under the lease: delete,
//! release, wait for a peer or the store, retry, poison, or leave it.

use std::time::Duration;

use spot_worker_decisions::cadence::Interruption;
use spot_worker_decisions::goodput::tail;

use spot_worker_storage::CheckpointNotes;

use super::Consumer;
use super::in_flight::Delivery;
use super::interruption_kind::own_release_uncounted;
use super::outcome::DeliveryOutcome;
use super::settlement::{Departure, Ending, Limits, PoisonCause, Settlement, settle};
use super::signals::DrainSignals;
use spot_worker_storage::attempts::ReadAttempts;
use spot_worker_storage::backoff::retry_delay;

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
        // A job on regular capacity that got ahead of its line was asked
        // to stop: it goes back to Spot, whatever it returned on the way
        // out (unless it finished, or failed for good).
        let stopped_for_lane = matches!(
            ending,
            Ending::Dropped
                | Ending::Failed {
                    permanent: false,
                    ..
                }
        );
        if let Some((to, _)) = delivery.lane.as_ref().and_then(|lane| lane.requested())
            && stopped_for_lane
            && !lease_lost
            && !shutting_down
        {
            if !self.move_on(&mut delivery, to, None).await {
                self.release_in_place(&mut delivery).await;
            }
            return;
        }
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
        match settle(&departure, self.limits_for(&delivery)) {
            Settlement::Poison(cause) => {
                let failures = match &cause {
                    PoisonCause::Failed { failures, .. } => *failures,
                    _ => record.attempts.failures,
                };
                self.poison(delivery, cause, failures).await;
            }
            Settlement::Retry { attempts } => {
                let attempts = attempts
                    .with_tail(&delivery_tail(&delivery))
                    .for_job(delivery.leftover.key());
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
                let attempts = attempts.with_tail(&delivery_tail(&delivery));
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
                    // Before the record (and the tails in it) is deleted.
                    self.job_finished(&delivery).await;
                    self.forget_attempts(&mut delivery).await;
                    self.remove_leftover(&delivery).await;
                    self.finish_lane(&delivery).await;
                }
            }
            Settlement::Release => {
                // An interruption of a running job, by what it lost: too
                // late if the handler was dropped; if it returned, saved at
                // the notice only if its last save holds data written after
                // it (a program's new version after its stop signal),
                // otherwise the work since that save is lost. Counted once
                // its settling is recorded (`record_tail`).
                let kind = delivery.handler_started.then(|| match departure.ending {
                    Ending::Dropped => Interruption::Late,
                    _ if signals
                        .noticed_at()
                        .is_some_and(|notice| delivery.clock.saved_since(notice)) =>
                    {
                        Interruption::Drained
                    }
                    _ => Interruption::Unsaved,
                });
                // A job with a deadline goes to the lane the rule picks.
                let own = self.lanes.as_ref().map(|lanes| lanes.lane());
                if let Some(to) = self.lane_at_release(&delivery)
                    && Some(to) != own
                {
                    if noting {
                        // Its record is forgotten with the move: let the
                        // note land first, so it cannot bring it back.
                        delivery.note.written().await;
                    }
                    if self.move_on(&mut delivery, to, kind).await {
                        return;
                    }
                }
                delivery.stop_renewing().await;
                if self.settled_lease(&delivery) {
                    self.release_noted(&mut delivery, noting, signals).await;
                }
                // After the release, never in front of it, and briefly: the
                // worker is shutting down.
                self.record_tail(&delivery, self.note_deadline(), Some(kind))
                    .await;
            }
            Settlement::Leave(why) => {
                delivery.stop_renewing().await;
                if delivery.lease.is_lost() {
                    self.settled(DeliveryOutcome::LeaseLost);
                    tracing::warn!("{why}; the message is left to it");
                    // The message is another delivery's now, but what this
                    // one lost is still this job's time; a lease lost to an
                    // outage gets a settle call's time for it.
                    self.record_tail(&delivery, self.config.settle_timeout, None)
                        .await;
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
            &*self.clock,
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
            self.finish_lane(&delivery).await;
        }
    }

    /// The limits for `delivery`: a job moved between lanes counts the
    /// failures its earlier messages recorded, which its envelope carries.
    pub(super) fn limits_for(&self, delivery: &Delivery) -> Limits {
        let carried = delivery
            .lane
            .as_ref()
            .map_or(0, |lane| lane.envelope.carried.failures);
        let limits = self.limits();
        Limits {
            max_failures: limits.max_failures.saturating_sub(carried).max(1),
            ..limits
        }
    }

    /// Hands a job that was asked to stop for a move back to its own lane
    /// when the move could not be made: visible again at once, its release
    /// recorded and settled (no failure, no interruption).
    async fn release_in_place(&self, delivery: &mut Delivery) {
        let id = delivery.message.id.clone();
        let note = async {
            let read = self.attempts.read(&id).await?;
            let attempts = read
                .attempts
                .released()
                .settled_release()
                .with_tail(&delivery_tail(delivery));
            self.attempts.write(&id, &read, &attempts).await
        };
        if tokio::time::timeout(self.note_deadline(), note)
            .await
            .is_err()
        {
            tracing::warn!("recording the release in the attempt record timed out");
        }
        delivery.stop_renewing().await;
        if self.settled_lease(delivery)
            && self
                .make_visible_after(&delivery.lease, Duration::ZERO)
                .await
        {
            self.settled(DeliveryOutcome::Released);
        }
    }
}

/// How often, and how far apart, a tail write is tried again while the
/// store cannot be reached (within its deadline).
const TAIL_RETRIES: u32 = 40;
const TAIL_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

impl Consumer {
    /// Adds `delivery`'s tail to its message's attempt record, on its own
    /// (a release, a lost lease: no other outcome is written then), within
    /// `deadline`; one that fails or runs out of time is logged, and that
    /// delivery's redone work goes unreported. A release (`released`:
    /// `Some`, with the interruption's kind if its handler ran) is marked
    /// settled in the same write, and its kind counted once that write
    /// succeeded (one that lost work with its loss: the tail's redone
    /// time), unless the next delivery counted its note already
    /// ([`own_release_uncounted`]): a release whose settling is not
    /// recorded is counted by the next delivery, as a late notice.
    async fn record_tail(
        &self,
        delivery: &Delivery,
        deadline: std::time::Duration,
        released: Option<Option<Interruption>>,
    ) {
        let tail = delivery_tail(delivery);
        if tail == spot_worker_decisions::goodput::Ledger::default() && released.is_none() {
            return;
        }
        let id = &delivery.message.id;
        let once = || async {
            let read = self.attempts.read(id).await?;
            let settles = released.is_some() && own_release_uncounted(&read.attempts);
            let mut attempts = read.attempts.with_tail(&tail);
            if settles {
                attempts = attempts.settled_release();
            }
            self.attempts.write(id, &read, &attempts).await?;
            Ok::<bool, spot_worker_storage::StorageError>(settles)
        };
        // An outage (what loses a lease) may outlast the client's own
        // retries: try again, every half second, until the deadline. A
        // conflict is the next delivery's write to the same record (it
        // took the message over, and counted what it found): read it
        // again at once, and add to what it wrote.
        let write = async {
            let mut result = once().await;
            for _ in 0..TAIL_RETRIES {
                match &result {
                    Err(spot_worker_storage::StorageError::Conflict { .. }) => {
                        result = once().await
                    }
                    Err(error) if spot_worker_storage::store_unreachable(error) => {
                        tokio::time::sleep(TAIL_RETRY_PAUSE).await;
                        result = once().await;
                    }
                    _ => break,
                }
            }
            result
        };
        match tokio::time::timeout(deadline, write).await {
            Ok(Ok(settled)) => {
                if settled && let Some(Some(kind)) = released {
                    match kind {
                        // What it lost is its tail's redone work.
                        Interruption::Unsaved | Interruption::Late => self
                            .cadence
                            .note_loss(kind, Duration::from_millis(tail.redone_ms)),
                        Interruption::Drained | Interruption::NoOutcome => self.cadence.note(kind),
                    }
                }
                tracing::debug!(redone_ms = tail.redone_ms, settled, "tail recorded");
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not record what this delivery did after its last checkpoint; its redone work goes unreported");
            }
            Err(_) => tracing::warn!(
                "recording what this delivery did after its last checkpoint timed out; its redone work goes unreported"
            ),
        }
    }
}

/// What `delivery` did after its last saved checkpoint, for the attempt
/// record of a delivery that ends without finishing its job.
pub(super) fn delivery_tail(delivery: &Delivery) -> spot_worker_decisions::goodput::Ledger {
    tail(&delivery.clock.now(), delivery.clock.last_saved().as_ref())
}
