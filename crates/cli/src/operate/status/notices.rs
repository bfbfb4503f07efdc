//! What the notices saved, per queue: every queue whose fleet counts are in
//! the checkpoint container (`FleetLedger`, one document per queue), with
//! the share of its evictions whose drain saved at the notice and the work
//! an interruption that lost work lost, measured
//! (docs/checkpoint-interval.md). One listing, and one read per queue.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use serde::Serialize;
use spot_worker_azure::BlobCheckpointStore;
use spot_worker_decisions::cadence::InterruptionCounts;
use spot_worker_storage::{CheckpointStore, FleetLedger, StorageError};

/// One queue's notices.
#[derive(Debug, Serialize)]
pub(super) struct QueueNotices {
    queue: String,
    /// Evictions of every kind.
    evictions: u64,
    /// Saved at the notice.
    saved: u64,
    /// Drained in time without a save after the notice.
    unsaved: u64,
    /// Notices too late to save.
    late: u64,
    /// `saved / evictions`; `None` before the first eviction.
    saved_share: Option<f64>,
    /// Interruptions whose loss was measured, and the mean work they lost.
    losses: u64,
    lost_per_interruption_seconds: Option<f64>,
}

impl QueueNotices {
    pub(super) fn of(queue: &str, counts: &InterruptionCounts) -> Self {
        QueueNotices {
            queue: queue.to_owned(),
            evictions: counts.evictions(),
            saved: counts.drained,
            unsaved: counts.unsaved,
            late: counts.late,
            saved_share: counts.saved_share(),
            losses: counts.losses,
            lost_per_interruption_seconds: counts.mean_loss_seconds(),
        }
    }

    /// The line `status` prints.
    pub(super) fn line(&self) -> String {
        let saved = match self.saved_share {
            Some(share) => format!(
                "{:.1} % of notices saved ({} of {} evictions; {} drained without a save after the notice, {} too late)",
                share * 100.0,
                self.saved,
                self.evictions,
                self.unsaved,
                self.late
            ),
            None => "no eviction yet".to_owned(),
        };
        let lost = match self.lost_per_interruption_seconds {
            Some(seconds) => format!(
                "{seconds:.1} s of work lost per interruption that lost work ({} measured)",
                self.losses
            ),
            None => "no loss measured".to_owned(),
        };
        format!("  {:<24} {saved}; {lost}", self.queue)
    }
}

/// Every queue's notices, as the fleet documents in the container say; a
/// container not created yet has none, and a document that cannot be
/// read is said in its line rather than failing the screen.
pub(super) async fn notices_by_queue(store: &BlobCheckpointStore) -> Result<Vec<QueueNotices>> {
    let blobs = match store.list().await {
        Ok(blobs) => blobs,
        Err(StorageError::NotFound { .. } | StorageError::MissingContainer { .. }) => Vec::new(),
        Err(error) => return Err(error).context("listing the checkpoint container"),
    };
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let mut queues = Vec::new();
    for blob in blobs {
        let Some(queue) = blob.name.strip_prefix(FleetLedger::PREFIX) else {
            continue;
        };
        let counts = FleetLedger::for_queue(Arc::clone(&shared), queue)
            .read()
            .await
            .with_context(|| format!("reading the fleet counts of queue {queue}"))?;
        queues.push(QueueNotices::of(queue, &counts));
    }
    Ok(queues)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_decisions::cadence::Interruption;
    use std::time::Duration;

    #[test]
    fn a_queue_shows_the_share_of_notices_that_saved_and_what_the_rest_lost() {
        let mut counts = InterruptionCounts::default();
        assert_eq!(
            QueueNotices::of("jobs", &counts).line(),
            "  jobs                     no eviction yet; no loss measured"
        );
        for _ in 0..3 {
            counts.count(Interruption::Drained);
        }
        counts.count(Interruption::Unsaved);
        counts.count_loss(Duration::from_millis(2600));
        counts.count(Interruption::Late);
        counts.count_loss(Duration::from_millis(400));
        counts.count(Interruption::NoOutcome);
        let notices = QueueNotices::of("training", &counts);
        assert_eq!(
            notices.line(),
            "  training                 60.0 % of notices saved (3 of 5 evictions; 1 drained without a save after the notice, 1 too late); 1.5 s of work lost per interruption that lost work (2 measured)"
        );
    }
}
