//! [`ConsumerStats`]: counts of what a consumer did, for logs and tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of what the consumer did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages received.
    pub received: u64,
    /// Handled successfully and deleted.
    pub succeeded: u64,
    /// Failed and made visible again after a backoff.
    pub retried: u64,
    /// Moved to the poison queue.
    pub poisoned: u64,
    /// Made visible again at once: because the worker shut down, or because
    /// the queue returned more messages than were asked for.
    pub released: u64,
    /// Given up because another consumer took the message.
    pub leases_lost: u64,
    /// Deleted without running the handler because the job's checkpoint was
    /// completed.
    pub skipped_completed: u64,
    /// Settle calls that failed or timed out (the message reappears after its
    /// visibility timeout, so nothing is lost), attempt records that could
    /// not be written included.
    pub settle_failures: u64,
    /// Receive calls that failed (storage unreachable, throttled); the
    /// consumer backs off and keeps trying.
    pub receive_errors: u64,
    /// Deliveries fenced out by another holder of the same job (a duplicate
    /// message whose worker wrote newer progress): put back to be checked
    /// again later, without counting as a failure.
    pub waited_for_peer: u64,
    /// Deliveries whose handler stopped because the checkpoint store could
    /// not be reached: put back to be tried again later, without counting
    /// as a failure.
    pub waited_for_store: u64,
    /// Jobs with a deadline handed to the other lane (see
    /// [`Consumer::with_lanes`](crate::Consumer::with_lanes)).
    pub moved: u64,
    /// Older copies of jobs moved between lanes, deleted unrun.
    pub superseded: u64,
    /// Probes for Spot capacity deleted unrun (a worker with lanes).
    pub probes_taken: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) poisoned: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) skipped_completed: AtomicU64,
    pub(crate) settle_failures: AtomicU64,
    pub(crate) receive_errors: AtomicU64,
    pub(crate) waited_for_peer: AtomicU64,
    pub(crate) waited_for_store: AtomicU64,
    pub(crate) moved: AtomicU64,
    pub(crate) superseded: AtomicU64,
    pub(crate) probes_taken: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> ConsumerStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            received: get(&self.received),
            succeeded: get(&self.succeeded),
            retried: get(&self.retried),
            poisoned: get(&self.poisoned),
            released: get(&self.released),
            leases_lost: get(&self.leases_lost),
            skipped_completed: get(&self.skipped_completed),
            settle_failures: get(&self.settle_failures),
            receive_errors: get(&self.receive_errors),
            waited_for_peer: get(&self.waited_for_peer),
            waited_for_store: get(&self.waited_for_store),
            moved: get(&self.moved),
            superseded: get(&self.superseded),
            probes_taken: get(&self.probes_taken),
        }
    }
}
