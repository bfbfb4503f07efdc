//! The operator's commands (`enqueue`, `poison`, `checkpoints`, `results`,
//! `status`)
//! as the unmodified binary runs them, against a real Azurite per test,
//! configured only through the worker's environment contract.
//! One test binary, a module per command.

mod bad_bytes;
mod bill;
mod checkpoints;
mod common;
mod deadline;
mod enqueue;
mod log_level;
mod poison;
mod raw;
mod status;
