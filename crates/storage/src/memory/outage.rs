//! The simulated outage switch every in-memory store carries, so tests of a
//! warmup gate or of retry logic can take "storage" down and bring it back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::StorageError;

/// Shared by clones of one store (like every client of one account sees the
/// same outage). Off by default: a new store is available.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outage {
    down: Arc<AtomicBool>,
}

impl Outage {
    pub(crate) fn set_available(&self, available: bool) {
        self.down.store(!available, Ordering::SeqCst);
    }

    pub(crate) fn is_available(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }

    /// `Err(Unavailable)` while the outage lasts; `what` names the store.
    pub(crate) fn check(&self, what: &str) -> Result<(), StorageError> {
        if self.is_available() {
            Ok(())
        } else {
            Err(StorageError::Unavailable {
                message: format!("{what} is unavailable (simulated outage)"),
            })
        }
    }
}
