//! Keeping this worker's own VM out of a scale-in while it holds work
//! (issue 39, item 1): the worker side of the design in `bicep/README.md`.
//!
//! [`ProtectionKeeper`] follows what the worker holds and asks a
//! [`ScaleInProtection`] (on a scale set: ARM's `protectFromScaleIn` on this
//! VM) to protect the VM when it takes its first message of a busy period
//! and to release it once it has been idle for the idle grace, by
//! [`wants_protection`]: one call each way per busy period, never one per
//! message.
//!
//! A failed call never holds up or loses a job: a failed protect leaves the
//! job running (unprotected, as every VM is today) and is retried; a failed
//! release is retried with a bounded, jittered backoff that honours ARM's
//! `Retry-After` ([`crate::keeper_retry`], the loop it shares with the pod
//! deletion cost's keeper), and while it cannot clear
//! [`ProtectionKeeper::release_stuck`] says so: every failure is logged,
//! `spot_worker.scale_in.protection` is 1 for `release_stuck`, and
//! `/readyz` shows the reason under `degraded` (the worker stays ready: it
//! still works), so a VM protected for ever is never silent.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use spot_worker_decisions::scale_in::{Activity, wants_protection};
use spot_worker_telemetry::ProtectionState;
use tokio::time::Instant;

pub use crate::keeper_retry::Backoff;
use crate::keeper_retry::{KeeperReport, Retrying};

/// Sets or clears this VM's protection from scale-in.
#[async_trait]
pub trait ScaleInProtection: Send + Sync {
    /// Asks for this VM to be protected (`true`) or not (`false`). Called
    /// only when the wanted state differs from the last one that succeeded.
    async fn set(&self, protected: bool) -> Result<(), ProtectionError>;
}

/// A call to set the protection that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting scale-in protection failed: {message}")]
pub struct ProtectionError {
    /// What went wrong, with its context (never a token).
    pub message: String,
    /// How long the service asked us to wait (`Retry-After` on a 429 or a
    /// 503), if it did.
    pub retry_after: Option<Duration>,
}

/// Follows what the worker holds and keeps its VM's protection in step.
///
/// The worker tells it when it takes ([`taken`](Self::taken)) and settles
/// ([`settled`](Self::settled)) a message, and calls
/// [`reconcile`](Self::reconcile) after each and periodically (every few
/// seconds: that is when a release after the grace happens). Each
/// `reconcile` makes at most one call.
pub struct ProtectionKeeper {
    target: Arc<dyn ScaleInProtection>,
    idle_grace: Duration,
    /// What the last successful call set; `None` until one has: a worker
    /// restarted after a crash may find its VM still protected, so its
    /// first call clears it.
    protected: Option<bool>,
    held: usize,
    /// Whether any message has been taken yet: until then the worker is
    /// starting, and a starting worker holds nothing to protect.
    ever_busy: bool,
    idle_since: Instant,
    retrying: Retrying,
    report: KeeperReport,
}

impl ProtectionKeeper {
    /// A keeper for a worker that starts at `now`, holding nothing.
    pub fn new(
        target: Arc<dyn ScaleInProtection>,
        idle_grace: Duration,
        backoff: Backoff,
        now: Instant,
    ) -> Self {
        Self {
            target,
            idle_grace,
            protected: None,
            held: 0,
            ever_busy: false,
            idle_since: now,
            retrying: Retrying::new(backoff),
            report: KeeperReport::default(),
        }
    }

    /// Reports the keeper's state to `report` after every pass of
    /// [`keep`] (by default to nowhere).
    pub fn with_report(mut self, report: KeeperReport) -> Self {
        self.report = report;
        self
    }

    fn report(&self, now: Instant) {
        self.report
            .protection(self.state(now), self.stuck_reason(now));
    }

    /// The worker took a message.
    pub fn taken(&mut self) {
        self.held += 1;
        self.ever_busy = true;
    }

