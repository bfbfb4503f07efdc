//! The integration tests of the `spot-worker` package (the facade, the
//! deployed worker end to end, the deployment rehearsals): one test binary,
//! a module per concern (each was its own binary), so the package links one
//! binary and the shared set-ups (`rendered`, `permissions`, `in_the_box`)
//! are built once. `cargo test -p spot-worker --test it MODULE::` runs one
//! module, e.g. `--test it vm_in_a_box::`.
//!
//! The VM and pod in a box re-run their inner half from this binary inside
//! their namespaces, by its full name with the module
//! (`in_the_box::namespace::run_inside`); the inner run is the only test of
//! its process, so what it changes in its environment concerns nothing else.
//!
//! Apart, each its own binary, because it changes the process itself,
//! which every other test of a binary would see:
//! - `tests/store_refusal.rs` installs the process-wide log subscriber (and
//!   counts the error lines every test of the process would log into it);
//! - `tests/worker_logs.rs` runs `spot_worker::Setup`, which installs the
//!   process-wide log subscriber and the global tracer and meter providers;
//! - `tests/worker_second_signal.rs` and `tests/worker_sigterm.rs` send
//!   SIGTERM to their own process, which every worker of the process that
//!   handles signals would take as its stop.

#[path = "../common/mod.rs"]
mod common;

mod in_the_box;
mod permissions;
mod rendered;

mod bad_input;
mod chaos;
mod container_image;
mod deploy;
mod pod_deletion_cost;
mod pod_in_a_box;
mod primes_requests;
mod storage_permissions;
mod vm_in_a_box;
mod worker;
mod worker_exit;
mod worker_telemetry;
