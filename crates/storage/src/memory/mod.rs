//! In-memory implementations of [`MessageQueue`](crate::MessageQueue) and
//! [`CheckpointStore`](crate::CheckpointStore) with the same semantics as
//! Azure Storage, for unit-testing handlers without a storage account.

mod checkpoint;
mod queue;

pub use checkpoint::InMemoryCheckpointStore;
pub use queue::{InMemoryQueue, StoredMessage};
