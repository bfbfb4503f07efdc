//! [`CheckpointNotes`]: what a delivery's checkpoint handles ran into, kept
//! for the consumer, which settles the delivery by it rather than by the
//! handler's error alone (a handler may wrap or swallow a `StorageError`).

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::StorageError;

use super::store_unreachable;

/// What one delivery's checkpoint handles ran into.
///
/// A conflict is noted per key and explains only itself: a handler that
/// lost a write on some key, then wrote that key successfully (it reloaded
/// and moved on), is no longer fenced out on it, and a conflict on another
/// key than the job's own says nothing about the job.
#[derive(Debug, Default)]
pub struct CheckpointNotes {
    /// The job's own key ([`crate::Job::key`]); `None` before a handler
    /// ran, when nothing can have been written.
    job_key: Option<String>,
    /// Keys whose latest write lost to another writer, with no successful
    /// write on them since.
    conflicts: Mutex<BTreeSet<String>>,
    /// Why the store could not be reached: the job stopped for an outage,
    /// not for a fault of its own.
    pub unreachable: OnceLock<String>,
}

impl CheckpointNotes {
    /// Notes for the delivery of the job keyed `job_key`.
    pub fn for_job(job_key: impl Into<String>) -> Self {
        CheckpointNotes {
            job_key: Some(job_key.into()),
            ..CheckpointNotes::default()
        }
    }

    /// Notes `error` if it is one the consumer settles by: a conflict on
    /// its key, or (the first) unreachable store.
    pub fn note(&self, error: &StorageError) {
        match error {
            StorageError::Conflict { key } => {
                self.conflicts().insert(key.clone());
            }
            error if store_unreachable(error) => {
                let _ = self.unreachable.set(error.to_string());
            }
            _ => {}
        }
    }

    /// Notes a write on `key` that succeeded: a conflict noted on it
    /// before is resolved.
    pub fn note_written(&self, key: &str) {
        self.conflicts().remove(key);
    }

    /// Whether the delivery is fenced out of its own job: its latest write
    /// on the job's own key lost to another holder of the job.
    pub fn fenced_on_own_key(&self) -> bool {
        self.job_key
            .as_ref()
            .is_some_and(|key| self.conflicts().contains(key))
    }

    fn conflicts(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // Nothing panics while holding it: the set stays consistent.
        self.conflicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict(key: &str) -> StorageError {
        StorageError::Conflict { key: key.into() }
    }

    #[test]
    fn a_conflict_explains_only_itself() {
        enum Step {
            Lost(&'static str),
            Written(&'static str),
        }
        use Step::*;
        // (what the delivery's handles ran into, fenced out on "job")
        let rows: Vec<(Vec<Step>, bool)> = vec![
            (vec![], false),
            (vec![Lost("job")], true),
            (vec![Written("job")], false),
            // Resolved by a later successful write on the same key.
            (vec![Lost("job"), Written("job")], false),
            (vec![Lost("job"), Written("job"), Lost("job")], true),
            // Another key's conflict says nothing about the job.
            (vec![Lost("other")], false),
            (vec![Lost("job"), Written("other")], true),
            (vec![Lost("other"), Lost("job"), Written("other")], true),
        ];
        for (steps, fenced) in rows {
            let notes = CheckpointNotes::for_job("job");
            let mut seen = Vec::new();
            for step in steps {
                match step {
                    Lost(key) => {
                        notes.note(&conflict(key));
                        seen.push(format!("lost {key}"));
                    }
                    Written(key) => {
                        notes.note_written(key);
                        seen.push(format!("wrote {key}"));
                    }
                }
            }
            assert_eq!(notes.fenced_on_own_key(), fenced, "{seen:?}");
        }
    }

    #[test]
    fn notes_before_a_handler_ran_fence_nothing() {
        let notes = CheckpointNotes::default();
        notes.note(&conflict("job"));
        assert!(!notes.fenced_on_own_key());
    }

    #[test]
    fn an_unreachable_store_is_noted_once() {
        let notes = CheckpointNotes::for_job("job");
        for message in ["first", "second"] {
            notes.note(&StorageError::Unavailable {
                message: message.into(),
            });
        }
        let noted = notes.unreachable.get().expect("noted");
        assert!(noted.contains("first"), "{noted}");
        assert!(!notes.fenced_on_own_key());
    }
}
