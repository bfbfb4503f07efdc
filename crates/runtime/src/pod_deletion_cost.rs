//! Keeping this worker's pod's `controller.kubernetes.io/pod-deletion-cost`
//! equal to what a removal would lose (issue 39, item 2), so that a KEDA
//! scale-in removes an idle pod before a busy one, and among busy pods the
//! one with the least unsaved work.
//!
//! [`DeletionCostKeeper`] computes the cost from [`PodActivity`] and writes
//! it through a [`DeletionCostTarget`] (in a pod: a JSON merge patch of the
//! pod's annotations, [`crate::kubernetes_api`]) as
//! [`spot_worker_decisions::deletion_cost`] decides: quantised, at most once
//! a minute among busy values, at once between idle and busy.
//!
//! A failed write never holds up or loses a job: the job runs on, the
//! failure is logged and counted (`spot_worker.pod_deletion_cost.writes`
//! by result) and the write is retried with [`Backoff`] (honouring a
//! `Retry-After`; [`crate::keeper_retry`], the loop it shares with the
//! scale-in protection's keeper). The cost is only a preference for
//! scale-in; a pod whose cost is stale is ranked as it was. While writes
//! keep failing (a 403 for ever: the Role is missing) it is reported, not
//! cycled in silence: `spot_worker.pod_deletion_cost.failing` is 1 and
//! `/readyz` shows the reason under `degraded` (the pod stays ready).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use spot_worker_decisions::deletion_cost::{CostPolicy, Published, cost, should_publish};
use spot_worker_telemetry::Metrics;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::keeper_retry::Backoff;
use crate::keeper_retry::{KeeperReport, Retrying};
use crate::pod_activity::PodActivity;

/// Writes this pod's deletion cost.
#[async_trait]
pub trait DeletionCostTarget: Send + Sync {
    /// Sets the pod's `controller.kubernetes.io/pod-deletion-cost` to `cost`.
    async fn set(&self, cost: i32) -> Result<(), CostWriteError>;
}

/// A write of the deletion cost that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("writing the pod's deletion cost failed: {message}")]
pub struct CostWriteError {
    /// What went wrong, with its context (never the token).
    pub message: String,
    /// The HTTP status, if the API server answered.
    pub status: Option<u16>,
    /// How long the server asked us to wait (`Retry-After`), if it did.
    pub retry_after: Option<Duration>,
}

impl CostWriteError {
    /// The `result` attribute of the writes metric.
    pub fn result(&self) -> &'static str {
        match self.status {
            Some(429) => "throttled",
            Some(401 | 403) => "forbidden",
            Some(500..=599) => "server_error",
            Some(_) => "refused",
            None => "unreachable",
        }
    }
}

/// Follows the worker's activity and keeps its pod's deletion cost in step.
pub struct DeletionCostKeeper {
    target: Arc<dyn DeletionCostTarget>,
    policy: CostPolicy,
    last: Option<Published>,
    retrying: Retrying,
    report: KeeperReport,
}

impl DeletionCostKeeper {
    /// A keeper that has written nothing yet (its first pass writes, so a
    /// restarted worker clears a cost left by its previous run).
    pub fn new(target: Arc<dyn DeletionCostTarget>, policy: CostPolicy, backoff: Backoff) -> Self {
        Self {
            target,
            policy,
            last: None,
            retrying: Retrying::new(backoff),
            report: KeeperReport::default(),
        }
    }

    /// Reports whether writes keep failing to `report` after every pass of
    /// [`keep`] (by default to nowhere).
    pub fn with_report(mut self, report: KeeperReport) -> Self {
        self.report = report;
        self
    }

    /// Why the pod's cost cannot be kept, while writes keep failing, for
    /// `/readyz`'s `degraded` reasons.
    pub fn failing_reason(&self) -> Option<String> {
        (self.retrying.failures() > 0).then(|| {
            format!(
                "writing this pod's deletion cost failed {} time(s) in a row ({}); \
                 a scale-in ranks this pod by its last cost until a retry succeeds",
                self.retrying.failures(),
                self.retrying.last_error().unwrap_or("no reason given"),
            )
        })
    }

