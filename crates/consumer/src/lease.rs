//! The lease on one in-flight message: its current pop receipt, and the
//! background task that renews the visibility timeout before it runs out
//! (carrying each new pop receipt forward) and gives the lease up if it
//! turns out to be lost or runs out during a storage outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use spot_worker_storage::StorageError;
use spot_worker_storage::{MessageId, MessageQueue, PopReceipt};

/// Renewals that fail for a transient reason are retried this much sooner
/// than a regular renewal, so a short outage does not cost the lease.
const RETRY_DIVISOR: u32 = 4;

/// How often a lease of `visibility_timeout` is renewed: every third of it.
/// A job of N minutes then costs about 3·N / visibility renewals (each one
/// storage transaction), so a long visibility timeout makes long jobs cheap;
/// the other two thirds are left for a slow answer or for retrying a renewal
/// through a storage outage. (Renewals used to come at most 10 s apart
/// whatever the timeout: six transactions per job-minute however long the
/// lease. The default 30 s lease is still renewed every 10 s.)
pub(crate) fn renewal_period(visibility_timeout: Duration) -> Duration {
    visibility_timeout / 3
}

/// The current pop receipt of a message, shared by its renewal task and
/// whoever settles it.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) id: MessageId,
    // An async mutex, held across the update call, so settling never uses a
    // receipt that a concurrent renewal is about to replace.
    receipt: Mutex<PopReceipt>,
    lost: AtomicBool,
    /// Cancelled when the lease is found lost, so the handler can be dropped
    /// at once: nothing more may be written for this delivery.
    lost_signal: CancellationToken,
}

impl Lease {
    pub(crate) fn new(id: MessageId, receipt: PopReceipt) -> Arc<Self> {
        Arc::new(Lease {
            id,
            receipt: Mutex::new(receipt),
            lost: AtomicBool::new(false),
            lost_signal: CancellationToken::new(),
        })
    }

    pub(crate) async fn receipt(&self) -> PopReceipt {
        self.receipt.lock().await.clone()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.lost_signal.cancel();
    }

    /// Resolves once the lease is found lost.
    pub(crate) async fn lost(&self) {
        self.lost_signal.cancelled().await
    }
}

/// A running renewal task. [`Renewal::stop`] waits for it so that the
/// lease's receipt is final afterwards; dropping it (say, while a panic
/// unwinds) aborts the task, so a message is never kept hidden by a
/// renewal nobody will settle.
pub(crate) struct Renewal {
    /// Ends the task before its next renewal.
    stop: CancellationToken,
    /// Also drops a renewal request already in flight.
    abandon: CancellationToken,
    handle: JoinHandle<()>,
}

impl Renewal {
    /// Renews `lease`, received (or last renewed) at `leased_at`, every
    /// [`renewal_period`]; cancels `fence` (the delivery's checkpoint fence)
    /// and marks the lease lost if another consumer took the message or if
    /// no renewal got through before the lease ran out.
    pub(crate) fn start(
        queue: Arc<dyn MessageQueue>,
        lease: Arc<Lease>,
        leased_at: Instant,
        visibility_timeout: Duration,
        fence: CancellationToken,
    ) -> Self {
        let stop = CancellationToken::new();
        let abandon = CancellationToken::new();
        let handle = tokio::spawn(renew_until_stopped(
            queue,
            lease,
            leased_at,
            visibility_timeout,
            fence,
            stop.clone(),
            abandon.clone(),
        ));
        Renewal {
            stop,
            abandon,
            handle,
        }
    }

