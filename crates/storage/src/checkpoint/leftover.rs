//! What a delivery leaves behind under its job's own checkpoint key, and
//! whether the consumer removes it once the job has succeeded.
//!
//! A checkpoint keyed by a message id can never be read again once that
//! message is deleted, and progress of a job that succeeded resumes nothing:
//! left in place, either would show as "in progress" for ever (`spot-worker
//! status`). The delivery knows whether anything is there (its handles read
//! or wrote it, or the consumer's completed check read it), so removing it
//! costs a request only when a checkpoint exists, and Delete Blob is not
//! billed. A completed checkpoint under a key from the body stays: it is
//! what tells a duplicate message that the job is done (the storage
//! retention rule removes it after the queue's message time-to-live, see
//! docs/storage.md).

use std::sync::{Arc, Mutex};

use super::Checkpoint;
use crate::files::{ChunkIndex, ChunkStore};

/// The state of a checkpoint as far as this delivery knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Never seen to exist, and never written.
    Nothing,
    /// In progress, or a write was attempted whose outcome is unknown.
    InProgress,
    /// Completed.
    Completed,
}

impl Left {
    fn of(checkpoint: Option<&Checkpoint>) -> Self {
        match checkpoint {
            None => Left::Nothing,
            Some(Checkpoint::InProgress { .. }) => Left::InProgress,
            Some(Checkpoint::Completed { .. }) => Left::Completed,
        }
    }
}

/// Whether a checkpoint left as `left` is deleted once its job succeeded
/// (the message is deleted).
pub fn remove_after_success(keyed_by_message_id: bool, left: Left) -> bool {
    match left {
        // Nothing to remove: no request.
        Left::Nothing => false,
        // Progress of a finished job resumes nothing, whatever its key.
        Left::InProgress => true,
        // A completion marker under a body key answers duplicates; one
        // under a message id answers nobody once the message is gone.
        Left::Completed => keyed_by_message_id,
    }
}

/// The job's own checkpoint, as this delivery last saw or wrote it. Shared
/// by the delivery and every handle the handler opens on the job's key.
#[derive(Debug)]
pub struct Leftover {
    key: String,
    keyed_by_message_id: bool,
    left: Mutex<Left>,
    /// The chunks of the job's checkpoint files, as its handles last knew
    /// them: removed with the job's checkpoint once the job succeeded.
    files: Mutex<Option<LeftFiles>>,
}

/// The chunks a job's checkpoint files use.
struct LeftFiles {
    store: Arc<dyn ChunkStore>,
    index: Option<Arc<ChunkIndex>>,
    unnamed: Vec<String>,
}

impl std::fmt::Debug for LeftFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeftFiles")
            .field("unnamed", &self.unnamed.len())
            .finish_non_exhaustive()
    }
}

impl Leftover {
    /// Tracks the checkpoint under `key`; `keyed_by_message_id` when the
    /// key is the message's id (nobody can read it after the delete).
    pub fn new(key: String, keyed_by_message_id: bool) -> Self {
        Leftover {
            key,
            keyed_by_message_id,
            left: Mutex::new(Left::Nothing),
            files: Mutex::new(None),
        }
    }

    /// The job's files use the chunks `index` names and `unnamed` (sent by
    /// saves no manifest written names) in `store`.
    pub(crate) fn files(
        &self,
        store: Arc<dyn ChunkStore>,
        index: Option<Arc<ChunkIndex>>,
        unnamed: Vec<String>,
    ) {
        *self
            .files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(LeftFiles {
            store,
            index,
            unnamed,
        });
    }

    /// The chunks the job's files use, and where, taken.
    pub fn take_files(&self) -> Option<(Arc<dyn ChunkStore>, Vec<String>)> {
        let files = self
            .files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()?;
        let mut names = files.unnamed;
        if let Some(index) = files.index {
            names.extend(index.names());
        }
        Some((files.store, names))
    }

    /// The key it tracks.
    pub fn key(&self) -> &str {
        &self.key
    }

    fn set(&self, update: impl FnOnce(Left) -> Left) {
        let mut left = self
            .left
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *left = update(*left);
    }

    /// A read returned `checkpoint`.
    pub fn saw(&self, checkpoint: Option<&Checkpoint>) {
        self.set(|_| Left::of(checkpoint));
    }

    /// A read found it completed.
    pub fn saw_completed(&self) {
        self.set(|_| Left::Completed);
    }

    /// A write is about to be made: whatever its answer, it may land.
    pub fn writing(&self) {
        self.set(|left| match left {
            Left::Nothing => Left::InProgress,
            known => known,
        });
    }

    /// A write of `checkpoint` landed.
    pub fn wrote(&self, checkpoint: &Checkpoint) {
        self.saw(Some(checkpoint));
    }

    /// What is left now.
    pub fn left(&self) -> Left {
        *self
            .left
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the consumer removes it now that the job succeeded.
    pub fn remove_after_success(&self) -> bool {
        remove_after_success(self.keyed_by_message_id, self.left())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_checkpoint_nobody_can_use_is_removed() {
        // (keyed by the message id, left, removed)
        let table = [
            (true, Left::Nothing, false),
            (false, Left::Nothing, false),
            (true, Left::InProgress, true),
            (false, Left::InProgress, true),
            (true, Left::Completed, true),
            (false, Left::Completed, false),
        ];
        for (keyed_by_message_id, left, expected) in table {
            assert_eq!(
                remove_after_success(keyed_by_message_id, left),
                expected,
                "keyed by the message id: {keyed_by_message_id}, left: {left:?}"
            );
        }
    }

    #[test]
    fn a_write_whose_answer_is_unknown_counts_as_left() {
        let leftover = Leftover::new("job".into(), true);
        assert_eq!(leftover.left(), Left::Nothing);
        leftover.writing();
        assert_eq!(leftover.left(), Left::InProgress);
        let done = Checkpoint::Completed { result: json!(1) };
        leftover.wrote(&done);
        leftover.writing();
        assert_eq!(
            leftover.left(),
            Left::Completed,
            "an update keeps what is known"
        );
        leftover.saw(None);
        assert_eq!(leftover.left(), Left::Nothing);
    }
}
