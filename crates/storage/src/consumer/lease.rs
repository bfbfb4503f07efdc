//! The lease on one in-flight message: its current pop receipt, and the
//! background task that renews the visibility timeout before it runs out
//! (carrying each new pop receipt forward) and cancels the job if the lease
//! turns out to be lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::StorageError;
use crate::queue::{MessageId, MessageQueue, PopReceipt};

/// Renewals that fail for a transient reason are retried this much sooner
/// than a regular renewal, so a short outage does not cost the lease.
const RETRY_DIVISOR: u32 = 4;

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

/// A running renewal task; [`Renewal::stop`] waits for it so that the lease's
/// receipt is final afterwards.
pub(crate) struct Renewal {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Renewal {
    /// Renews `lease` every half `visibility_timeout`; cancels `job` (the
    /// delivery's checkpoint fence) if the lease is lost.
    pub(crate) fn start(
        queue: Arc<dyn MessageQueue>,
        lease: Arc<Lease>,
        visibility_timeout: Duration,
        job: CancellationToken,
    ) -> Self {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(renew_until_stopped(
            queue,
            lease,
            visibility_timeout,
            job,
            stop.clone(),
        ));
        Renewal { stop, handle }
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Err(error) = self.handle.await {
            tracing::error!(%error, "lease renewal task failed");
        }
    }
}

async fn renew_until_stopped(
    queue: Arc<dyn MessageQueue>,
    lease: Arc<Lease>,
    visibility_timeout: Duration,
    job: CancellationToken,
    stop: CancellationToken,
) {
    // Half the timeout leaves the other half for a slow or retried request.
    let interval = visibility_timeout / 2;
    let mut wait = interval;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let mut receipt = lease.receipt.lock().await;
        let update = queue.update_visibility(&lease.id, &receipt, visibility_timeout);
        match tokio::time::timeout(interval, update).await {
            Ok(Ok(renewed)) => {
                *receipt = renewed;
                wait = interval;
                tracing::debug!(message_id = %lease.id, "lease renewed");
            }
            Ok(Err(StorageError::LeaseLost { .. })) => {
                lease.mark_lost();
                tracing::warn!(message_id = %lease.id, "lease lost; cancelling the handler");
                job.cancel();
                return;
            }
            Ok(Err(error)) => {
                wait = interval / RETRY_DIVISOR;
                tracing::warn!(message_id = %lease.id, %error, "lease renewal failed; retrying");
            }
            Err(_) => {
                wait = interval / RETRY_DIVISOR;
                tracing::warn!(message_id = %lease.id, "lease renewal timed out; retrying");
            }
        }
    }
}
