//! # spot-worker-storage
//!
//! The storage side of a spot-worker, independent of any cloud SDK:
//!
//! - [`MessageQueue`]: receive with a visibility timeout, renew (new pop
//!   receipt), delete, send.
//! - [`CheckpointStore`]: small per-job documents whose every write is fenced
//!   by an ETag ([`WritePrecondition`]), failing with
//!   [`StorageError::Conflict`]; [`JobCheckpoint`] carries the ETag for you.
//! - [`ResultStore`]: create-only job results; writing the same result
//!   twice is fine, a different one is a [`StorageError::Conflict`].
//!   Handlers write them through `Job::results` ([`FencedResults`]), so
//!   nothing is written for a delivery after its message was released.
//! - [`attempts`]: each message's durable attempt record (failures,
//!   releases, looks), which decides poisoning; read and written by the
//!   consumer (`spot-worker-consumer`) and the lane keeper
//!   (`spot-worker-lanes`).
//! - [`InMemoryQueue`], [`InMemoryCheckpointStore`] and
//!   [`InMemoryResultStore`]: the same semantics in memory, to unit-test
//!   handlers, with a switch to simulate an outage (`set_available`). The
//!   Azure implementations live in `spot-worker-azure`.
//! - [`FleetLedger`]: the fleet's interruption counts, which the checkpoint
//!   interval rests on, kept in the checkpoint store.
//! - [`LeaseStore`]: named leases that run out (the lane keeper's turn).
//!
//! The decisions these act on (the checkpoint interval, the cost of a
//! save, the goodput ledger) are pure arithmetic in
//! `spot-worker-decisions`; this crate reads and writes what they need.
//!
//! The queue consumer (`spot-worker-consumer`) and the deadline lanes
//! (`spot-worker-lanes`) are built on this crate; it knows neither. The
//! names of their records ([`WORKER_RECORDS`], [`reserved_job_key`]) are
//! kept here, because the store's rules about what a job may use rest on
//! them.
//!
//! Every store has a `prepare` method (create what is missing, prove this
//! worker can write) for a worker's warmup gate to call before it takes work.

pub mod attempts;
pub mod backoff;
mod checkpoint;
mod clock;
mod encoding;
mod error;
mod fenced_json;
mod fenced_results;
pub mod files;
mod fleet_document;
mod fleet_ledger;
mod lease_store;
mod lifetime_retention;
pub mod memory;
mod message_id;
mod queue;
mod reserved;
mod result;
pub mod result_blocks;
mod save_trouble;
mod text;
mod worker_lifetime;
mod worker_records;

pub use attempts::FailingJob;
pub use checkpoint::{
    Blocking, Checkpoint, CheckpointNotes, CheckpointStore, Committed, DatedAnew, ETag,
    JobCheckpoint, Left, Leftover, SaveClock, StoredCheckpoint, WritePrecondition, date_anew,
    remove_after_success, spawn_removal, store_unreachable,
};
pub use clock::{Clock, SystemClock};
pub use encoding::{DecodeError, MessageEncoding, check_sendable, unsendable_char};
pub use error::StorageError;
pub use fenced_json::FencedJson;
pub use fenced_results::FencedResults;
pub use fleet_document::{Figures, FleetDocument, FleetShare};
pub use fleet_ledger::FleetLedger;
pub use lease_store::{InMemoryLeases, LeaseId, LeaseStore, MAX_LEASE, MIN_LEASE};
pub use lifetime_retention::CLEAN_LIFETIMES_AT_MOST;
pub use memory::{
    DelayedCheckpointStore, InMemoryCheckpointStore, InMemoryChunkStore, InMemoryQueue,
    InMemoryResultStore, StoredMessage,
};
pub use queue::{
    MAX_RECEIVE_BATCH, MessageId, MessageQueue, PopReceipt, QueueMessage, VisibleMessage,
};
pub use reserved::{
    ENVELOPE_PREFIX, PROBE_BODY, PROBE_PREFIX, Reserved, WORKER_RECORDS_PREFIX,
    refuse_reserved_body, refuse_reserved_key, reserved_body, reserved_job_key,
};
pub use result::{PutOutcome, ResultStore, WHOLE_RESULT_MAX, read_whole};
pub use result_blocks::{BlockBlobs, BlockResults};
pub use save_trouble::{SAVE_TROUBLE_PREFIX, SaveTrouble, SaveTroubleKind};
pub use text::{shorten_keeping_ends, truncate_at_char_boundary};
pub use worker_lifetime::LifetimeLog;
pub use worker_records::{
    ATTEMPT_RECORD_PREFIX, COMPLETION_RECORD_PREFIX, KEEPER_LEASE, LANE_RECORD_PREFIX,
    SPOT_CAPACITY_KEY, SPOT_SIGHTINGS_PREFIX, SWITCH_COST_KEY, WORKER_RECORDS,
};

// Re-exported so users name the same types the traits use.
pub use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;
