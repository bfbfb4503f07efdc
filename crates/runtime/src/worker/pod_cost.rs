//! The worker's hook for its pod's deletion cost (issue 39, item 2): the
//! handler and the checkpoint store wrapped so that [`PodActivity`] sees
//! every job held and every save, and the task that keeps the cost.
//!
//! In the worker this is three lines: `wrap_handler` in `serve`,
//! `wrap_checkpoints` in `consumer`, `keep_pod_deletion_cost` beside the
//! other background tasks in `run_lifecycle`. Without a pod (no
//! `SPOT_WORKER_POD_NAME`, or `SPOT_WORKER_POD_DELETION_COST=false`) the
//! wrappers pass everything through and no task runs.

use std::sync::Arc;

use spot_worker_consumer::MessageHandler;
use spot_worker_decisions::deletion_cost::CostPolicy;
use spot_worker_storage::CheckpointStore;
use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::error::WorkerError;
use crate::keeper_retry::KeeperReport;
use crate::kubernetes_api::KubernetesPodCost;
use crate::pod_activity::{ActivityCheckpoints, ActivityHandler, PodActivity};
use crate::pod_deletion_cost::{Backoff, DeletionCostKeeper, DeletionCostTarget, keep};

/// What the worker holds for its pod's deletion cost.
#[derive(Default)]
pub(super) struct PodCost {
    /// Where the cost goes, when set in code
    /// ([`Worker::with_pod_deletion_cost`]); otherwise the settings' pod.
    target: Option<Arc<dyn DeletionCostTarget>>,
    /// Made when the worker runs, if it keeps a cost.
    activity: Option<PodActivity>,
}

impl PodCost {
    pub(super) fn wrap_handler<H: MessageHandler>(&self, handler: H) -> ActivityHandler<H> {
        ActivityHandler {
            inner: handler,
            activity: self.activity.clone(),
        }
    }

    pub(super) fn wrap_checkpoints(
        &self,
        store: Arc<dyn CheckpointStore>,
    ) -> Arc<dyn CheckpointStore> {
        match &self.activity {
            Some(activity) => Arc::new(ActivityCheckpoints {
                inner: store,
                activity: activity.clone(),
            }),
            None => store,
        }
    }
}

impl Worker {
    /// Keeps this worker's pod deletion cost through `target` instead of
    /// the Kubernetes API the settings name (for embedding and tests of
    /// the worker; a pod needs nothing but its settings).
    pub fn with_pod_deletion_cost(mut self, target: Arc<dyn DeletionCostTarget>) -> Self {
        self.pod_cost.target = Some(target);
        self
    }

    /// Starts keeping the pod's deletion cost, until `stop`, if this worker
    /// keeps one; an error (before any work is taken) when it should but
    /// cannot reach its API server (no token or CA mounted).
    pub(super) fn keep_pod_deletion_cost(
        &mut self,
        stop: CancellationToken,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, WorkerError> {
        let policy = self
            .config
            .pod
            .as_ref()
            .map_or_else(CostPolicy::default, |pod| CostPolicy {
                bucket: pod.step,
                min_interval: pod.step,
            });
        let target = match (&self.pod_cost.target, &self.config.pod) {
            (Some(target), _) => Arc::clone(target),
            (None, Some(pod)) => {
                let client = KubernetesPodCost::new(pod)?;
                tracing::info!(
                    pod = %pod.name, namespace = %pod.namespace,
                    "keeping this pod's deletion cost equal to its unsaved work"
                );
                Arc::new(client)
            }
            (None, None) => return Ok(None),
        };
        let activity = PodActivity::new();
        self.pod_cost.activity = Some(activity.clone());
        let keeper = DeletionCostKeeper::new(target, policy, Backoff::default()).with_report(
            KeeperReport::new(self.metrics.clone(), self.readiness.clone()),
        );
        Ok(Some(tokio::spawn(keep(
            keeper,
            activity,
            self.metrics.clone(),
            stop,
        ))))
    }
}
