//! The integration tests of `spot-worker-settings`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-settings --test it MODULE::` runs one module.

mod bad_input;
mod readme;
