//! The integration tests of `spot-worker-imds`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-imds --test it MODULE::` runs one module.
//!
//! Apart, each its own binary, because it changes the process itself,
//! which every other test of a binary would see:
//! - `tests/proxy.rs` sets proxy variables in the process environment.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod scenarios;
mod transport;
mod vm_name_lookup;
mod watcher;