    /// The worker settled a message at `now` (finished, released, moved).
    pub fn settled(&mut self, now: Instant) {
        self.held = self.held.saturating_sub(1);
        if self.held == 0 {
            self.idle_since = now;
        }
    }

    /// The worker holds `held` messages at `now` (the count of
    /// [`WorkerActivity`](crate::activity::WorkerActivity)): the same as the
    /// `taken` and `settled` calls that lead there.
    pub fn observe(&mut self, held: usize, now: Instant) {
        if held > 0 {
            self.ever_busy = true;
        } else if self.held > 0 {
            self.idle_since = now;
        }
        self.held = held;
    }

    /// What the worker is doing at `now`, as the decision sees it.
    pub fn activity(&self, now: Instant) -> Activity {
        if !self.ever_busy {
            Activity::Starting
        } else if self.held > 0 {
            // The keeper does not know the unsaved work; protection does
            // not depend on it.
            Activity::Busy {
                unsaved: Duration::ZERO,
            }
        } else {
            Activity::Idle {
                idle_for: now.saturating_duration_since(self.idle_since),
            }
        }
    }

    /// Whether the VM is protected, as far as the last successful call
    /// says (`None` before any has succeeded).
    pub fn protected(&self) -> Option<bool> {
        self.protected
    }

    /// Whether the VM should be unprotected but the release keeps failing:
    /// a condition that will not clear by itself, for readiness or a metric.
    pub fn release_stuck(&self, now: Instant) -> bool {
        self.protected != Some(false) && self.retrying.failures() > 0 && !self.wanted(now)
    }

    /// The state `spot_worker.scale_in.protection` reports at `now`.
    pub fn state(&self, now: Instant) -> ProtectionState {
        if self.release_stuck(now) {
            return ProtectionState::ReleaseStuck;
        }
        match self.protected {
            None => ProtectionState::Unknown,
            Some(true) => ProtectionState::Protected,
            Some(false) => ProtectionState::Unprotected,
        }
    }

    /// Why the VM stays protected against the worker's wish at `now`, for
    /// `/readyz`'s `degraded` reasons; `None` unless the release is stuck.
    pub fn stuck_reason(&self, now: Instant) -> Option<String> {
        self.release_stuck(now).then(|| {
            format!(
                "releasing this VM's scale-in protection failed {} time(s) in a row ({}); \
                 every scale-in keeps this VM until a retry succeeds",
                self.retrying.failures(),
                self.retrying.last_error().unwrap_or("no reason given"),
            )
        })
    }

    /// Consecutive failed calls (0 after a success or when nothing is due).
    pub fn failures(&self) -> u32 {
        self.retrying.failures()
    }

    /// When the next call is due, if one is wanted but waits for its
    /// backoff: the worker's timer can sleep until then.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retrying.retry_at()
    }

    fn wanted(&self, now: Instant) -> bool {
        wants_protection(self.activity(now), self.idle_grace)
    }

    /// Brings the protection in step with what the worker holds at `now`:
    /// nothing if it already is or a failed call is still backing off,
    /// otherwise one call. Returns whether the VM is protected afterwards
    /// (`false` while unknown).
    pub async fn reconcile(&mut self, now: Instant) -> bool {
        let want = self.wanted(now);
        if self.protected == Some(want) {
            self.retrying.clear();
            return want;
        }
        if self.retrying.backing_off(now) {
            return self.protected == Some(true);
        }
        match self.target.set(want).await {
            Ok(()) => {
                let after_failures = self.retrying.succeeded();
                if after_failures > 0 {
                    tracing::info!(
                        protected = want,
                        after_failures,
                        "scale-in protection set after earlier failures"
                    );
                }
                self.protected = Some(want);
            }
            Err(error) => {
                let delay = self.retrying.failed(now, &error, error.retry_after);
                let failures = self.retrying.failures();
                if want {
                    tracing::warn!(
                        %error, failures, retry_in = ?delay,
                        "could not protect this VM from scale-in; the job runs unprotected"
                    );
                } else {
                    tracing::error!(
                        %error, failures, retry_in = ?delay,
                        "could not release this idle VM's scale-in protection; it stays until a retry succeeds"
                    );
                }
            }
        }
        self.protected == Some(true)
    }
}

