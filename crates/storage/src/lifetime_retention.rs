//! Workers' lifetime records are deleted after a retention
//! (`SPOT_WORKER_LIFETIME_RETENTION`, 30 days by default), so that the
//! fleet's records under [`LifetimeLog::PREFIX`] do not grow for ever and
//! `spot-worker status` lists what is worth reading.
//!
//! A record is expired when its worker last wrote it ([`seen_ms`]) longer
//! than the retention ago: a running worker writes its record every few
//! minutes, so only the records of workers long gone expire. A pass lists
//! the prefix and reads only the records whose name says the worker
//! started before the retention began (the runtime names a worker
//! `<host>-<pid>-<start ms>-<jitter>`: a record cannot have been written
//! before its worker started), or whose name says nothing of it; at most
//! `at_most` of them a pass. Deleting one unfenced loses nothing: a record
//! once expired is never written again by a live worker.
//!
//! [`seen_ms`]: spot_worker_decisions::bill::LifetimeRecord::seen_ms

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::checkpoint::CheckpointStore;
use crate::error::StorageError;
use crate::worker_lifetime::LifetimeLog;

/// The most records one pass reads (and so deletes): the rest wait for
/// the next pass.
pub const CLEAN_LIFETIMES_AT_MOST: usize = 50;

/// The start time (ms since the Unix epoch) a lifetime record's key names,
/// if it names one (`<host>-<pid>-<start ms>-<jitter>`).
fn started_ms_in(key: &str) -> Option<u64> {
    let id = key.strip_prefix(LifetimeLog::PREFIX)?;
    let mut parts = id.rsplit('-');
    let jitter = parts.next()?;
    let started = parts.next()?;
    let _pid: u32 = parts.next()?.parse().ok()?;
    if jitter.len() != 4 || !jitter.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    started.parse().ok()
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl LifetimeLog {
    /// Deletes the lifetime records in `store` last written more than
    /// `retention` before `now`, reading at most `at_most` records;
    /// returns the keys deleted. A record that cannot be read or deleted is
    /// logged and left for a later pass; only a failed listing is an error.
    pub async fn delete_expired(
        store: &dyn CheckpointStore,
        now: SystemTime,
        retention: Duration,
        at_most: usize,
    ) -> Result<Vec<String>, StorageError> {
        let now_ms = millis(now);
        let cutoff_ms =
            now_ms.saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        let keys = store.list(Self::PREFIX).await?;
        let candidates = keys
            .into_iter()
            .filter(|key| started_ms_in(key).is_none_or(|started| started < cutoff_ms))
            .take(at_most);
        let mut deleted = Vec::new();
        for key in candidates {
            let record = match Self::read_key(store, &key).await {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(error) => {
                    tracing::debug!(%error, key, "could not read a worker's lifetime record to judge its age; trying at a later pass");
                    continue;
                }
            };
            if record.seen_ms >= cutoff_ms {
                continue;
            }
            match store.delete(&key).await {
                Ok(()) => deleted.push(key),
                Err(error) => {
                    tracing::debug!(%error, key, "could not delete an expired lifetime record; deleting it at a later pass");
                }
            }
        }
        if !deleted.is_empty() {
            tracing::info!(
                deleted = deleted.len(),
                ?retention,
                "deleted workers' lifetime records older than the retention"
            );
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spot_worker_decisions::bill::Tally;
    use spot_worker_decisions::lanes::Lane;

    use super::*;
    use crate::memory::InMemoryCheckpointStore;

    const DAY_MS: u64 = 86_400_000;

    #[test]
    fn the_start_time_is_read_from_the_runtimes_names_only() {
        let key = |id: &str| format!("{}{id}", LifetimeLog::PREFIX);
        let table = [
            ("vm-1-4242-1700000000000-0a1f", Some(1_700_000_000_000)),
            ("host-with-dashes-1-5-beef", Some(5)),
            ("vm-1-4242-1700000000000-zzzz", None),
            ("vm-1-x-1700000000000-0a1f", None),
            ("by-hand", None),
            ("", None),
        ];
        for (id, expected) in table {
            assert_eq!(started_ms_in(&key(id)), expected, "{id}");
        }
        assert_eq!(started_ms_in("elsewhere/vm-1-1-5-beef"), None);
    }

    /// A record of a worker that started at `started_ms` and last wrote at
    /// `seen_ms`, under the name the runtime gives it.
    async fn write(
        store: &Arc<InMemoryCheckpointStore>,
        host: &str,
        started_ms: u64,
        seen_ms: u64,
    ) -> String {
        let worker = format!("{host}-7-{started_ms}-00ff");
        let log = LifetimeLog::for_worker(store.clone(), &worker);
        let record = Tally::started(started_ms).record(&worker, "jobs", Lane::Spot, seen_ms);
        log.write(&record).await.unwrap();
        log.key().to_owned()
    }

    #[tokio::test]
    async fn records_last_written_before_the_retention_are_deleted_a_bounded_number_a_pass() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let now = UNIX_EPOCH + Duration::from_millis(100 * DAY_MS);
        let retention = Duration::from_millis(30 * DAY_MS);
        // Gone 40 and 31 days ago; started 60 days ago but still writing
        // (a long-lived worker); started yesterday.
        let gone_long = write(&store, "a", 50 * DAY_MS, 60 * DAY_MS).await;
        let gone = write(&store, "b", 60 * DAY_MS, 69 * DAY_MS).await;
        let alive = write(&store, "c", 40 * DAY_MS, 100 * DAY_MS - 1).await;
        let young = write(&store, "d", 99 * DAY_MS, 99 * DAY_MS).await;

        let first = LifetimeLog::delete_expired(store.as_ref(), now, retention, 1)
            .await
            .unwrap();
        assert_eq!(first, [gone_long], "one a pass");
        let second = LifetimeLog::delete_expired(store.as_ref(), now, retention, 10)
            .await
            .unwrap();
        assert_eq!(second, [gone]);
        let left = store.list(LifetimeLog::PREFIX).await.unwrap();
        assert_eq!(left, [alive, young.clone()]);

        // A day on, nothing more; a month on, the worker gone since
        // yesterday's start goes too.
        let later = now + Duration::from_millis(DAY_MS);
        assert!(
            LifetimeLog::delete_expired(store.as_ref(), later, retention, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let much_later = now + Duration::from_millis(31 * DAY_MS);
        let third = LifetimeLog::delete_expired(store.as_ref(), much_later, retention, 10)
            .await
            .unwrap();
        assert!(third.contains(&young), "{third:?}");
    }
}
