//! # spot-worker
//!
//! Queue workers for Azure Spot VMs and scale sets that drain cleanly on a
//! 30-second eviction notice.
//!
//! This crate is the facade users depend on; each part lives in its own crate
//! and is re-exported here:
//!
//! - [`runtime`]: the [`Worker`] users build: warmup gate, health endpoints,
//!   a drain that fits a Spot VM's 30 s eviction notice.
//! - [`imds`]: the Scheduled Events client, watcher and notice policy.
//! - [`settings`]: the one table of settings and where their values come
//!   from (flags, environment, the `SPOT_WORKER_CONFIG` file, defaults).
//! - [`storage`]: the queue and checkpoint traits, the queue consumer, and
//!   in-memory implementations for unit tests (the crates
//!   `spot-worker-storage`, `spot-worker-consumer` and `spot-worker-lanes`
//!   under one name; docs/architecture.md says which holds what).
//! - [`decisions`]: the pure decisions they act on: the checkpoint interval
//!   and its estimators, the cost of a save, the goodput ledger, the lane
//!   of a job with a deadline.
//! - `azure` (default feature `azure`): Azure Storage Queue and Blob
//!   implementations of the storage traits.
//! - [`telemetry`]: `tracing` + OpenTelemetry export and the worker's metrics.
//! - `setup` (feature `azure`): the settings wired to logs, telemetry and
//!   Azure Storage; `Setup::from_env()` is a worker's one set-up call.
//! - `emulator` (feature `emulator`): an IMDS emulator for tests and demos.

pub use spot_worker_decisions as decisions;
pub use spot_worker_imds as imds;
pub use spot_worker_runtime as runtime;
pub use spot_worker_runtime::settings;
pub use spot_worker_telemetry as telemetry;

pub use spot_worker_runtime::{
    HandlerError, Job, MessageHandler, Permanent, Worker, WorkerConfig, handler_fn, permanent,
};

/// The store, the queue consumer and the deadline lanes under one name:
/// everything of `spot-worker-storage` (the queue, checkpoint, result,
/// lease and chunk stores, fenced documents, in-memory implementations),
/// the consumer's items from `spot-worker-consumer`, and
/// `spot-worker-lanes` as [`storage::lanes`](crate::storage::lanes).
pub mod storage {
    pub use spot_worker_consumer::{
        BodyBlob, COMPLETION_RECORD_MIN, CompletionRecord, Consumer, ConsumerConfig, ConsumerStats,
        DEFAULT_REFUSAL_GRACE, DeadlineObserver, DeadlineOutcome, DeliveryOutcome, DrainSignals,
        FnHandler, GoodputObserver, HandlerError, Job, MAX_POISON_MESSAGE_LEN, MessageHandler,
        MessageSpan, Permanent, PoisonRecord, ResultMarker, SettlementObserver, StoreHealth,
        handler_fn, permanent, poison_body_blob_name, poison_queue_name,
    };
    pub use spot_worker_lanes as lanes;
    pub use spot_worker_storage::*;
}

#[cfg(feature = "azure")]
pub mod setup;

#[cfg(feature = "azure")]
pub use setup::Setup;

#[cfg(feature = "azure")]
pub use spot_worker_azure as azure;

#[cfg(feature = "emulator")]
pub use spot_worker_imds_emulator as emulator;

/// The examples in README.md and docs/, compiled as doc tests so they
/// cannot rot.
#[cfg(doctest)]
mod doc_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../docs/deploying.md")]
    struct Deploying;
    #[doc = include_str!("../docs/imds.md")]
    struct Imds;
    #[doc = include_str!("../docs/lifecycle.md")]
    struct Lifecycle;
    #[doc = include_str!("../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/storage.md")]
    struct Storage;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
}
