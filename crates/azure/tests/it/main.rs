//! The integration tests of `spot-worker-azure`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-azure --test it MODULE::` runs one module.
//!
//! Apart, each its own binary, because it changes the process itself,
//! which every other test of a binary would see:
//! - `tests/log_redaction.rs` installs the process-wide log subscriber.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod checkpoint;
mod credentials;
mod deadline;
mod evictions;
mod lease;
mod outage;
mod python_interop;
mod queue;
mod result;
mod scale_in_protection;
mod wind_down;