    /// The cost last written, and when.
    pub fn published(&self) -> Option<Published> {
        self.last
    }

    /// Consecutive failed writes.
    pub fn failures(&self) -> u32 {
        self.retrying.failures()
    }

    /// When a failed write is retried, if one waits for its backoff.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retrying.retry_at()
    }

    /// Writes the cost for what the worker holds at `now` if the policy
    /// says so and no failed write is backing off; at most one write.
    /// Returns the write's outcome, `None` if there was none.
    pub async fn reconcile(
        &mut self,
        activity: &PodActivity,
        now: Instant,
    ) -> Option<Result<i32, CostWriteError>> {
        let wanted = cost(activity.activity(now), &self.policy);
        if !should_publish(self.last, wanted, now, &self.policy) {
            self.retrying.clear();
            return None;
        }
        if self.retrying.backing_off(now) {
            return None;
        }
        match self.target.set(wanted).await {
            Ok(()) => {
                let after_failures = self.retrying.succeeded();
                if after_failures > 0 {
                    tracing::info!(
                        cost = wanted,
                        after_failures,
                        "pod deletion cost written after earlier failures"
                    );
                } else {
                    tracing::debug!(cost = wanted, "pod deletion cost written");
                }
                self.last = Some(Published {
                    cost: wanted,
                    at: now,
                });
                Some(Ok(wanted))
            }
            Err(error) => {
                let delay = self.retrying.failed(now, &error, error.retry_after);
                tracing::warn!(
                    %error, cost = wanted, failures = self.retrying.failures(), retry_in = ?delay,
                    "could not write this pod's deletion cost; scale-in ranks it by its last cost until a retry succeeds"
                );
                Some(Err(error))
            }
        }
    }
}

/// How often, at most, the keeper looks at the unsaved work when nothing
/// wakes it (more often with a finer policy): a new bucket is written
/// within seconds of the interval allowing it.
const TICK: Duration = Duration::from_secs(5);

impl DeletionCostKeeper {
    fn tick(&self) -> Duration {
        TICK.min(self.policy.min_interval.max(Duration::from_millis(100)))
    }
}

