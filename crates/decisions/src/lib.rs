//! # spot-worker-decisions
//!
//! The decisions a spot-worker takes, as pure arithmetic: what they rest
//! on goes in as values, the answer comes out, and every rule has its
//! table tests beside it. The crates that act on them call them: the
//! stores and the queue consumer (`spot-worker-storage`), the worker
//! (`spot-worker-runtime`), the program runner (`spot-worker-command`),
//! `spot-worker status`, and the benches, which replay the very same code
//! over real traces.
//!
//! - [`bill`]: the fleet's bill: each worker's paid time split into
//!   starting, busy, idle and draining ([`bill::Tally`]), and the workers'
//!   records summed by lane ([`bill::fleet_bill`]).
//! - [`cadence`]: how often a job checkpoints: Daly's interval from the
//!   measured cost of a save ([`cadence::CheckpointCost`]) and the fleet's
//!   interruption rates, their Gamma–Poisson and Beta estimators, the job
//!   time counted as it accrues, and the interval spread over a job's known
//!   end ([`cadence::CheckpointCadence`] holds one worker's live interval).
//! - [`deletion_cost`]: the value of a pod's
//!   `controller.kubernetes.io/pod-deletion-cost` from what its worker
//!   holds, and when to write it (within KEP-2255's advice on update rates).
//! - [`goodput`]: where a job's time went across its deliveries (useful,
//!   redone, checkpointing, waiting): the [`goodput::Ledger`], how a
//!   delivery's readings add to it, and the stamp a checkpoint write
//!   carries it in.
//! - [`lanes`]: the lane a job with a deadline runs in (Spot, or regular
//!   capacity when it must): Uniform Progress as one pure function,
//!   [`lanes::choose_lane`], and where a job stands against its deadline.
//! - [`scale_in`]: scale-in that removes only idle capacity: whether a
//!   worker keeps its VM protected from scale-in
//!   ([`scale_in::wants_protection`]), which instances a scale-in removes
//!   ([`scale_in::choose_removals`]), and the order (and pod-deletion
//!   cost) when a given number must go whatever they hold.
//!
//! ```
//! use std::time::Duration;
//!
//! use spot_worker_decisions::cadence::{CheckpointCadence, IntervalSource, MIN_INTERVAL, SaveCost};
//! use spot_worker_decisions::goodput::{split_stamp, stamp_with, Ledger};
//!
//! // A worker's interval: the minimum until a save is measured, so the
//! // first save comes early; then Daly's, from what saving costs.
//! let cadence = CheckpointCadence::new(IntervalSource::Adaptive {
//!     seed_evictions_per_hour: 0.05,
//! });
//! assert_eq!(cadence.interval(), MIN_INTERVAL);
//! cadence.record_save(SaveCost {
//!     blocked: Duration::from_secs(2),
//!     requests: 1,
//!     bytes: 4096,
//! });
//! assert!(cadence.interval() > MIN_INTERVAL);
//!
//! // A job's ledger travels in the stamp of each checkpoint write.
//! let ledger = Ledger { useful_ms: 3_000, redone_ms: 1_000, deliveries: 2, ..Ledger::default() };
//! let stamp = stamp_with("writer:7", &ledger);
//! assert_eq!(split_stamp(&stamp), ("writer:7", Some(ledger)));
//! assert_eq!(ledger.goodput(), Some(0.75));
//! ```
//!
//! Other decisions of the same kind belong here too, beside these.
//!
//! What this crate must never do, so that every rule stays a function one
//! can test with a table and a simulation can call a million times:
//!
//! - **no I/O**: no files, no network, no environment, no logging; a store
//!   that keeps what a decision needs (the fleet's counts, a job's
//!   checkpoint) reads and writes it, and hands the values in;
//! - **no async**: no `async fn`, no tasks, no runtime;
//! - **no knowledge of where things live**: nothing of storage, queues,
//!   Azure or IMDS, and no dependency on any other crate of ours.
//!
//! It depends on `tokio` for one type only, [`tokio::time::Instant`] (the
//! `time` feature, no runtime): the instants the cadence takes are the
//! ones its callers read, and with tokio's they follow a test's paused
//! clock (`#[tokio::test(start_paused = true)]`), so the worker's and the
//! runner's tests can advance an hour of job time at once. `std`'s
//! `Instant` would tie those tests to the wall clock.

pub mod bill;
pub mod cadence;
pub mod deletion_cost;
pub mod goodput;
pub mod lanes;
pub mod scale_in;
