//! [`SourceSlot`]: where an observable instrument finds the function it
//! reads at each export. The runtime sets it once it has one (the
//! checkpoint estimates, the switch cost, the worker's time); until then
//! the instrument reports nothing.

use std::sync::{Arc, Mutex, PoisonError};

/// A source `S` set later and read at each export; clones share it.
pub(crate) struct SourceSlot<S>(Arc<Mutex<Option<S>>>);

impl<S> Clone for SourceSlot<S> {
    fn clone(&self) -> Self {
        SourceSlot(Arc::clone(&self.0))
    }
}

impl<S> Default for SourceSlot<S> {
    fn default() -> Self {
        SourceSlot(Arc::default())
    }
}

impl<S: Clone> SourceSlot<S> {
    /// Reads from `source` from now on (instead of any set before).
    pub(crate) fn set(&self, source: S) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// The source, if one was set; cloned, so that it is called without
    /// the lock held.
    pub(crate) fn get(&self) -> Option<S> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_sees_the_source_set_later_and_the_latest_one() {
        let slot: SourceSlot<u8> = SourceSlot::default();
        let reader = slot.clone();
        assert_eq!(reader.get(), None);
        slot.set(1);
        assert_eq!(reader.get(), Some(1));
        slot.set(2);
        assert_eq!(reader.get(), Some(2));
    }
}
