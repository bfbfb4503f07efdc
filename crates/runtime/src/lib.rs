//! # spot-worker-runtime
//!
//! The framework users write against: a [`Worker`] that takes messages from a
//! queue only once a warmup gate is open, runs a handler on each with bounded
//! concurrency, and drains well inside a Spot VM's 30-second eviction notice.
//!
//! It depends on traits only: the Scheduled Events watcher from
//! `spot-worker-imds`, the queue and checkpoint traits from
//! `spot-worker-storage` (Azure implementations live in `spot-worker-azure`),
//! and the instruments of `spot-worker-telemetry`.
//!
//! - [`config`]: settings from code, environment and an optional TOML file;
//! - `gate`: the warmup gate (IMDS, storage, the application's warmup);
//! - [`health`]: `/healthz` and `/readyz`;
//! - [`shutdown`]: triggers, the drain plan and the watchdog;
//! - `metered`: spans and metrics around the storage traits and the handler;
//! - `store_health`: a refusing checkpoint store as readiness and a metric;
//! - `rendezvous`: the workers on one VM, so none approves before all drained;
//! - [`activity`]: how many messages the worker holds, one signal to
//!   subscribe to;
//! - [`scale_in_protection`]: this VM kept out of a scale-in while it holds work;
//! - [`pod_deletion_cost`], [`pod_activity`], [`kubernetes_api`]: this pod's
//!   `controller.kubernetes.io/pod-deletion-cost` kept equal to its unsaved work;
//! - [`Worker`]: the lifecycle that ties them together.

pub mod activity;
mod after_drain;
pub mod config;
mod decorator;
mod error;
mod gate;
pub mod health;
pub mod keeper_retry;
pub mod kubernetes_api;
mod metered;
pub mod pod_activity;
pub mod pod_deletion_cost;
mod rendezvous;
pub mod scale_in_protection;
#[cfg(test)]
mod scripted;
pub mod shutdown;
mod store_health;
mod worker;

pub use activity::WorkerActivity;
pub use config::{
    DrainSettings, EXIT_MARGIN, ImdsSettings, LaneSettings, STOP_TIMEOUT, WorkerConfig,
};
pub use error::{ConfigError, WorkerError};
pub use gate::WarmupFn;
pub use health::{Gate, Readiness};
pub use shutdown::{DrainPlan, DrainTrigger, EXIT_GRACE, WATCHDOG_EXIT_CODE, interrupted};
/// What a user writes, next to the [`Worker`] that runs it: the handler
/// trait, the job it is given, and its errors (defined with the consumer
/// in `spot-worker-storage`).
pub use spot_worker_consumer::{
    HandlerError, Job, MessageHandler, Permanent, handler_fn, permanent,
};
/// The settings table and its sources, which [`WorkerConfig`] reads.
pub use spot_worker_settings::{self as settings, parse_duration};
pub use worker::{DrainReport, RunReport, Worker};
