//! A VM in a box: the deployed worker, unmodified, on the path a real
//! deployment takes. Inside network, mount and PID namespaces made by this
//! test (see `in_the_box::namespace`):
//!
//! - `169.254.169.254:80` is the IMDS emulator, serving Scheduled Events and
//!   the managed-identity token endpoint for the scale set's user-assigned
//!   identity;
//! - Azurite serves the storage account named from `bicep/main.bicepparam`
//!   over HTTPS with OAuth (`--oauth basic`), blob on `127.0.0.2:443` and
//!   queue on `127.0.0.3:443`, reached as
//!   `https://<account>.blob.core.windows.net` through the box's
//!   `/etc/hosts`, its certificate trusted through the box's CA bundle;
//! - `bicep/cloud-init/install-worker.sh`, as rendered, fetches a token from
//!   IMDS, downloads the worker from the artifacts container with it, checks
//!   its SHA-256 and installs it (into a scratch root);
//! - the installed worker runs with exactly the environment file the
//!   templates render: account URL, `AZURE_CLIENT_ID`, queue, containers,
//!   health address, drain settings. Its token comes from IMDS, its requests
//!   are authorised by bearer token, its jobs are done, and a Preempt at the
//!   real IMDS address is drained and approved, exit 0;
//! - the command path too: rendered with `workerCommand` (`python3
//!   primes.py`) and an application bundle (`examples/command`), installed
//!   by the same script, the unit's `ExecStart` (`spot-worker run ... --
//!   python3 primes.py`) runs in its working directory with the same
//!   environment file, unmodified: a Python job's result equals `primes`',
//!   and a Preempt drains a running one (exit 0, approved, released).
//!
//! The only value not as Azure would render it is
//! `APPLICATIONINSIGHTS_CONNECTION_STRING`, rendered empty: the box has no
//! Application Insights, and the template allows it (the telemetry crate
//! treats an empty value as "no export"), so no export to an unreachable
//! ingestion host clutters the run.
//!
//! Scale-in protection as deployed by default (`scaleInProtection=true`,
//! `SPOT_WORKER_SCALE_IN_PROTECTION=on`): `management.azure.com:443` is
//! ARM's stand-in (`spot_worker_testkit::arm_stand_in`, the box's CA), which
//! accepts the identity's IMDS tokens for ARM with the custom role of
//! `bicep/modules/scale-in-protection.bicep` on the scale set and refuses
//! anything else. The worker protects its VM while it holds jobs (its
//! first call answered 429, then 500: retried, nothing lost) and releases
//! it on exit. The release after the idle grace (120 s, not exposed by the
//! templates) and the scale-in of one busy and one idle VM are
//! `crates/azure/tests/it/scale_in_protection.rs`'s, against the same stand-in.
//!
//! Then what goes wrong on real VMs, each with a clear error and nothing
//! taken from the queue: a client id IMDS does not know, tokens storage
//! refuses (wrong issuer), a certificate the VM does not trust, proxy
//! variables pointing at a dead proxy (the token is still fetched: IMDS is
//! never reached through a proxy); and short-lived tokens, refreshed while
//! the worker keeps working past their expiry. And what the scale set's
//! health extension probes (`/healthz`) stays 200 through shared outages
//! (storage unreachable, storage refusing the VM, IMDS failing, parked for
//! a shared event) while `/readyz` reports each, until it clears by itself.
//!
//! `SPOT_WORKER_VM_IN_A_BOX=0` skips it explicitly; without namespaces
//! (not root, no user namespaces) it fails saying so. Run with
//! `--nocapture` to see the transcript.

use std::time::Duration;

use crate::common::enqueue_primes;
use crate::in_the_box::namespace::{
    assert_found_exactly, forget_the_machines_proxies, inside, rehearse,
};
use crate::in_the_box::the_box::TheBox;
use crate::rendered::worker_binary;
use spot_worker::storage::MessageQueue;

/// What a whole inner run may take.
const BOX_LIMIT: Duration = Duration::from_secs(900);

/// The name the outer test runs in the box is its inner half's (the
/// module's path included, as the harness names tests of a shared binary).
#[test]
fn the_inner_half_is_run_by_its_exact_name() {
    assert_found_exactly(module_path!(), "inside_the_box");
}

#[test]
fn the_deployed_worker_runs_in_a_vm_in_a_box() {
    rehearse(
        "the VM-in-a-box rehearsal",
        module_path!(),
        "inside_the_box",
        BOX_LIMIT,
        || {
            // Built by `cargo test` (examples are), checked before entering
            // the box; the spot-worker command (another package's binary)
            // built if stale.
            worker_binary();
            spot_worker_testkit::chaos::cli_binary().expect("the spot-worker command");
            true
        },
    );
}

/// The inner half, run by the outer test inside the namespaces (with
/// `--ignored --exact`); ignored in a normal run, so it never passes
/// without having done anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the inner half of the_deployed_worker_runs_in_a_vm_in_a_box, which runs it in the box"]
async fn inside_the_box() {
    assert!(
        inside(),
        "run the_deployed_worker_runs_in_a_vm_in_a_box: this half needs the box's namespaces"
    );
    forget_the_machines_proxies();
    let mut the_box = TheBox::set_up().await;
    the_box.rehearse().await;
}

impl TheBox {
    async fn rehearse(&mut self) {
        let env = self.vm_env();
        self.check_the_environment(&env);
        let installed = self.install().await;
        let queue = self.operator.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
        queue.prepare().await.unwrap();
        let sentinel = enqueue_primes(&queue, "sentinel", 100_000).await;

        self.wrong_client_id(&installed, &env, &queue).await;
        self.token_storage_refuses(&installed, &env, &queue).await;
        self.untrusted_certificate(&installed, &env, &queue).await;
        self.dead_proxy(&installed, &env, &queue).await;
        self.the_deployment_works(&installed, &env, &queue, &sentinel)
            .await;
        self.the_command_path_works(&queue).await;
        self.short_lived_tokens_are_refreshed(&installed, &env)
            .await;
        self.shared_outages_never_make_the_vm_unhealthy(&installed, &env)
            .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
