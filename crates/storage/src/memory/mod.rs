//! In-memory implementations of [`MessageQueue`](crate::MessageQueue),
//! [`CheckpointStore`](crate::CheckpointStore) and
//! [`ResultStore`](crate::ResultStore) with the same semantics as Azure
//! Storage, for unit-testing handlers without a storage account. Each can be
//! switched off (`set_available(false)`) to simulate a storage outage.

mod checkpoint;
mod chunks;
mod delayed;
mod outage;
mod queue;
mod result;

pub use checkpoint::InMemoryCheckpointStore;
pub use chunks::InMemoryChunkStore;
pub use delayed::{DelayedCheckpointStore, LIST_PAGE};
pub use queue::{InMemoryQueue, StoredMessage};
pub use result::InMemoryResultStore;
