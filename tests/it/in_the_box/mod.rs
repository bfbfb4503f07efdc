//! The pieces of `tests/it/vm_in_a_box.rs`: entering fresh network, mount and
//! PID namespaces ([`namespace`]), the VM's network, name resolution and
//! trust store inside them ([`network`]), throwaway certificate authorities
//! ([`pki`]), the worker process as systemd would run it ([`vm`]) and the
//! shared outages it must stay alive through (`outages`); and
//! of `tests/it/pod_in_a_box.rs`: an AKS Spot node with worker pods run by
//! podman ([`pod`]) and its cases ([`pod_cases`], [`pod_scale_in`]).

#![allow(dead_code)] // Not every helper is used by every case.

mod command;
mod failures;
pub mod namespace;
pub mod network;
mod outages;
pub mod pki;
pub mod pod;
pub mod pod_cases;
pub mod pod_scale_in;
mod success;
pub mod the_box;
pub mod vm;

use std::process::Command;

/// Runs `program args`, panicking with its output if it fails: every
/// command here sets up the box, and the test cannot go on without it.
pub fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
