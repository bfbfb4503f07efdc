//! Shared outages never make a VM unhealthy: what the scale set's health
//! extension probes (`/healthz`, and so automatic repairs) stays 200 while
//! storage is unreachable, while storage refuses the VM's tokens, while
//! IMDS's Scheduled Events fail, and while the worker is parked for an
//! event it shares with another VM. `/readyz` reports each while it lasts,
//! and the same process takes work again by itself once it clears. A repair
//! would only replace the VM with one that fails the same way (docs:
//! "Deploying", compute.bicep).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use spot_worker_imds_emulator::{EventSpec, Fault};

use super::the_box::{TheBox, note};
use super::vm::{PATIENCE, Vm};

/// Failed attempts (gate checks, Scheduled Events polls) the worker must
/// live through before the condition is cleared.
const ATTEMPTS: usize = 3;

impl TheBox {
    pub async fn shared_outages_never_make_the_vm_unhealthy(
        &mut self,
        binary: &Path,
        env: &BTreeMap<String, String>,
    ) {
        // Storage unreachable: nothing listens at its addresses. (Not by
        // rewriting /etc/hosts: the worker's resolver, hickory, reads that
        // file once, as it starts; DNS answers it re-reads by their TTL.)
        self.azurite.stop().expect("azurite stops");
        let mut vm = Vm::start(binary, env);
        let reason = alive_while_not_ready(&mut vm, "storage", gate_failures).await;
        self.azurite.start_again().expect("azurite starts again");
        recovers(&mut vm, "storage reachable again").await;
        assert!(vm.stop().await.success());
        note(format!(
            "storage unreachable: /healthz 200 throughout, /readyz storage: {reason}; ready again by itself"
        ));

        // Storage refuses the VM (its tokens carry an issuer storage does
        // not accept: 403, as after a removed role assignment). Tokens live
        // 8 s, so the VM asks IMDS again once the refusal is lifted.
        self.identity(
            serde_json::json!({"issuer": "https://issuer.invalid/", "token_lifetime_secs": 8}),
        )
        .await;
        let mut vm = Vm::start(binary, env);
        let reason = alive_while_not_ready(&mut vm, "storage", gate_failures).await;
        assert!(reason.contains("403"), "{reason}");
        self.identity(serde_json::json!({"issuer": null})).await;
        recovers(&mut vm, "storage accepting the VM's tokens again").await;
        assert!(vm.stop().await.success());
        self.identity(serde_json::json!({"token_lifetime_secs": 86_400}))
            .await;
        note(format!(
            "storage refusing the VM: /healthz 200 throughout, /readyz storage: {reason}; ready again by itself"
        ));

        // IMDS's Scheduled Events failing (503 to every poll).
        let served_before = self.emulator.stats().faults_served;
        self.emulator.inject_faults(
            Fault::Status(reqwest::StatusCode::SERVICE_UNAVAILABLE),
            10_000,
        );
        let mut vm = Vm::start(binary, env);
        let reason = alive_while_not_ready(&mut vm, "imds", |_| {
            usize::try_from(self.emulator.stats().faults_served - served_before).unwrap_or(0)
        })
        .await;
        self.emulator.clear_faults();
        recovers(&mut vm, "Scheduled Events answering again").await;
        note(format!(
            "IMDS Scheduled Events failing: /healthz 200 throughout, /readyz imds: {reason}; ready again by itself"
        ));

        // Parked: a Reboot of this VM and another one is drained for but
        // not approved (it is not this VM's alone); the worker waits, up
        // and not ready, until the event starts or is cancelled.
        let vm_name = self.emulator.config().vm_name;
        let peer = self.emulator.config().peer_vm_name();
        let reboot = self
            .emulator
            .schedule(EventSpec::reboot().resources([vm_name.as_str(), peer.as_str()]))
            .unwrap();
        let started = Instant::now();
        loop {
            vm.assert_running("parked for the shared Reboot");
            assert_eq!(vm.liveness().await, Some(200), "/healthz while parked");
            if let Some((503, body)) = vm.readiness_now().await
                && body["shutting_down"]
                    .as_str()
                    .is_some_and(|why| why.contains("not approved"))
            {
                break;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "the worker did not park for the shared Reboot; log:\n{}",
                vm.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(vm.liveness().await, Some(200), "/healthz while parked");
        self.emulator.cancel_event(&reboot.id).unwrap();
        recovers(&mut vm, "the shared Reboot cancelled").await;
        assert!(vm.stop().await.success());
        note(
            "parked for a Reboot shared with another VM: /healthz 200 throughout, /readyz 503 shutting down; cancelled, ready again",
        );
    }
}

/// Waits until `/readyz` shows `gate` waiting on an error and `attempts()`
/// reaches [`ATTEMPTS`], asserting at every look that the worker runs and,
/// from its first answer on (the health server starts with the process),
/// that `/healthz` answers 200. Returns the gate's last error.
async fn alive_while_not_ready(vm: &mut Vm, gate: &str, attempts: impl Fn(&Vm) -> usize) -> String {
    let started = Instant::now();
    let mut answered = false;
    loop {
        vm.assert_running("waiting out a shared outage");
        let liveness = vm.liveness().await;
        answered |= liveness.is_some();
        if answered {
            assert_eq!(
                liveness,
                Some(200),
                "/healthz during the outage; log:\n{}",
                vm.log()
            );
        }
        if let Some((status, body)) = vm.readiness_now().await {
            assert_eq!(status, 503, "ready during the outage: {body}");
            let detail = body[gate]["detail"].as_str().unwrap_or_default().to_owned();
            if answered
                && body[gate]["state"] == "waiting"
                && detail != "checking"
                && attempts(vm) >= ATTEMPTS
            {
                return detail;
            }
        }
        assert!(
            started.elapsed() < PATIENCE,
            "/readyz never reported the {gate} outage; log:\n{}",
            vm.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the same process is ready, `/healthz` answering 200 at
/// every look.
async fn recovers(vm: &mut Vm, what: &str) {
    let started = Instant::now();
    loop {
        vm.assert_running(what);
        assert_eq!(vm.liveness().await, Some(200), "/healthz after {what}");
        if vm.is_ready().await {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "not ready within {PATIENCE:?} after {what}; log:\n{}",
            vm.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The warmup gate's failed checks so far, by the worker's log.
fn gate_failures(vm: &Vm) -> usize {
    vm.log().matches("warmup gate: check failed").count()
}
