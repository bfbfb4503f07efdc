//! [`FleetDocument`]: one small JSON document of figures the whole fleet
//! adds to, kept in the checkpoint store as an in-progress checkpoint. A
//! worker adds what it saw with an ETag-fenced read and rewrite; losing a
//! race to another worker's addition means waiting a jittered, growing
//! while (so that writers who collided do not collide again in step) and
//! reading again, so no addition is lost or counted twice. The figures
//! only grow: adding is the whole merge.
//!
//! The fleet's switch cost (the lanes' d) and its Spot sightings' history
//! and probes (`lanes/spot_capacity/fleet.rs`; each worker's notes are
//! records of its own, `notes.rs`) are kept this way.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::backoff::retry_delay;
use crate::checkpoint::{Checkpoint, CheckpointStore, StoredCheckpoint, WritePrecondition};
use crate::error::StorageError;

/// How many times an addition is tried before it gives up on losing
/// races: with [`RETRY_BASE`] and [`RETRY_MAX`], about 20 s of waiting,
/// within an eviction notice.
const MAX_ATTEMPTS: u32 = 16;

/// The wait after the first race lost; it doubles with each.
const RETRY_BASE: Duration = Duration::from_millis(20);

/// The longest wait between two attempts.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A document of `T` figures under one key.
#[derive(Debug)]
pub struct FleetDocument<T> {
    store: Arc<dyn CheckpointStore>,
    key: &'static str,
    what: &'static str,
    figures: PhantomData<fn() -> T>,
}

impl<T> Clone for FleetDocument<T> {
    fn clone(&self) -> Self {
        FleetDocument {
            store: Arc::clone(&self.store),
            key: self.key,
            what: self.what,
            figures: PhantomData,
        }
    }
}

impl<T> FleetDocument<T>
where
    T: Default + Serialize + DeserializeOwned,
{
    /// The document under `key` in `store`; `what` names it in errors.
    pub fn new(store: Arc<dyn CheckpointStore>, key: &'static str, what: &'static str) -> Self {
        FleetDocument {
            store,
            key,
            what,
            figures: PhantomData,
        }
    }

    /// The figures (the default if nothing was added yet).
    pub async fn read(&self) -> Result<T, StorageError> {
        Ok(self.read_stored().await?.0)
    }

    /// Adds `delta` to the figures with `plus` and returns the sum,
    /// retrying after a concurrent addition.
    pub async fn add(&self, delta: &T, plus: impl Fn(&T, &T) -> T) -> Result<T, StorageError> {
        self.update(|current| Some(plus(current, delta))).await
    }

    /// Rewrites the figures as `change` says (`None`: leave them as they
    /// are) and returns them, retrying after a concurrent change (after a
    /// jittered wait that doubles with each race lost).
    pub async fn update(&self, change: impl Fn(&T) -> Option<T>) -> Result<T, StorageError> {
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(retry_delay(
                    RETRY_BASE,
                    RETRY_MAX,
                    attempt,
                    &crate::clock::SystemClock,
                ))
                .await;
            }
            let (current, stored) = self.read_stored().await?;
            let Some(sum) = change(&current) else {
                return Ok(current);
            };
            let precondition = match stored {
                Some(stored) => WritePrecondition::IfMatch(stored.etag),
                None => WritePrecondition::Create,
            };
            let progress = serde_json::to_value(&sum)
                .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
            match self
                .store
                .write(
                    self.key,
                    &Checkpoint::InProgress { progress },
                    precondition,
                    None,
                )
                .await
            {
                Ok(_) => return Ok(sum),
                Err(StorageError::Conflict { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(StorageError::Conflict {
            key: self.key.to_owned(),
        })
    }

    async fn read_stored(&self) -> Result<(T, Option<StoredCheckpoint>), StorageError> {
        let Some(stored) = self.store.read(self.key).await? else {
            return Ok((T::default(), None));
        };
        let invalid = |reason: String| StorageError::InvalidData {
            what: format!("{} {}", self.what, self.key),
            reason,
        };
        let Checkpoint::InProgress { progress } = &stored.checkpoint else {
            return Err(invalid("a completed checkpoint, not figures".into()));
        };
        let figures =
            serde_json::from_value(progress.clone()).map_err(|e| invalid(e.to_string()))?;
        Ok((figures, Some(stored)))
    }
}
