//! A pod in a box: the worker's container image on an AKS Spot node as the
//! pod sees it, inside network, mount and PID namespaces made by this test
//! (see `in_the_box::pod` for the node's world). Worker pods are
//! `podman run --network host` from inside the box, with exactly the
//! environment `deploy/kubernetes/deployment.yaml` gives a pod (its
//! downward-API `POD_NAME`/`POD_NAMESPACE` filled with the pod's own) plus
//! what the workload identity webhook injects and the kubelet's
//! `KUBERNETES_SERVICE_*`/`KUBERNETES_PORT*` for the API server, the
//! projected service-account token mounted read-only where the webhook puts
//! it, and the service-account token, `ca.crt` and `namespace` where the
//! kubelet mounts them. The API server is the test kit's stand-in at
//! `https://10.0.0.1` (the `kubernetes` service's ClusterIP), authorising by
//! `deploy/kubernetes/pod-deletion-cost.yaml`'s Role:
//!
//! - two pods on one node both take a long job; the node's Preempt drains
//!   and releases both, neither approves it (approval is off in the
//!   Deployment), both exit 0 within the drain budget;
//! - two pods each keep their pod's deletion cost with the Deployment's
//!   settings: 0 written once when idle, above 0 as soon as one takes a job
//!   (back to 0 when it ends); a scale-in from 2 to 1 (the stand-in ranks
//!   by cost as the ReplicaSet controller does) removes the idle pod, which
//!   `podman stop -t 35` stops (exit 0, nothing released), and the busy one
//!   keeps its job and finishes it; requests outside the Role are 403;
//! - `podman stop -t 35` (a KEDA scale-in, the pod's grace period) drains
//!   the last pod while busy, the same way: exit 0, its message visible
//!   again at once, not counted as a failure;
//! - a wrong client id (AADSTS700016) and an expired token file
//!   (AADSTS700024) leave the pod not ready with the reason in `/readyz`; a
//!   missing token file stops the worker at start with an error naming it;
//!   nothing is taken from the queue.
//!
//! Deviations from a cluster, each because the box has one network
//! namespace for the node: the pods share it, so each gets its own health
//! port (`SPOT_WORKER_HEALTH_ADDR=0.0.0.0:<port>` instead of `:8080`); each
//! is pinned to one CPU so its default concurrency (CPUs) is 1 and each pod
//! holds one job. The deletion cost's rise with unsaved work (a minute's
//! step in the Deployment) is not waited for here: `tests/it/pod_deletion_cost.rs`
//! shows it on loopback with a 1 s step.
//!
//! Needs podman and runc, like tests/it/container_image.rs:
//! `SPOT_WORKER_CONTAINER_TEST=0` skips it, `=1` (scripts/test.sh) makes a
//! missing podman a failure, unset skips it with a message when podman is
//! absent. `SPOT_WORKER_VM_IN_A_BOX=0` skips it too (no namespaces). Run
//! with `--nocapture` to see the transcript.

use std::time::Duration;

use crate::common::enqueue_primes;
use crate::in_the_box::namespace::{
    assert_found_exactly, forget_the_machines_proxies, inside, rehearse,
};
use crate::in_the_box::pod::{Node, note};
use crate::in_the_box::pod_cases::Measured;
use spot_worker::storage::MessageQueue;
use spot_worker_testkit::chaos::static_binaries;

/// What a whole inner run may take.
const BOX_LIMIT: Duration = Duration::from_secs(600);

/// The name the outer test runs in the box is its inner half's (the
/// module's path included, as the harness names tests of a shared binary).
#[test]
fn the_inner_half_is_run_by_its_exact_name() {
    assert_found_exactly(module_path!(), "inside_the_pod_box");
}

#[test]
fn the_worker_image_runs_as_pods_on_a_spot_node_in_a_box() {
    rehearse(
        "the pod in a box",
        module_path!(),
        "inside_the_pod_box",
        BOX_LIMIT,
        || {
            if !spot_worker_testkit::podman::container_test_wanted("the pod in a box") {
                return false;
            }
            // Built (if stale) before entering the box, where the image is built.
            static_binaries().expect("the static binaries");
            true
        },
    );
}

/// The inner half, run by the outer test inside the namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the inner half of the_worker_image_runs_as_pods_on_a_spot_node_in_a_box"]
async fn inside_the_pod_box() {
    assert!(
        inside(),
        "run the_worker_image_runs_as_pods_on_a_spot_node_in_a_box: this half needs the box"
    );
    forget_the_machines_proxies();
    let node = Node::set_up().await;
    // The image as shipped: `image` profile binaries, statically linked, so every
    // name below (storage, Entra ID) is resolved by the binaries themselves
    // from the pod's /etc/hosts, with no C library in the image.
    let (cli, primes) = static_binaries().unwrap();
    node.build_image(&cli, &primes);
    let env = node.pod_env();
    note(format!(
        "pod environment (deployment.yaml + webhook): {}",
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let queue = node.operator.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
    queue.prepare().await.unwrap();
    enqueue_primes(&queue, "sentinel", 100_000).await;

    node.wrong_client_id(&env, &queue).await;
    node.expired_token(&env, &queue).await;
    node.missing_token_file(&env, &queue).await;
    // The sentinel out of the way: each pod below takes one long job.
    let peeked = queue.receive(1, Duration::from_secs(60)).await.unwrap();
    queue
        .delete(&peeked[0].id, &peeked[0].pop_receipt)
        .await
        .unwrap();

    let mut measured = Measured::default();
    node.preempt_drains_two_pods(&env, &queue, &mut measured)
        .await;
    node.scale_in_removes_the_idle_pod_and_drains_a_busy_one(&env, &queue, &mut measured)
        .await;
    note(format!("measured: {measured:?}"));
    drop(node); // Removes the pods and the box's directory.
}
