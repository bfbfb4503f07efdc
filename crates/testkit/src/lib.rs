//! The test kit (dev only): what the project's tests and benchmarks share.
//!
//! - [`Azurite`]: a real storage emulator per test (below);
//! - [`arm_stand_in`]: Azure Resource Manager for a scale set's instance
//!   protection, with the custom role of the bicep module;
//! - [`kube_stand_in`]: the Kubernetes API for a pod's deletion cost, with
//!   the Role of `deploy/kubernetes/pod-deletion-cost.yaml`, and the
//!   ReplicaSet controller's scale-in;
//! - [`contract`]: what every checkpoint and result store must do, run
//!   against each backend;
//! - [`faulty`]: any queue with switchable faults and a record of calls;
//! - [`lost_answers`]: any checkpoint and chunk store whose calls fail on
//!   a plan, before they apply or after (the answer lost);
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
//! [`Azurite`] is `spot-worker-local`'s (what `spot-worker dev` runs too),
//! re-exported: a real Azurite per test on free loopback ports; the
//! workspace's pinned one (`npm ci --prefix tools/azurite`, which
//! `scripts/test.sh` runs), or whatever `AZURITE_BIN` names.

use std::path::{Path, PathBuf};

pub mod arm_stand_in;
pub mod bench;
pub mod chaos;
pub mod contract;
pub mod counting;
pub mod fault_search;
pub mod faulty;
pub mod handlers;
pub mod kube_stand_in;
pub mod lost_answers;
pub mod otlp;
pub mod podman;
pub mod procfs;
pub mod store_layer;
pub mod tls_front;
pub mod worker;

pub use spot_worker_local::topology;
pub use spot_worker_local::{
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