/// How often an idle worker's keeper looks again without a change of
/// activity: the release happens within this of the grace ending.
pub const RECHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest the last release may take as the worker exits.
pub const LAST_RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// Keeps the VM's protection in step with `activity` (the count of held
/// messages) until `stop` is cancelled, then releases it once (within
/// [`LAST_RELEASE_WITHIN`]): a worker that drains or exits holds nothing to
/// protect, and a VM left protected would be kept by every scale-in.
/// After every pass its state goes to the keeper's report
/// ([`ProtectionKeeper::with_report`]): the
/// `spot_worker.scale_in.protection` gauge and, while a release is stuck,
/// a `degraded` reason of `/readyz`.
/// Returns the keeper, whose [`ProtectionKeeper::protected`] says how it
/// ended.
pub async fn keep(
    mut keeper: ProtectionKeeper,
    mut activity: tokio::sync::watch::Receiver<usize>,
    stop: tokio_util::sync::CancellationToken,
) -> ProtectionKeeper {
    loop {
        let held = *activity.borrow_and_update();
        let now = Instant::now();
        keeper.observe(held, now);
        keeper.reconcile(now).await;
        keeper.report(now);
        let next = keeper.retrying.wake(now, RECHECK_EVERY);
        tokio::select! {
            () = stop.cancelled() => break,
            changed = activity.changed() => {
                if changed.is_err() {
                    // The worker is gone: nothing is held any more.
                    break;
                }
            }
            () = tokio::time::sleep_until(next) => {}
        }
    }
    release_at_exit(&mut keeper).await;
    keeper.report(Instant::now());
    keeper
}

