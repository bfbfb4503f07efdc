//! The integration tests of `spot-worker-cli`: one test binary, a module per
//! concern (each was its own binary), so the crate links one binary.
//! `cargo test -p spot-worker-cli --test it MODULE::` runs one module; the
//! doc runner is `docs::` (`cargo test -p spot-worker-cli --test it docs::
//! -- --nocapture`).

mod support;

mod cli;
mod demo_command;
mod dev;
mod docs;
mod lanes;
mod operate;
mod run;
mod run_dir_state;
mod run_large;
mod run_optuna;
mod run_peers;
mod shipped_binary;
