//! [`DrainSignals`]: the three stages of stopping a consumer.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The three stages of stopping a consumer ([`Consumer::run_until`]), so a
/// worker with some notice (a Spot eviction gives 30 s) stops taking work at
/// once, lets handlers save their progress, and hands back what is left.
///
/// Each stage implies the ones before it. Clones share the same stages.
///
/// ```
/// use spot_worker_consumer::DrainSignals;
///
/// let signals = DrainSignals::new();
/// signals.wind_down(None);
/// assert!(signals.is_receiving_stopped());
/// assert!(!signals.is_released());
/// ```
///
/// [`Consumer::run_until`]: crate::Consumer::run_until
#[derive(Clone, Debug)]
pub struct DrainSignals {
    pub(crate) release: CancellationToken,
    pub(crate) wind_down: CancellationToken,
    stop_receiving: CancellationToken,
    pub(crate) deadline: Arc<watch::Sender<Option<Instant>>>,
    /// When stage 2 (or 3, without it) began: the notice, which a drain's
    /// last save is weighed against (saved at the notice or before it).
    noticed_at: Arc<OnceLock<Instant>>,
    /// Cancelled when one consumer's receive loop has ended, so no receive
    /// of its own is in flight: each run has its own ([`Self::for_run`]).
    intake_closed: CancellationToken,
}

impl Default for DrainSignals {
    fn default() -> Self {
        DrainSignals::new()
    }
}

impl DrainSignals {
    /// Signals with no stage begun.
    pub fn new() -> Self {
        let release = CancellationToken::new();
        let wind_down = release.child_token();
        let stop_receiving = wind_down.child_token();
        DrainSignals {
            release,
            wind_down,
            stop_receiving,
            deadline: Arc::new(watch::channel(None).0),
            noticed_at: Arc::default(),
            intake_closed: CancellationToken::new(),
        }
    }

    /// The same stages, with an intake of its own: what one consumer's
    /// run holds, so its releases wait for its own receive loop only.
    pub(crate) fn for_run(&self) -> DrainSignals {
        DrainSignals {
            intake_closed: CancellationToken::new(),
            ..self.clone()
        }
    }

    /// Records that this run's receive loop has ended: no receive of its
    /// own is in flight any more.
    pub(crate) fn close_intake(&self) {
        self.intake_closed.cancel();
    }

    /// Resolves once this run's receive loop has ended, or after `limit`.
    /// A message released on shutdown while a receive sent before the stop
    /// is still unanswered can come back in that receive: taken again
    /// (its dequeue count raised) only to be released a second time, the
    /// two releases' notes racing for its attempt record.
    pub(crate) async fn intake_closed(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.intake_closed.cancelled()).await;
    }

    /// Stage 1: receive no more messages; in-flight handlers keep running
    /// (their leases renewed) until they finish.
    pub fn stop_receiving(&self) {
        self.stop_receiving.cancel();
    }

    /// Stage 2: also cancel every handler's token ([`Job::cancellation`]) so
    /// it can save its progress and return; `deadline` is what
    /// [`Job::deadline`] reports. A handler that returns `Ok` is settled as
    /// usual; one that returns an error has its message made visible again
    /// without counting as a failure, as soon as the release is recorded in
    /// the message's attempt record (written when this stage begins; waited
    /// for 1 s at most, never past stage 3), so evictions never add up to
    /// the crash-loop guard.
    ///
    /// [`Job::cancellation`]: crate::Job::cancellation
    /// [`Job::deadline`]: crate::Job::deadline
    pub fn wind_down(&self, deadline: Option<Instant>) {
        self.deadline.send_replace(deadline);
        // Before the handlers' tokens: whatever they save after seeing
        // theirs comes after it.
        self.noticed_at.get_or_init(Instant::now);
        self.wind_down.cancel();
    }

    /// Stage 3: drop every handler still running and make its message
    /// visible again at once, so another worker can take it now.
    pub fn release(&self) {
        self.noticed_at.get_or_init(Instant::now);
        self.release.cancel();
    }

    /// When stage 2 began (or stage 3, if it came first); `None` before.
    pub(crate) fn noticed_at(&self) -> Option<Instant> {
        self.noticed_at.get().copied()
    }

    /// Whether stage 1 (or a later one) has begun.
    pub fn is_receiving_stopped(&self) -> bool {
        self.stop_receiving.is_cancelled()
    }

    /// Whether stage 3 has begun.
    pub fn is_released(&self) -> bool {
        self.release.is_cancelled()
    }

    /// Resolves once stage 1 (or a later one) has begun.
    pub(crate) async fn stopping(&self) {
        self.stop_receiving.cancelled().await
    }
}
