//! Whether a test that runs containers with podman runs here: the switch
//! `SPOT_WORKER_CONTAINER_TEST` (`0` skips, `1` makes a missing podman a
//! failure; `scripts/test.sh` sets `1`) and podman's presence.

use std::process::Command;

/// True if the container test `what` should run; prints why when it does
/// not, and panics when the switch requires podman and it is missing.
pub fn container_test_wanted(what: &str) -> bool {
    let switch = std::env::var("SPOT_WORKER_CONTAINER_TEST").unwrap_or_default();
    if matches!(switch.as_str(), "0" | "false" | "disabled") {
        eprintln!("SKIPPED: {what} (SPOT_WORKER_CONTAINER_TEST={switch})");
        return false;
    }
    let present = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        assert!(
            !matches!(switch.as_str(), "1" | "true" | "required"),
            "SPOT_WORKER_CONTAINER_TEST={switch} but podman is not installed \
             (Debian: apt-get install podman runc)"
        );
        eprintln!(
            "SKIPPED: {what}: podman is not installed (apt-get install podman runc; \
             SPOT_WORKER_CONTAINER_TEST=1 makes this a failure, =0 silences it)"
        );
    }
    present
}
