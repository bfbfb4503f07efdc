//! How often a job checkpoints: exactly as often as the interruptions that
//! lose work make worthwhile (docs/checkpoint-interval.md).
//!
//! - [`daly`]: Daly's optimum interval from the cost of one save and the
//!   mean time between interruptions that lose work, clamped; pure.
//! - [`estimate`]: the interruption rates from a fleet's counts and a seed,
//!   as Gamma–Poisson and Beta posterior means; pure.
//! - [`counts`]: the counts by kind (saved at the notice, drained without a
//!   save after it, notice too late, no outcome) against the worker time
//!   observed, with the work the losing ones lost, which each worker adds
//!   to the fleet's every [`FLUSH_EVERY`].
//! - [`exposure`]: the running deliveries' job time, counted as it accrues.
//! - [`finite`]: the interval spread evenly over a job's remaining work,
//!   for a handler that knows it; pure.
//! - [`job_length`]: the lengths of the fleet's finished jobs, and the
//!   work a job that says nothing of its end is expected to have left;
//!   pure.
//! - [`pace`]: the time a job's rest takes at its pace so far; pure.
//! - [`policy`]: one worker's live interval, which handlers and the
//!   command runner ask whether a checkpoint is due.
//! - [`cost`]: what saves cost, measured as they happen ([`CheckpointCost`]),
//!   the C of the interval.
//!
//! The fleet's counts are kept in the checkpoint store by
//! `spot_worker_storage::FleetLedger`, which hands them to
//! [`CheckpointCadence::set_fleet`] and takes a worker's with
//! [`CheckpointCadence::take_pending`].

mod cost;
mod counts;
mod daly;
mod estimate;
mod exposure;
mod finite;
mod job_length;
mod pace;
mod policy;

pub use cost::{CheckpointCost, CostMeter, SaveCost};
pub use counts::{FLUSH_EVERY, Interruption, InterruptionCounts};
pub use daly::{MAX_INTERVAL, MIN_INTERVAL, clamped_interval, daly_interval_seconds};
pub use estimate::{
    DEFAULT_SEED_EVICTIONS_PER_HOUR, RateEstimates, SEED_WEIGHT_HOURS, beta_mean,
    gamma_poisson_mean,
};
pub use exposure::Exposure;
pub use finite::spread_over_job;
pub use job_length::{JobLengths, MIN_JOBS};
pub use pace::time_left;
pub use policy::{CadenceView, CheckpointCadence, IntervalSource, RunningJob, adaptive_interval};