    /// Stops renewing and waits for the task. A renewal already in flight
    /// is let finish (so the receipt is current for settling) unless
    /// `hurry` is or becomes cancelled: then it is abandoned at once, and
    /// if the service applied it anyway the receipt we keep is stale, so
    /// settling may report a lost lease (the message then reappears after
    /// its visibility timeout).
    pub(crate) async fn stop(mut self, hurry: &CancellationToken) {
        self.stop.cancel();
        let result = tokio::select! {
            biased;
            result = &mut self.handle => result,
            () = hurry.cancelled() => {
                self.abandon.cancel();
                (&mut self.handle).await
            }
        };
        if let Err(error) = result {
            tracing::error!(%error, "lease renewal task failed");
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.abandon.cancel();
        self.handle.abort();
    }
}

async fn renew_until_stopped(
    queue: Arc<dyn MessageQueue>,
    lease: Arc<Lease>,
    leased_at: Instant,
    visibility_timeout: Duration,
    fence: CancellationToken,
    stop: CancellationToken,
    abandon: CancellationToken,
) {
    let period = renewal_period(visibility_timeout);
    // Counted from when the request was sent, not answered: the service
    // may have started the timeout at any point in between.
    let mut expires_at = leased_at + visibility_timeout;
    let mut next = leased_at + period;
    let give_up = |reason: &str| {
        lease.mark_lost();
        fence.cancel();
        tracing::warn!(message_id = %lease.id, reason, "lease lost; dropping the handler, nothing more is written for this delivery");
    };
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next.min(expires_at)) => {}
        }
        if Instant::now() >= expires_at {
            // Another consumer may hold the message by now, and we could not
            // ask the service whether it does.
            give_up("the lease expired during a storage outage: no renewal got through in time");
            return;
        }
        let mut receipt = lease.receipt.lock().await;
        let sent_at = Instant::now();
        let update = queue.update_visibility(&lease.id, &receipt, visibility_timeout);
        // The request may take until the lease runs out, not just one period:
        // abandoning it earlier would keep our receipt stale if the service
        // applied it, and the next renewal would then report a lease we still
        // hold as lost, with no way to learn the new receipt.
        let result = tokio::select! {
            biased;
            () = abandon.cancelled() => {
                tracing::debug!(message_id = %lease.id, "renewal abandoned in flight; if the service applied it the receipt is stale");
                return;
            }
            result = tokio::time::timeout_at(expires_at, update) => result,
        };
        match result {
            Ok(Ok(renewed)) => {
                *receipt = renewed;
                expires_at = sent_at + visibility_timeout;
                next = sent_at + period;
                tracing::debug!(message_id = %lease.id, "lease renewed");
            }
            Ok(Err(StorageError::LeaseLost { .. })) => {
                give_up("another consumer has the message (its pop receipt no longer matches)");
                return;
            }
            Ok(Err(error)) => {
                next = Instant::now() + period / RETRY_DIVISOR;
                tracing::warn!(message_id = %lease.id, %error, "lease renewal failed; retrying");
            }
            Err(_) => {
                // Had it been applied, our receipt would be stale anyway: a
                // lease we cannot renew any more is as good as lost.
                give_up(
                    "the lease expired while a renewal was unanswered; its receipt may be stale",
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_storage::memory::InMemoryQueue;

    const VISIBILITY: Duration = Duration::from_secs(6);

    #[test]
    fn renewals_come_every_third_of_the_lease_so_their_number_scales_with_job_over_lease() {
        for (visibility, period) in [(6, 2), (30, 10), (300, 100), (3600, 1200)] {
            assert_eq!(
                renewal_period(Duration::from_secs(visibility)),
                Duration::from_secs(period),
                "visibility {visibility} s"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_renewal_stops_renewing() {
        let queue = InMemoryQueue::new("q");
        queue.send("a", Duration::ZERO).await.unwrap();
        let leased_at = Instant::now();
        let message = queue.receive(1, VISIBILITY).await.unwrap().remove(0);
        let lease = Lease::new(message.id, message.pop_receipt);
        let renewal = Renewal::start(
            Arc::new(queue.clone()),
            Arc::clone(&lease),
            leased_at,
            VISIBILITY,
            CancellationToken::new(),
        );
        tokio::time::sleep(VISIBILITY * 2).await;
        assert!(!queue.messages()[0].visible, "renewed while running");
        drop(renewal);
        tokio::time::sleep(VISIBILITY).await;
        assert!(queue.messages()[0].visible, "no renewal after the drop");
        assert!(!lease.is_lost());
    }
}
