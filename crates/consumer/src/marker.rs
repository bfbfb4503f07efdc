//! [`ResultMarker`]: a create-only result that is itself the job's
//! completion marker, so a finished job costs no checkpoint write and its
//! first delivery no checkpoint read (see
//! [`MessageHandler::completion_marker`](super::MessageHandler::completion_marker)).

use std::fmt;
use std::sync::Arc;

use spot_worker_storage::ResultStore;
use spot_worker_storage::store_unreachable;

use super::Consumer;
use super::in_flight::Delivery;
use super::job::CheckpointRead;
use super::pre_check::PreCheck;

/// Where a handler writes a job's result, create-only, once the job is
/// done: the result's existence means the job is completed, and its bytes
/// (a JSON document) are what [`MessageHandler::verify_completed`](super::MessageHandler::verify_completed)
/// checks a duplicate against.
///
/// ```
/// use std::sync::Arc;
/// use spot_worker_consumer::ResultMarker;
/// use spot_worker_storage::InMemoryResultStore;
///
/// let marker = ResultMarker::new(Arc::new(InMemoryResultStore::new("results")), "j1.json");
/// assert_eq!(marker.name(), "j1.json");
/// ```
#[derive(Clone)]
pub struct ResultMarker {
    store: Arc<dyn ResultStore>,
    name: String,
}

impl fmt::Debug for ResultMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResultMarker")
            .field("store", &self.store.name())
            .field("name", &self.name)
            .finish()
    }
}

impl ResultMarker {
    /// The result `name` in `store`.
    pub fn new(store: Arc<dyn ResultStore>, name: impl Into<String>) -> Self {
        ResultMarker {
            store,
            name: name.into(),
        }
    }

    /// The result's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store it is written to.
    pub fn store(&self) -> &Arc<dyn ResultStore> {
        &self.store
    }
}

impl Consumer {
    /// Whether the job's result marker exists, after its checkpoint was
    /// read as `latest` (not completed). One read, under the lease: an
    /// unreachable store waits uncounted like a checkpoint outage; a result
    /// that is not JSON cannot be checked against the message and counts as
    /// a failure.
    pub(super) async fn check_marker(
        &self,
        marker: &ResultMarker,
        delivery: &Delivery,
        latest: CheckpointRead,
    ) -> PreCheck {
        let read = tokio::select! {
            biased;
            () = delivery.lease.lost() => return PreCheck::Interrupted,
            () = delivery.job_token.cancelled() => return PreCheck::Interrupted,
            read = marker.store.get(&marker.name) => read,
        };
        let what = || format!("the result {}/{}", marker.store.name(), marker.name);
        match read {
            Ok(None) => PreCheck::NotCompleted(latest),
            Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
                Ok(result) => PreCheck::Completed(result),
                Err(error) => PreCheck::Failed(spot_worker_storage::StorageError::InvalidData {
                    what: what(),
                    reason: error.to_string(),
                }),
            },
            Err(error) if store_unreachable(&error) => {
                PreCheck::Unreachable(format!("reading {} failed: {error}", what()))
            }
            Err(error) => PreCheck::Failed(error),
        }
    }
}
