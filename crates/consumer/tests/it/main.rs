//! The consumer's integration tests, in one binary (each test binary links
//! the whole dependency graph again): the consumer's flow against the
//! in-memory stores on tokio's paused clock, what counts as a failure, an
//! eviction or an attempt, the poison path, the worker's own records under
//! bad input, and the lanes driven through a consumer (`lanes`).
//!
//! Run one room with a filter: `cargo test -p spot-worker-consumer --test it
//! lanes::keeper`.

mod common;

mod abandoned;
mod bad_input;
mod conflicts;
mod consumer;
mod crash_loop;
mod delivery_semantics;
mod evictions;
mod failures;
mod goodput;
mod interruptions;
mod lanes;
mod leases;
mod panics;
mod records_bad_input;
mod requests;
mod wind_down;
