//! The one retry loop of the worker's two keepers of its scale-in hints
//! (issue 39): the scale-in protection of its VM
//! ([`crate::scale_in_protection`]) and the deletion cost of its pod
//! ([`crate::pod_deletion_cost`]). Both make one call when what they
//! publish differs from what is wanted, and a failed call is retried with
//! a bounded, jittered [`Backoff`] that honours the service's
//! `Retry-After`; [`Retrying`] keeps that state for both, so they cannot
//! drift apart. [`KeeperReport`] is where both say that their calls keep
//! failing: a gauge, and a `degraded` reason of `/readyz` (the worker stays
//! ready: it still works).

use std::time::Duration;

use spot_worker_telemetry::{Metrics, ProtectionState};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::health::{
    DEGRADED_POD_DELETION_COST, DEGRADED_SCALE_IN_PROTECTION, Readiness, set_degraded,
};

/// The retry policy of a failed call: exponential from `first`, capped at
/// `max`, each delay placed by jitter in its upper half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure (before jitter).
    pub first: Duration,
    /// The longest delay, `Retry-After` included.
    pub max: Duration,
}

impl Default for Backoff {
    /// 5 s, doubling to at most 5 min: a throttled subscription is not
    /// hammered, and a release that fails is still tried every few minutes.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(5),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 for the first),
    /// placed by `jitter` (0..=1) between half and all of the exponential
    /// step; at least `retry_after`; never above `max`.
    pub fn delay(&self, failures: u32, jitter: f64, retry_after: Option<Duration>) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        let step = self.first.saturating_mul(1u32 << exponent).min(self.max);
        let jittered = step / 2 + (step / 2).mul_f64(jitter.clamp(0.0, 1.0));
        jittered.max(retry_after.unwrap_or_default()).min(self.max)
    }
}

/// Where a keeper's calls stand: how many failed in a row, the last
/// failure's reason, and when the next call is due.
#[derive(Debug, Clone)]
pub struct Retrying {
    backoff: Backoff,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

impl Retrying {
    /// No call has failed yet.
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: 0,
            retry_at: None,
            last_error: None,
        }
    }

    /// Consecutive failed calls (0 after a success or when nothing is due).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// When the next call is due, if one waits for its backoff.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Why the last call failed, while calls keep failing.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Whether a failed call is still backing off at `now`: no call yet.
    pub fn backing_off(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| now < at)
    }

    /// Nothing is due any more (what is published is what is wanted):
    /// earlier failures no longer matter.
    pub fn clear(&mut self) {
        self.failures = 0;
        self.retry_at = None;
        self.last_error = None;
    }

    /// The next call is due at once, whatever the backoff says (the last
    /// call as the worker exits); the count of failures stays.
    pub fn retry_now(&mut self) {
        self.retry_at = None;
    }

    /// A call succeeded; returns how many failed before it.
    pub fn succeeded(&mut self) -> u32 {
        let failed_before = self.failures;
        self.clear();
        failed_before
    }

    /// A call failed at `now` with `error` (the service asking for
    /// `retry_after`); returns the delay before the next one.
    pub fn failed(
        &mut self,
        now: Instant,
        error: &dyn std::fmt::Display,
        retry_after: Option<Duration>,
    ) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = self
            .backoff
            .delay(self.failures, rand::random::<f64>(), retry_after);
        self.retry_at = Some(now + delay);
        self.last_error = Some(error.to_string());
        delay
    }

    /// When a keeper that looks again every `tick` should wake after a
    /// pass at `now`: at the tick, or sooner for a retry.
    pub fn wake(&self, now: Instant, tick: Duration) -> Instant {
        let tick = now + tick;
        self.retry_at.map_or(tick, |at| at.min(tick).max(now))
    }
}

/// Where the keepers report a condition that will not clear by itself:
/// the worker's metrics and its readiness's `degraded` reasons. The
/// default reports to nowhere (a keeper driven by hand, in a test).
#[derive(Clone, Default)]
pub struct KeeperReport {
    metrics: Metrics,
    readiness: Option<watch::Sender<Readiness>>,
}

impl KeeperReport {
    /// Reports into `metrics` and `readiness`.
    pub fn new(metrics: Metrics, readiness: watch::Sender<Readiness>) -> Self {
        Self {
            metrics,
            readiness: Some(readiness),
        }
    }

    /// The VM's protection is in `state`; `stuck` says why a release
    /// cannot clear, while it cannot.
    pub(crate) fn protection(&self, state: ProtectionState, stuck: Option<String>) {
        self.metrics.set_scale_in_protection(state);
        if let Some(readiness) = &self.readiness {
            set_degraded(readiness, DEGRADED_SCALE_IN_PROTECTION, stuck);
        }
    }

    /// Writes of the pod's deletion cost keep failing for the reason in
    /// `failing`, or (`None`) they do not.
    pub(crate) fn deletion_cost(&self, failing: Option<String>) {
        self.metrics
            .set_pod_deletion_cost_failing(failing.is_some());
        if let Some(readiness) = &self.readiness {
            set_degraded(readiness, DEGRADED_POD_DELETION_COST, failing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_table() {
        let b = Backoff::default();
        let s = Duration::from_secs;
        // (failures, jitter, retry_after, expected)
        let table = [
            (1, 0.0, None, s(2) + Duration::from_millis(500)),
            (1, 1.0, None, s(5)),
            (2, 1.0, None, s(10)),
            (3, 1.0, None, s(20)),
            (20, 1.0, None, s(300)),
            (u32::MAX, 0.5, None, s(225)),
            (1, 1.0, Some(s(60)), s(60)),
            (1, 1.0, Some(s(3600)), s(300)),
            (0, 2.0, None, s(5)),
        ];
        for (failures, jitter, retry_after, expected) in table {
            assert_eq!(
                b.delay(failures, jitter, retry_after),
                expected,
                "{failures} {jitter}"
            );
        }
    }

    #[test]
    fn failures_back_off_honour_retry_after_and_clear_on_success() {
        let start = Instant::now();
        let s = Duration::from_secs;
        let mut retrying = Retrying::new(Backoff::default());
        assert_eq!(retrying.wake(start, s(5)), start + s(5));
        let delay = retrying.failed(start, &"HTTP 429", Some(s(40)));
        assert_eq!(delay, s(40), "Retry-After honoured");
        assert!(retrying.backing_off(start + s(39)));
        assert!(!retrying.backing_off(start + s(40)));
        assert_eq!(retrying.wake(start, s(5)), start + s(5), "the tick first");
        assert_eq!(
            retrying.wake(start, s(60)),
            start + s(40),
            "the retry first"
        );
        retrying.failed(start + s(40), &"HTTP 403", None);
        assert_eq!(retrying.failures(), 2);
        assert_eq!(retrying.last_error(), Some("HTTP 403"));
        assert_eq!(retrying.succeeded(), 2);
        assert_eq!(retrying.failures(), 0);
        assert_eq!(retrying.retry_at(), None);
        assert_eq!(retrying.last_error(), None);
    }
}
