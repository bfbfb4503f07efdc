//! [`LifetimeLog`]: each worker's own record of its lifetime (a
//! [`LifetimeRecord`]: start, ready, busy, idle, draining, exit) in the
//! checkpoint store, under [`LifetimeLog::PREFIX`] and the worker's id.
//!
//! Unlike the fleet's counts ([`FleetLedger`](crate::FleetLedger)), which
//! every worker adds to in one document, each worker writes only its own
//! record, so a thousand workers never race: the first write creates it,
//! each later one replaces it with the ETag the last returned (one request
//! each). A conflict can only mean that a write of ours landed and its
//! answer was lost; the record is read for its ETag and written again.
//! The figures only grow, so the newest record is the whole story; the
//! reader (`spot-worker status`) lists the prefix and sums the records
//! with [`fleet_bill`](spot_worker_decisions::bill::fleet_bill).

use std::sync::{Arc, Mutex, PoisonError};

use spot_worker_decisions::bill::LifetimeRecord;

use crate::checkpoint::{Checkpoint, CheckpointStore, ETag, WritePrecondition};
use crate::error::StorageError;

/// How many times one write is tried (a conflict costs a read and another).
const MAX_ATTEMPTS: u32 = 3;

/// One worker's lifetime record in a checkpoint store.
#[derive(Debug)]
pub struct LifetimeLog {
    store: Arc<dyn CheckpointStore>,
    key: String,
    etag: Mutex<Option<ETag>>,
}

impl LifetimeLog {
    /// Where every worker's record is kept: this and the worker's id
    /// (`.spot-worker/fleet/workers/<id>`).
    pub const PREFIX: &'static str = ".spot-worker/fleet/workers/";

    /// The record of `worker` in `store` (an id made of letters, digits,
    /// `-`, `_` and `.`; anything else becomes `-`).
    pub fn for_worker(store: Arc<dyn CheckpointStore>, worker: &str) -> Self {
        LifetimeLog {
            store,
            key: Self::key_of(worker),
            etag: Mutex::new(None),
        }
    }

    /// The checkpoint key of `worker`'s record.
    pub fn key_of(worker: &str) -> String {
        let id: String = worker
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("{}{id}", Self::PREFIX)
    }

    /// The checkpoint key this record is kept under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Writes `record` over the last one: one request, unless a lost
    /// answer forces a read and a second write.
    pub async fn write(&self, record: &LifetimeRecord) -> Result<(), StorageError> {
        let progress = serde_json::to_value(record)
            .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
        let checkpoint = Checkpoint::InProgress { progress };
        for _ in 0..MAX_ATTEMPTS {
            let last = self
                .etag
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let precondition = match last {
                Some(etag) => WritePrecondition::IfMatch(etag),
                None => WritePrecondition::Create,
            };
            match self
                .store
                .write(&self.key, &checkpoint, precondition, None)
                .await
            {
                Ok(etag) => {
                    *self.etag.lock().unwrap_or_else(PoisonError::into_inner) = Some(etag);
                    return Ok(());
                }
                Err(StorageError::Conflict { .. }) => {
                    // Our own write landed unseen (no other worker writes
                    // this key): take its ETag and write again.
                    let stored = self.store.read(&self.key).await?;
                    *self.etag.lock().unwrap_or_else(PoisonError::into_inner) =
                        stored.map(|stored| stored.etag);
                }
                Err(other) => return Err(other),
            }
        }
        Err(StorageError::Conflict {
            key: self.key.clone(),
        })
    }

    /// Reads the record under `key` (as listed under [`Self::PREFIX`]).
    pub async fn read_key(
        store: &dyn CheckpointStore,
        key: &str,
    ) -> Result<Option<LifetimeRecord>, StorageError> {
        let Some(stored) = store.read(key).await? else {
            return Ok(None);
        };
        let invalid = |reason: String| StorageError::InvalidData {
            what: format!("worker lifetime record {key}"),
            reason,
        };
        let Checkpoint::InProgress { progress } = &stored.checkpoint else {
            return Err(invalid("a completed checkpoint, not a record".into()));
        };
        serde_json::from_value(progress.clone())
            .map(Some)
            .map_err(|e| invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::InMemoryCheckpointStore;
    use spot_worker_decisions::bill::Tally;
    use spot_worker_decisions::lanes::Lane;

    #[tokio::test]
    async fn a_worker_rewrites_its_own_record_and_it_reads_back() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let log = LifetimeLog::for_worker(store.clone(), "vm-1/42 at 7");
        assert_eq!(log.key(), ".spot-worker/fleet/workers/vm-1-42-at-7");
        let mut tally = Tally::started(0);
        tally.ready(10_000);
        log.write(&tally.record("vm-1", "jobs", Lane::Spot, 20_000))
            .await
            .unwrap();
        tally.exited(30_000);
        let last = tally.record("vm-1", "jobs", Lane::Spot, 30_000);
        log.write(&last).await.unwrap();
        let read = LifetimeLog::read_key(store.as_ref(), log.key())
            .await
            .unwrap();
        assert_eq!(read, Some(last));
        assert_eq!(
            LifetimeLog::read_key(store.as_ref(), ".spot-worker/fleet/workers/none")
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn a_lost_answer_is_recovered_by_reading_the_etag() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let log = LifetimeLog::for_worker(store.clone(), "w");
        let record = Tally::started(0).record("w", "jobs", Lane::Regular, 5_000);
        // Our first write landed, but its answer was lost: the log does
        // not know the ETag and would try to create the record again.
        LifetimeLog::for_worker(store.clone(), "w")
            .write(&record)
            .await
            .unwrap();
        log.write(&record).await.unwrap();
        let read = LifetimeLog::read_key(store.as_ref(), log.key())
            .await
            .unwrap();
        assert_eq!(read, Some(record));
    }
}