/// Runs `keeper` until `stop`: a pass when the worker turns busy or idle,
/// every tick otherwise, each write counted in `metrics`, and after each
/// pass whether writes keep failing told to the keeper's report
/// ([`DeletionCostKeeper::with_report`]).
pub async fn keep(
    mut keeper: DeletionCostKeeper,
    activity: PodActivity,
    metrics: Metrics,
    stop: CancellationToken,
) {
    loop {
        let now = Instant::now();
        match keeper.reconcile(&activity, now).await {
            Some(Ok(_)) => metrics.pod_deletion_cost_written("ok"),
            Some(Err(error)) => metrics.pod_deletion_cost_written(error.result()),
            None => {}
        }
        keeper.report.deletion_cost(keeper.failing_reason());
        let wake = keeper.retrying.wake(now, keeper.tick());
        tokio::select! {
            () = stop.cancelled() => return,
            () = activity.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Scripted = crate::scripted::Scripted<i32, CostWriteError>;

    #[async_trait]
    impl DeletionCostTarget for Scripted {
        async fn set(&self, cost: i32) -> Result<(), CostWriteError> {
            self.answer(cost)
        }
    }

    fn failure(status: u16, retry_after: Option<u64>) -> Result<(), CostWriteError> {
        Err(CostWriteError {
            message: format!("HTTP {status}"),
            status: Some(status),
            retry_after: retry_after.map(Duration::from_secs),
        })
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[tokio::test]
    async fn the_cost_follows_the_saves_within_the_rate_and_is_zero_when_idle() {
        let target = Arc::new(Scripted::default());
        let mut keeper =
            DeletionCostKeeper::new(target.clone(), CostPolicy::default(), Backoff::default());
        let activity = PodActivity::new();
        let start = Instant::now();
        let at = |s| start + S(s);
        keeper.reconcile(&activity, at(0)).await;
        let job = activity.taken("job", at(1));
        keeper.reconcile(&activity, at(1)).await;
        // Unsaved for 90 s: a new bucket, but the last write was 0 s ago.
        keeper.reconcile(&activity, at(50)).await;
        keeper.reconcile(&activity, at(91)).await;
        activity.saved("job", at(200));
        keeper.reconcile(&activity, at(205)).await;
        activity.settled(job, at(300));
        keeper.reconcile(&activity, at(300)).await;
        keeper.reconcile(&activity, at(900)).await;
        assert_eq!(target.calls(), [0, 1, 60, 1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_keep_failing_are_a_metric_and_a_degraded_reason_until_one_succeeds() {
        use crate::Gate;
        let target = Arc::new(Scripted::new(vec![
            failure(403, None),
            failure(403, None),
            failure(403, None),
        ]));
        let metrics = Metrics::noop();
        let readiness = tokio::sync::watch::channel(crate::Readiness {
            imds: Gate::Passed,
            storage: Gate::Passed,
            warmup: Gate::Skipped,
            ..crate::Readiness::default()
        })
        .0;
        let keeper =
            DeletionCostKeeper::new(target.clone(), CostPolicy::default(), Backoff::default())
                .with_report(KeeperReport::new(metrics.clone(), readiness.clone()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(
            keeper,
            PodActivity::new(),
            metrics.clone(),
            stop.clone(),
        ));
        for n in 1..=3 {
            target.until_calls_in_time(n).await;
            assert!(metrics.pod_deletion_cost_failing(), "after {n} 403s");
            let now = readiness.borrow().clone();
            let reason = now
                .degraded
                .get(crate::health::DEGRADED_POD_DELETION_COST)
                .expect("a degraded reason");
            assert!(reason.contains("HTTP 403"), "{reason}");
            assert!(reason.contains(&format!("failed {n} time")), "{reason}");
            assert!(now.is_ready(), "the pod still works");
        }
        target.until_calls_in_time(4).await;
        assert!(!metrics.pod_deletion_cost_failing());
        assert!(readiness.borrow().degraded.is_empty());
        stop.cancel();
        task.await.unwrap();
        assert_eq!(target.calls(), [0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn throttled_and_failing_writes_are_retried_after_their_backoff() {
        let target = Arc::new(Scripted::new(vec![
            failure(429, Some(40)),
            failure(500, None),
            failure(403, None),
        ]));
        let mut keeper =
            DeletionCostKeeper::new(target.clone(), CostPolicy::default(), Backoff::default());
        let activity = PodActivity::new();
        let start = Instant::now();
        let outcome = keeper.reconcile(&activity, start).await;
        assert_eq!(
            outcome.map(|r| r.map_err(|e| e.result())),
            Some(Err("throttled"))
        );
        let retry = keeper.retry_at().expect("a retry is due");
        assert!(retry >= start + S(40), "Retry-After honoured");
        assert!(keeper.reconcile(&activity, retry - S(1)).await.is_none());
        let outcome = keeper.reconcile(&activity, retry).await;
        assert_eq!(
            outcome.map(|r| r.map_err(|e| e.result())),
            Some(Err("server_error"))
        );
        let retry = keeper.retry_at().expect("another retry");
        let outcome = keeper.reconcile(&activity, retry).await;
        assert_eq!(
            outcome.map(|r| r.map_err(|e| e.result())),
            Some(Err("forbidden"))
        );
        assert_eq!(keeper.failures(), 3);
        let retry = keeper.retry_at().expect("and another");
        assert_eq!(keeper.reconcile(&activity, retry).await, Some(Ok(0)));
        assert_eq!(keeper.failures(), 0);
        assert_eq!(target.calls(), [0, 0, 0, 0]);
    }
}
