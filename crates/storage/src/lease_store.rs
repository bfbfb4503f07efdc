//! [`LeaseStore`]: named leases with a time limit, so that one worker of a
//! fleet at a time does something (the lane keeper). Azure Blob Storage
//! has them built in (Lease Blob: a lease of 15 to 60 s on a blob, renewed
//! by its holder, free again when it runs out), which `BlobCheckpointStore`
//! implements on a blob of the checkpoint container; the in-memory store
//! keeps them on the tokio clock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::StorageError;

/// The shortest lease Azure Blob Storage grants.
pub const MIN_LEASE: Duration = Duration::from_secs(15);
/// The longest finite lease Azure Blob Storage grants.
pub const MAX_LEASE: Duration = Duration::from_secs(60);

/// The proof of a lease held, for renewing or giving it up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseId(String);

impl LeaseId {
    /// Wraps a lease id.
    pub fn new(id: impl Into<String>) -> Self {
        LeaseId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Named leases that run out unless renewed.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease `name` for `duration` ([`MIN_LEASE`] to
    /// [`MAX_LEASE`]) if nobody holds it: `Some` with its id, or `None`
    /// while another holder's lease runs.
    async fn acquire(
        &self,
        name: &str,
        duration: Duration,
    ) -> Result<Option<LeaseId>, StorageError>;

    /// Renews a lease held, for the duration it was taken for: `false` if
    /// it is no longer this holder's (it ran out and someone else took it).
    async fn renew(&self, name: &str, lease: &LeaseId) -> Result<bool, StorageError>;

    /// Gives a lease up at once, so another worker can take it; giving up
    /// one that is not held any more succeeds.
    async fn release(&self, name: &str, lease: &LeaseId) -> Result<(), StorageError>;
}

/// A lease held: its id, how long it lasts, until when it runs now.
type Held = (LeaseId, Duration, Instant);

/// Leases in memory, on the tokio clock (for unit tests). Clones share
/// them.
#[derive(Clone, Debug, Default)]
pub struct InMemoryLeases {
    held: Arc<Mutex<HashMap<String, Held>>>,
}

impl InMemoryLeases {
    /// No lease held.
    pub fn new() -> Self {
        Self::default()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl LeaseStore for InMemoryLeases {
    async fn acquire(
        &self,
        name: &str,
        duration: Duration,
    ) -> Result<Option<LeaseId>, StorageError> {
        check_duration(duration)?;
        let now = Instant::now();
        let mut held = self.held();
        if held.get(name).is_some_and(|(_, _, until)| *until > now) {
            return Ok(None);
        }
        let id = LeaseId::new(uuid::Uuid::new_v4().to_string());
        held.insert(name.to_owned(), (id.clone(), duration, now + duration));
        Ok(Some(id))
    }

    async fn renew(&self, name: &str, lease: &LeaseId) -> Result<bool, StorageError> {
        let now = Instant::now();
        let mut held = self.held();
        match held.get_mut(name) {
            // A lease that ran out may still be renewed while nobody
            // else took it, as Azure allows.
            Some((id, duration, until)) if id == lease => {
                *until = now + *duration;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, name: &str, lease: &LeaseId) -> Result<(), StorageError> {
        let mut held = self.held();
        if held.get(name).is_some_and(|(id, _, _)| id == lease) {
            held.remove(name);
        }
        Ok(())
    }
}

/// Refuses a duration Azure would refuse.
pub(crate) fn check_duration(duration: Duration) -> Result<(), StorageError> {
    if (MIN_LEASE..=MAX_LEASE).contains(&duration) {
        Ok(())
    } else {
        Err(StorageError::InvalidArgument(format!(
            "a lease lasts {MIN_LEASE:?} to {MAX_LEASE:?}, not {duration:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_holder_at_a_time_until_it_runs_out() {
        let leases = InMemoryLeases::new();
        let lease = Duration::from_secs(15);
        let mine = leases.acquire("keeper", lease).await.unwrap().unwrap();
        assert_eq!(leases.acquire("keeper", lease).await.unwrap(), None);
        // Another name is another lease.
        assert!(leases.acquire("other", lease).await.unwrap().is_some());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(leases.renew("keeper", &mine).await.unwrap());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(leases.acquire("keeper", lease).await.unwrap(), None);
        // Not renewed: it runs out, and someone else takes it.
        tokio::time::advance(Duration::from_secs(6)).await;
        let theirs = leases.acquire("keeper", lease).await.unwrap().unwrap();
        assert!(!leases.renew("keeper", &mine).await.unwrap());
        // Releasing a lease one lost changes nothing.
        leases.release("keeper", &mine).await.unwrap();
        assert_eq!(leases.acquire("keeper", lease).await.unwrap(), None);
        leases.release("keeper", &theirs).await.unwrap();
        assert!(leases.acquire("keeper", lease).await.unwrap().is_some());
        for bad in [Duration::from_secs(14), Duration::from_secs(61)] {
            assert!(leases.acquire("x", bad).await.is_err());
        }
    }
}