/// The last release, bounded; a failure is logged (by the keeper) and said
/// again here, since nothing will retry it.
async fn release_at_exit(keeper: &mut ProtectionKeeper) {
    if keeper.protected() == Some(false) {
        return;
    }
    keeper.held = 0;
    keeper.ever_busy = true;
    keeper.idle_since = Instant::now()
        .checked_sub(keeper.idle_grace)
        .unwrap_or_else(Instant::now);
    keeper.retrying.retry_now();
    let released =
        tokio::time::timeout(LAST_RELEASE_WITHIN, keeper.reconcile(Instant::now())).await;
    if !matches!(released, Ok(false)) || keeper.protected() != Some(false) {
        tracing::error!(
            "this VM's scale-in protection could not be released as the worker exits; \
             a scale-in will keep this VM until the protection is cleared \
             (az vmss update --protect-from-scale-in false, or the next worker on it)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Scripted = crate::scripted::Scripted<bool, ProtectionError>;

    #[async_trait]
    impl ScaleInProtection for Scripted {
        async fn set(&self, protected: bool) -> Result<(), ProtectionError> {
            self.answer(protected)
        }
    }

    fn throttled(retry_after: u64) -> Result<(), ProtectionError> {
        Err(ProtectionError {
            message: "429".into(),
            retry_after: Some(Duration::from_secs(retry_after)),
        })
    }

    fn server_error() -> Result<(), ProtectionError> {
        Err(ProtectionError {
            message: "500".into(),
            retry_after: None,
        })
    }

    const GRACE: Duration = Duration::from_secs(120);

    fn keeper(
        script: Vec<Result<(), ProtectionError>>,
    ) -> (Arc<Scripted>, ProtectionKeeper, Instant) {
        let target = Arc::new(Scripted::new(script));
        let start = Instant::now();
        let keeper = ProtectionKeeper::new(target.clone(), GRACE, Backoff::default(), start);
        (target, keeper, start)
    }

    fn calls(target: &Scripted) -> Vec<bool> {
        target.calls()
    }

    #[tokio::test]
    async fn a_starting_worker_clears_a_protection_left_by_a_crash_once() {
        let (target, mut keeper, start) = keeper(vec![server_error()]);
        assert!(!keeper.reconcile(start).await);
        assert!(keeper.release_stuck(start), "unknown and failing: reported");
        let retry = keeper.retry_at().expect("a retry is due");
        assert!(!keeper.reconcile(retry).await);
        assert!(!keeper.reconcile(retry + GRACE * 10).await);
        assert_eq!(keeper.protected(), Some(false));
        assert_eq!(calls(&target), [false, false]);
    }

    #[tokio::test]
    async fn one_protect_and_one_release_per_busy_period() {
        let (target, mut keeper, start) = keeper(vec![]);
        let at = |s: u64| start + Duration::from_secs(s);
        // Three messages with gaps shorter than the grace: one busy period.
        for (took, done) in [(0, 100), (130, 200), (300, 400)] {
            keeper.taken();
            assert!(keeper.reconcile(at(took)).await);
            keeper.settled(at(done));
            assert!(keeper.reconcile(at(done + 60)).await, "within the grace");
        }
        assert_eq!(calls(&target), [true]);
        // Idle past the grace: released, once.
        assert!(!keeper.reconcile(at(400) + GRACE).await);
        assert!(!keeper.reconcile(at(1000)).await);
        assert_eq!(calls(&target), [true, false]);
        // The next message opens a new busy period.
        keeper.taken();
        assert!(keeper.reconcile(at(1100)).await);
        assert_eq!(calls(&target), [true, false, true]);
    }

    #[tokio::test]
    async fn concurrent_messages_protect_once_and_release_after_the_last() {
        let (target, mut keeper, start) = keeper(vec![]);
        let at = |s: u64| start + Duration::from_secs(s);
        keeper.taken();
        keeper.reconcile(at(0)).await;
        keeper.taken();
        keeper.reconcile(at(1)).await;
        keeper.settled(at(10));
        assert!(keeper.reconcile(at(10) + GRACE * 2).await, "one still held");
        keeper.settled(at(500));
        assert!(keeper.reconcile(at(500) + GRACE / 2).await);
        assert!(!keeper.reconcile(at(500) + GRACE).await);
        assert_eq!(calls(&target), [true, false]);
    }

    #[tokio::test]
    async fn a_failed_protect_is_retried_after_its_backoff_while_the_job_runs() {
        let (target, mut keeper, start) = keeper(vec![throttled(30), server_error()]);
        let at = |s: u64| start + Duration::from_secs(s);
        keeper.taken();
        assert!(!keeper.reconcile(at(0)).await, "the job runs unprotected");
        let retry = keeper.retry_at().expect("a retry is due");
        assert!(retry >= at(30), "Retry-After honoured");
        assert!(!keeper.reconcile(at(29)).await, "not before the retry");
        assert_eq!(calls(&target).len(), 1);
        assert!(!keeper.reconcile(retry).await, "500");
        assert_eq!(keeper.failures(), 2);
        let retry = keeper.retry_at().expect("another retry");
        assert!(keeper.reconcile(retry).await);
        assert_eq!(calls(&target), [true, true, true]);
        assert_eq!(keeper.failures(), 0);
    }

    #[tokio::test]
    async fn a_release_that_keeps_failing_is_reported_and_retried_until_it_clears() {
        let script = vec![Ok(()), server_error(), throttled(100), server_error()];
        let (target, mut keeper, start) = keeper(script);
        let at = |s: u64| start + Duration::from_secs(s);
        keeper.taken();
        keeper.reconcile(at(0)).await;
        keeper.settled(at(10));
        let mut now = at(10) + GRACE;
        for _ in 0..3 {
            assert!(keeper.reconcile(now).await, "still protected");
            assert!(keeper.release_stuck(now), "reported while it cannot clear");
            now = keeper.retry_at().expect("a retry is due");
        }
        assert!(!keeper.reconcile(now).await);
        assert!(!keeper.release_stuck(now));
        assert_eq!(calls(&target), [true, false, false, false, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_running_keeper_follows_the_activity_and_releases_as_the_worker_exits() {
        let (target, keeper, _) = keeper(vec![]);
        let activity = crate::activity::WorkerActivity::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(keep(keeper, activity.subscribe(), stop.clone()));
        // Starting: a protection left by a crash is cleared.
        target.until_calls(1).await;
        let held = activity.hold();
        target.until_calls(2).await;
        assert_eq!(calls(&target), [false, true]);
        drop(held);
        // Within the grace: still protected, no call.
        tokio::time::sleep(GRACE / 2).await;
        assert_eq!(calls(&target).len(), 2);
        tokio::time::sleep(GRACE / 2 + RECHECK_EVERY).await;
        target.until_calls(3).await;
        assert_eq!(calls(&target), [false, true, false]);
        // Busy again, then told to stop while holding: released once.
        let _held = activity.hold();
        target.until_calls(4).await;
        stop.cancel();
        let keeper = task.await.unwrap();
        assert_eq!(calls(&target), [false, true, false, true, false]);
        assert_eq!(keeper.protected(), Some(false));
    }

    /// The readiness of a worker whose gates are all open.
    fn ready_worker() -> tokio::sync::watch::Sender<crate::Readiness> {
        use crate::Gate;
        tokio::sync::watch::channel(crate::Readiness {
            imds: Gate::Passed,
            storage: Gate::Passed,
            warmup: Gate::Skipped,
            ..crate::Readiness::default()
        })
        .0
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_release_is_a_metric_and_a_degraded_reason_until_it_clears() {
        let (target, keeper, _) = keeper(vec![Ok(()), Ok(()), server_error()]);
        let metrics = spot_worker_telemetry::Metrics::noop();
        let readiness = ready_worker();
        let keeper = keeper.with_report(KeeperReport::new(metrics.clone(), readiness.clone()));
        let activity = crate::activity::WorkerActivity::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(keep(keeper, activity.subscribe(), stop.clone()));
        target.until_calls_in_time(1).await;
        assert_eq!(metrics.scale_in_protection(), ProtectionState::Unprotected);
        let held = activity.hold();
        target.until_calls_in_time(2).await;
        assert_eq!(metrics.scale_in_protection(), ProtectionState::Protected);
        assert!(readiness.borrow().degraded.is_empty());
        drop(held);
        // The grace ends; the release fails (500): reported, still ready.
        target.until_calls_in_time(3).await;
        assert_eq!(metrics.scale_in_protection(), ProtectionState::ReleaseStuck);
        let now = readiness.borrow().clone();
        let reason = now
            .degraded
            .get(crate::health::DEGRADED_SCALE_IN_PROTECTION)
            .expect("a degraded reason");
        assert!(reason.contains("500"), "{reason}");
        assert!(now.is_ready(), "a stuck release leaves the worker ready");
        // The retry succeeds: both clear.
        target.until_calls_in_time(4).await;
        assert_eq!(calls(&target), [false, true, false, false]);
        assert_eq!(metrics.scale_in_protection(), ProtectionState::Unprotected);
        assert!(readiness.borrow().degraded.is_empty());
        stop.cancel();
        assert_eq!(task.await.unwrap().protected(), Some(false));
    }

    #[tokio::test]
    async fn a_message_taken_while_a_release_fails_cancels_the_release() {
        let (target, mut keeper, start) = keeper(vec![Ok(()), server_error()]);
        let at = |s: u64| start + Duration::from_secs(s);
        keeper.taken();
        keeper.reconcile(at(0)).await;
        keeper.settled(at(10));
        assert!(keeper.reconcile(at(10) + GRACE).await);
        keeper.taken();
        assert!(keeper.reconcile(at(200)).await);
        assert!(!keeper.release_stuck(at(200)));
        assert_eq!(keeper.retry_at(), None);
        assert_eq!(calls(&target), [true, false]);
    }
}
