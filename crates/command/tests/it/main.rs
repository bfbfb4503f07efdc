//! The integration tests of `spot-worker-command`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-command --test it MODULE::` runs one module.
//!
//! Apart, each its own binary, because it changes the process itself,
//! which every other test of a binary would see:
//! - `tests/fifo.rs` installs the process-wide log subscriber;
//! - `tests/final_save.rs` installs the process-wide log subscriber and
//!   counts the process's own reads (`/proc/self/io`);
//! - `tests/in_place_write.rs` installs the process-wide log subscriber;
//! - `tests/lane_progress.rs` installs the process-wide log subscriber;
//! - `tests/large.rs` sets the process environment (GO);
//! - `tests/output.rs` installs the process-wide log subscriber;
//! - `tests/progress_file.rs` installs the process-wide log subscriber;
//! - `tests/unsettled.rs` installs the process-wide log subscriber.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod dir_limits;
mod eviction;
mod examples;
mod exits;
mod files;
mod interval;
mod notice;
mod save_cost;
mod save_trouble;
mod spread;
mod sqlite;
mod sqlite_marker;
mod sqlite_redone;
mod store_refusal;
