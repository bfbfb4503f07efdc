//! The integration tests of `spot-worker-imds-emulator`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-imds-emulator --test it MODULE::` runs one module.

#[path = "../common/mod.rs"]
mod common;

mod control;
mod identity;
mod imds;
mod scenarios;
