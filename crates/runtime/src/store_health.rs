//! Turns the consumer's [`StoreHealth`] into readiness and a metric: while
//! the checkpoint store refuses the worker or misses its container (and
//! the consumer has paused its intake), the `storage` gate of `/readyz` is
//! waiting with the reason, the worker reports not ready, and
//! `spot_worker.storage.refused` is 1 for that reason; all of it clears by
//! itself once the store answers again.

use spot_worker_consumer::StoreHealth;
use spot_worker_telemetry::{Metrics, StorageRefusal};
use tokio::sync::watch;

use crate::health::{Gate, Readiness};

/// Mirrors `health` into `readiness` and `metrics` until the consumer that
/// publishes it is gone.
pub(crate) async fn reflect(
    mut health: watch::Receiver<StoreHealth>,
    readiness: watch::Sender<Readiness>,
    metrics: Metrics,
) {
    loop {
        let current = health.borrow_and_update().clone();
        apply(&current, &readiness, &metrics);
        if health.changed().await.is_err() {
            return;
        }
    }
}

/// The storage gate and the refusal metric for `health`.
fn apply(health: &StoreHealth, readiness: &watch::Sender<Readiness>, metrics: &Metrics) {
    let gate = match health {
        StoreHealth::Healthy => Gate::Passed,
        problem => Gate::Waiting(problem.to_string()),
    };
    readiness.send_if_modified(|r| {
        let changed = r.storage != gate;
        r.storage = gate;
        changed
    });
    metrics.set_storage_refused(refusal(health));
    metrics.set_ready(readiness.borrow().is_ready());
}

fn refusal(health: &StoreHealth) -> Option<StorageRefusal> {
    match health.kind()? {
        "missing_container" => Some(StorageRefusal::MissingContainer),
        _ => Some(StorageRefusal::Refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusing_store_makes_the_worker_not_ready_with_the_reason_and_back() {
        let readiness = watch::channel(Readiness {
            imds: Gate::Skipped,
            storage: Gate::Passed,
            warmup: Gate::Skipped,
            ..Readiness::default()
        })
        .0;
        let metrics = Metrics::noop();
        let refused = StoreHealth::Refused {
            reason: "403 AuthorizationPermissionMismatch".into(),
        };
        apply(&refused, &readiness, &metrics);
        let now = readiness.borrow().clone();
        assert!(!now.is_ready());
        assert!(
            matches!(&now.storage, Gate::Waiting(detail) if detail.contains("AuthorizationPermissionMismatch")),
            "{now:?}"
        );
        assert_eq!(metrics.storage_refused(), Some(StorageRefusal::Refused));
        assert!(!metrics.is_ready());

        apply(&StoreHealth::Healthy, &readiness, &metrics);
        assert!(readiness.borrow().is_ready());
        assert_eq!(metrics.storage_refused(), None);
        assert!(metrics.is_ready());
    }
}
