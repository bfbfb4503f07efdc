//! Keeping the chunks a manifest names younger than the container's
//! retention rule, whatever the age of the job.
//!
//! The rule deletes blobs some days after their last write (Azure's
//! `daysAfterModificationGreaterThan`, at least 10). A chunk a save reuses
//! is not written again, so its date is its first upload's: a job that
//! runs, waits and runs again for longer than the retention would find
//! its oldest chunks gone. So every manifest carries `chunks_dated_since`,
//! a date no later than the last write of any blob it names (on the
//! store's clock, [`ChunkStore::now`]), and a save whose manifest would
//! carry one older than [`REFRESH_AFTER`] first touches every blob it
//! names ([`ChunkStore::touch`]: Set Blob Metadata, a write without the
//! bytes) and dates the manifest from before the first touch. A restore
//! does the same for the manifest it restored, so a job resumed after a
//! long wait keeps its chunks. Hence no blob a manifest names is more
//! than `REFRESH_AFTER` older than that manifest's write or its last
//! restore. The cost: one small request per blob, once every
//! `REFRESH_AFTER` of a job's life.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::error::StorageError;
use crate::files::ChunkStore;

/// How old a manifest's blobs may get before a save, a restore or a move
/// of its job's message (`waiting`) touches them: 3 days, so a manifest is
/// never more than 3 days younger than a blob it names and its chunks
/// outlive it by at least the retention less 3 days; the shortest
/// retention a deployment may set (10 days) is the messages' time-to-live
/// (7 days) plus this.
pub(crate) const REFRESH_AFTER: Duration = Duration::from_secs(3 * 24 * 3600);

/// The field of a manifest that dates its blobs.
const FIELD: &str = "chunks_dated_since";

/// How many touches run at once.
const TOUCHES_AT_ONCE: usize = 8;

/// The date a manifest's progress gives its blobs; `None` for a manifest
/// written before dates were kept (its blobs may be of any age).
pub(crate) fn dated_since(progress: &Value) -> Option<SystemTime> {
    let seconds = progress.get(FIELD)?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// `progress` (a manifest's) dated `since`, rounded down to the second.
pub(crate) fn dated(mut progress: Value, since: SystemTime) -> Value {
    let seconds = since
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    if let Some(fields) = progress.as_object_mut() {
        fields.insert(FIELD.to_owned(), seconds.into());
    }
    progress
}

/// Whether blobs dated `since` (`None`: unknown) must be touched at `now`.
pub(crate) fn needs_refresh(since: Option<SystemTime>, now: SystemTime) -> bool {
    match since {
        None => true,
        Some(since) => now
            .duration_since(since)
            .is_ok_and(|age| age > REFRESH_AFTER),
    }
}

/// The older of two dates, `None` (unknown) being the oldest.
pub(crate) fn older(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    Some(a?.min(b?))
}

/// Touches every blob of `names`, a few at a time: an error if any
/// failed, or is missing (a manifest naming it must not be written).
pub(crate) async fn touch_all(
    store: Arc<dyn ChunkStore>,
    names: Vec<String>,
) -> Result<(), StorageError> {
    use futures_util::StreamExt as _;
    let mut touches = futures_util::stream::iter(names)
        .map(|name| {
            let store = Arc::clone(&store);
            async move {
                match store.touch(&name).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(StorageError::InvalidData {
                        what: "checkpoint files".to_owned(),
                        reason: format!(
                            "the chunk {name} the checkpoint names is missing (deleted by hand, or by a retention rule shorter than 7 days)"
                        ),
                    }),
                    Err(error) => Err(error),
                }
            }
        })
        .buffer_unordered(TOUCHES_AT_ONCE);
    while let Some(touched) = touches.next().await {
        touched?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_touched_once_older_than_three_days_or_of_unknown_age() {
        let now = UNIX_EPOCH + Duration::from_secs(100 * 24 * 3600);
        let day = Duration::from_secs(24 * 3600);
        // (dated since, touched)
        let table = [
            (None, true),
            (Some(now), false),
            (Some(now - 3 * day), false),
            (Some(now - 3 * day - Duration::from_secs(1)), true),
            (Some(now - 30 * day), true),
            // A date ahead of the clock (another machine's): not old.
            (Some(now + day), false),
        ];
        for (since, touched) in table {
            assert_eq!(needs_refresh(since, now), touched, "{since:?}");
        }
    }

    #[test]
    fn the_date_round_trips_through_the_manifest_and_unknown_is_oldest() {
        let since = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let progress = dated(serde_json::json!({"format": "x"}), since);
        assert_eq!(dated_since(&progress), Some(since));
        assert_eq!(dated_since(&serde_json::json!({"format": "x"})), None);
        assert_eq!(older(Some(since), None), None);
        assert_eq!(
            older(Some(since), Some(since + Duration::from_secs(1))),
            Some(since)
        );
    }
}
