//! # spot-worker-storage
//!
//! The storage side of a spot-worker, independent of any cloud SDK:
//!
//! - [`MessageQueue`]: receive with a visibility timeout, renew (new pop
//!   receipt), delete, send.
//! - [`CheckpointStore`]: small per-job documents whose every write is fenced
//!   by an ETag ([`WritePrecondition`]), failing with
//!   [`StorageError::Conflict`]; [`JobCheckpoint`] carries the ETag for you.
//! - [`Consumer`]: batches, a concurrency limit, idle backoff with jitter, a
//!   renewed lease per message, settle (delete / retry / poison) and release
//!   on shutdown, for any [`MessageHandler`].
//! - [`InMemoryQueue`] and [`InMemoryCheckpointStore`]: the same semantics in
//!   memory, to unit-test handlers. The Azure implementations live in
//!   `spot-worker-azure`.

mod checkpoint;
mod consumer;
mod encoding;
mod error;
pub mod memory;
mod queue;

pub use checkpoint::{Checkpoint, CheckpointStore, ETag, JobCheckpoint, WritePrecondition};
pub use consumer::{
    Consumer, ConsumerConfig, ConsumerStats, FnHandler, HandlerError, Job, MessageHandler,
    PoisonRecord, ShutdownSignals, handler_fn, poison_queue_name,
};
pub use encoding::{DecodeError, MessageEncoding};
pub use error::StorageError;
pub use memory::{InMemoryCheckpointStore, InMemoryQueue, StoredMessage};
pub use queue::{MAX_RECEIVE_BATCH, MessageId, MessageQueue, PopReceipt, QueueMessage};

// Re-exported so users name the same types the traits use.
pub use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;
