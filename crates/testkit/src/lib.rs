//! The test kit (dev only): what the project's tests and benchmarks share.
//!
//! - [`Azurite`]: a real storage emulator per test (below);
//! - [`contract`]: what every checkpoint and result store must do, run
//!   against each backend;
//! - [`faulty`]: any queue with switchable faults and a record of calls;
//! - [`counting`]: any checkpoint store with a count of requests by kind;
//! - [`otlp`]: a telemetry collector that decodes what the exporters send;
//! - [`podman`]: whether a container test runs here;
//! - [`tls_front`]: TLS in front of a plain test server;
//! - [`bench`]: what every benchmark binary does before it measures;
//! - [`procfs`]: CPU time and memory of processes, from `/proc`;
//! - [`worker`]: in-process workers on Azurite and the IMDS emulator;
//! - [`chaos`]: the chaos run (real worker processes, emulated Spot VMs,
//!   a seeded fault schedule, and the checks).
//!
//! [`Azurite`] starts a real [Azurite](https://github.com/Azure/Azurite)
//! storage emulator for integration tests: free loopback ports, a temporary workspace, a
//! bounded wait until it answers, and a stop (SIGTERM, so it flushes its data)
//! on drop. It can be stopped and started again on the same ports and data,
//! to test recovery from a storage outage.
//!
//! Readiness is proven over HTTP, not just by a TCP accept: each instance
//! gets an extra storage account with a random name (`AZURITE_ACCOUNTS`),
//! and only an Azurite that knows that account answers a request for it
//! with 403 (any other answers 404). So another test's Azurite, or any other
//! server that took one of our ports while we were stopped, is never
//! mistaken for ours. A port taken by someone else makes Azurite exit with
//! `EADDRINUSE`, reported as [`HarnessError::PortInUse`].
//!
//! [`Azurite::start_separate`] serves blob and queue from two processes
//! (`azurite-blob`, `azurite-queue`) instead of one; see [`topology`].
//!
//! [`Azurite::start_https`] starts it as production looks instead: HTTPS
//! with a given certificate, OAuth (`--oauth basic`: bearer tokens are
//! checked for issuer, audience and lifetime), a named account, and blob and
//! queue on port 443 of addresses of the caller's choosing (inside a network
//! namespace, where `https://<account>.blob.core.windows.net` resolves to
//! them).
//!
//! The binary is `tools/azurite/node_modules/.bin/azurite` in the workspace
//! (installed by `npm ci --prefix tools/azurite`, which `scripts/test.sh`
//! runs), or whatever `AZURITE_BIN` names.

use std::path::{Path, PathBuf};

mod azurite;
pub mod bench;
pub mod chaos;
pub mod contract;
pub mod counting;
pub mod faulty;
pub mod otlp;
pub mod podman;
pub mod procfs;
pub mod tls_front;
pub mod worker;

pub use azurite::topology;
pub use azurite::{
    ACCOUNT_KEY, ACCOUNT_NAME, Azurite, AzuriteProcess, HarnessError, HttpsOptions, Topology,
};

/// The workspace's root directory (this crate is `crates/testkit`).
pub fn workspace_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .nth(2)
        .map_or_else(|| crate_dir.to_owned(), Path::to_owned)
}
