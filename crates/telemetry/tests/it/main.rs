//! The integration tests of `spot-worker-telemetry`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-telemetry --test it MODULE::` runs one module.

mod export;
mod workbook;
