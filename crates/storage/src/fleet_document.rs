//! [`FleetDocument`]: one small JSON document of figures the whole fleet
//! adds to, kept in the checkpoint store as an in-progress checkpoint. A
//! worker adds what it saw with an ETag-fenced read and rewrite; losing a
//! race to another worker's addition means waiting a jittered, growing
//! while (so that writers who collided do not collide again in step) and
//! reading again, so no addition is lost or counted twice. The figures
//! only grow: adding is the whole merge.
//!
//! The fleet's interruption counts ([`FleetLedger`](crate::FleetLedger)),
//! its switch cost (the lanes' d) and its Spot sightings' history and
//! probes (`lanes/spot_capacity/fleet.rs`; each worker's notes are records
//! of its own, `notes.rs`) are kept this way. A worker keeps its share of
//! a document in step with the fleet's with [`FleetDocument::keep`].

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use spot_worker_decisions::cadence::{CheckpointCadence, InterruptionCounts};
use spot_worker_decisions::lanes::SwitchSamples;
use tokio_util::sync::CancellationToken;

use crate::backoff::retry_delay;
use crate::checkpoint::{CheckpointStore, ETag};
use crate::error::StorageError;
use crate::fenced_json::FencedJson;

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
    key: Cow<'static, str>,
    what: &'static str,
    figures: PhantomData<fn() -> T>,
}

impl<T> Clone for FleetDocument<T> {
    fn clone(&self) -> Self {
        FleetDocument {
            store: Arc::clone(&self.store),
            key: self.key.clone(),
            what: self.what,
            figures: PhantomData,
        }
    }
}

/// Figures a fleet adds to: they only grow, and adding is the whole merge.
pub trait Figures: Default + Serialize + DeserializeOwned + Send + Sync {
    /// These and `other`.
    fn plus(&self, other: &Self) -> Self;
    /// True if there is nothing to add.
    fn is_empty(&self) -> bool;
}

impl Figures for InterruptionCounts {
    fn plus(&self, other: &Self) -> Self {
        InterruptionCounts::plus(self, other)
    }
    fn is_empty(&self) -> bool {
        InterruptionCounts::is_empty(self)
    }
}

impl Figures for SwitchSamples {
    fn plus(&self, other: &Self) -> Self {
        SwitchSamples::plus(self, other)
    }
    fn is_empty(&self) -> bool {
        SwitchSamples::is_empty(self)
    }
}

/// One worker's share of a fleet document: what it saw and has not added
/// yet, and the fleet's figures as it last read them.
pub trait FleetShare<T>: Send + Sync {
    /// Logged when the first read fails, saying what the worker estimates
    /// from meanwhile.
    const READ_FAILED: &'static str;
    /// Logged when an addition fails (what failed is given back).
    const ADD_FAILED: &'static str;
    /// What this worker saw since its last addition, taken to be added.
    fn take_pending(&self) -> T;
    /// `pending`, taken but not added, to go with the next addition.
    fn give_back(&self, pending: T);
    /// The fleet's figures as just read back.
    fn set_fleet(&self, fleet: T);
}

impl FleetShare<InterruptionCounts> for CheckpointCadence {
    const READ_FAILED: &'static str = "could not read the fleet's interruption counts; estimating from this worker's alone until the next addition";
    const ADD_FAILED: &'static str =
        "could not add to the fleet's interruption counts; adding with the next";
    fn take_pending(&self) -> InterruptionCounts {
        CheckpointCadence::take_pending(self)
    }
    fn give_back(&self, pending: InterruptionCounts) {
        CheckpointCadence::give_back(self, pending);
    }
    fn set_fleet(&self, fleet: InterruptionCounts) {
        CheckpointCadence::set_fleet(self, fleet);
    }
}

impl<T> FleetDocument<T>
where
    T: Default + Serialize + DeserializeOwned,
{
    /// The document under `key` in `store`; `what` names it in errors.
    pub fn new(store: Arc<dyn CheckpointStore>, key: &'static str, what: &'static str) -> Self {
        Self::under(store, Cow::Borrowed(key), what)
    }

    /// As [`FleetDocument::new`], under a key made at run time (one
    /// queue's).
    pub fn under(
        store: Arc<dyn CheckpointStore>,
        key: Cow<'static, str>,
        what: &'static str,
    ) -> Self {
        FleetDocument {
            store,
            key,
            what,
            figures: PhantomData,
        }
    }

    /// The checkpoint key the figures are kept under.
    pub fn key(&self) -> &str {
        &self.key
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
            let (current, etag) = self.read_stored().await?;
            let Some(sum) = change(&current) else {
                return Ok(current);
            };
            match self
                .document()
                .write(&*self.store, etag.as_ref(), &sum)
                .await
            {
                Ok(_) => return Ok(sum),
                Err(StorageError::Conflict { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(StorageError::Conflict {
            key: self.key.clone().into_owned(),
        })
    }

    fn document(&self) -> FencedJson<'_> {
        FencedJson {
            key: &self.key,
            what: self.what,
            kind: "figures",
        }
    }

    async fn read_stored(&self) -> Result<(T, Option<ETag>), StorageError> {
        Ok(match self.document().read(&*self.store).await? {
            Some((figures, etag)) => (figures, Some(etag)),
            None => (T::default(), None),
        })
    }
}

impl<T: Figures> FleetDocument<T> {
    /// Adds `delta` and returns the sum, retrying after a concurrent
    /// addition. Adding nothing is a read.
    pub async fn add_figures(&self, delta: &T) -> Result<T, StorageError> {
        self.update(|current| (!delta.is_empty()).then(|| current.plus(delta)))
            .await
    }

    /// Keeps `share` and the fleet's figures in step until `stop` is
    /// cancelled: reads them at once, adds the share's new figures every
    /// `every` (reading back the sum; with nothing to add, only reading),
    /// and once more when stopped if there is anything left, within
    /// `last_add` (a worker that stops after a drain has little time
    /// left). An addition that fails is logged and given back to `share`,
    /// to go with the next; nothing is counted twice.
    pub async fn keep<S: FleetShare<T>>(
        &self,
        share: &S,
        every: Duration,
        stop: CancellationToken,
        last_add: Duration,
    ) {
        match stop.run_until_cancelled(self.read()).await {
            Some(Ok(fleet)) => share.set_fleet(fleet),
            Some(Err(error)) => tracing::warn!(%error, "{}", S::READ_FAILED),
            None => {}
        }
        // Bounded by `stop`: each turn waits `every` or returns.
        loop {
            let stopped = tokio::select! {
                () = stop.cancelled() => true,
                () = tokio::time::sleep(every) => false,
            };
            let pending = share.take_pending();
            if stopped && pending.is_empty() {
                return;
            }
            let added = if stopped {
                tokio::time::timeout(last_add, self.add_figures(&pending))
                    .await
                    .unwrap_or_else(|_| {
                        Err(StorageError::Unavailable {
                            message: format!("no answer within {last_add:?}"),
                        })
                    })
            } else {
                self.add_figures(&pending).await
            };
            match added {
                Ok(fleet) => share.set_fleet(fleet),
                Err(error) => {
                    tracing::warn!(%error, "{}", S::ADD_FAILED);
                    share.give_back(pending);
                }
            }
            if stopped {
                return;
            }
        }
    }
}
