//! The worker's scale-in protection through Azure Resource Manager, against
//! a loopback stand-in of ARM that enforces the custom role of
//! `bicep/modules/scale-in-protection.bicep` and Azure's protection
//! semantics (`spot_worker_testkit::arm_stand_in`, which the VM in a box
//! shares), with workers of the runtime taking a
//! real job from a real Azurite queue:
//!
//! - a token whose role lacks the write, or whose assignment is on another
//!   scale set, is refused with 403 `AuthorizationFailed`, and the error
//!   says so without the token;
//! - one busy and one idle VM: a scale-in removes the idle one, and never
//!   the busy one, however many are asked for;
//! - ARM answering 429 (with `Retry-After`) and 500 to the release loses
//!   nothing: the job finishes and the protection is released in the end;
//! - a worker that starts clears a protection left on its VM (by a crash),
//!   and one that exits releases its own.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::StatusCode;
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use common::*;
use spot_worker_azure::ArmScaleInProtection;
use spot_worker_imds::ScaleSetMember;
use spot_worker_runtime::scale_in_protection::ScaleInProtection;
use spot_worker_runtime::{HandlerError, Job, Worker, WorkerConfig, handler_fn};
use spot_worker_storage::MessageQueue;
use spot_worker_testkit::arm_stand_in::{
    self as arm, Arm, Principal, WRITE_ACTION, custom_role_actions,
};
use tokio::sync::{Notify, mpsc};

const SUB: &str = "00000000-0000-0000-0000-00000000beef";
const RG: &str = "fleet";
const SET: &str = "workers";

/// The identity's tokens as Entra ID would hand them out: one opaque token,
/// and the scopes it was asked for.
#[derive(Debug)]
struct Identity {
    token: &'static str,
    scopes: Mutex<Vec<String>>,
}

impl Identity {
    fn new(token: &'static str) -> Arc<Self> {
        Arc::new(Identity {
            token,
            scopes: Mutex::default(),
        })
    }
}

#[async_trait]
impl TokenCredential for Identity {
    async fn get_token(
        &self,
        scopes: &[&str],
        _: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let mut asked = self.scopes.lock().unwrap();
        asked.extend(scopes.iter().map(|s| (*s).to_owned()));
        Ok(AccessToken::new(
            Secret::new(self.token),
            time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        ))
    }
}

fn member(instance: &str) -> ScaleSetMember {
    ScaleSetMember {
        subscription_id: SUB.to_owned(),
        resource_group: RG.to_owned(),
        scale_set: SET.to_owned(),
        instance_id: instance.to_owned(),
        environment: "AzurePublicCloud".to_owned(),
    }
}

#[tokio::test]
async fn a_role_without_the_write_or_on_another_scale_set_is_refused() {
    let arm = Arm::start(SUB, RG).await.unwrap();
    arm.add_vm(SET, "vm-a", false);
    let role = custom_role_actions().unwrap();
    assert!(
        role.iter().any(|a| a.eq_ignore_ascii_case(WRITE_ACTION)),
        "the custom role grants what the worker does: {role:?}"
    );
    arm.grant(
        "token-of-the-workers",
        Principal {
            actions: role.clone(),
            scope: arm.scale_set(SET),
        },
    );
    let read_only: Vec<String> = role
        .iter()
        .filter(|a| !a.to_ascii_lowercase().ends_with("/write"))
        .cloned()
        .collect();
    arm.grant(
        "token-read-only",
        Principal {
            actions: read_only,
            scope: arm.scale_set(SET),
        },
    );
    arm.grant(
        "token-other-set",
        Principal {
            actions: role,
            scope: arm.scale_set("other-workers"),
        },
    );
    for refused in ["token-read-only", "token-other-set"] {
        let client =
            ArmScaleInProtection::at(&arm.endpoint, &member("vm-a"), Identity::new(refused))
                .unwrap();
        let error = client.set(true).await.unwrap_err();
        assert!(
            error.message.contains("403") && error.message.contains("AuthorizationFailed"),
            "{refused}: {error}"
        );
        assert!(
            !error.message.contains(refused),
            "no token in errors: {error}"
        );
        assert_eq!(error.retry_after, None);
        assert_eq!(arm.vm(SET, "vm-a"), Some(arm::Vm { protected: false }));
    }
    let identity = Identity::new("token-of-the-workers");
    let client =
        ArmScaleInProtection::at(&arm.endpoint, &member("vm-a"), identity.clone()).unwrap();
    client.set(true).await.unwrap();
    assert_eq!(arm.vm(SET, "vm-a"), Some(arm::Vm { protected: true }));
    assert_eq!(
        *identity.scopes.lock().unwrap(),
        [format!("{}/.default", arm.endpoint)],
        "the token is asked for the ARM endpoint's audience"
    );
    // Throttling comes back with ARM's Retry-After for the keeper's backoff.
    arm.fail_next(&[(StatusCode::TOO_MANY_REQUESTS, Some(17))]);
    let error = client.set(false).await.unwrap_err();
    assert_eq!(error.retry_after, Some(Duration::from_secs(17)), "{error}");
    assert!(error.message.contains("429"), "{error}");
}

#[test]
fn plain_http_to_anything_but_loopback_is_refused() {
    let identity = Identity::new("t");
    for endpoint in [
        "http://management.azure.com",
        "http://10.0.0.1:8080",
        "ftp://x",
    ] {
        let error =
            ArmScaleInProtection::at(endpoint, &member("vm"), identity.clone()).unwrap_err();
        assert!(error.to_string().contains(endpoint), "{error}");
    }
    let client = ArmScaleInProtection::new(&member("vm-a"), identity).unwrap();
    assert_eq!(
        client.instance_url(),
        Some(
            "https://management.azure.com/subscriptions/00000000-0000-0000-0000-00000000beef\
             /resourceGroups/fleet/providers/Microsoft.Compute/virtualMachineScaleSets/workers\
             /virtualMachines/vm-a?api-version=2024-07-01"
        )
    );
}

/// A worker of the runtime on `queue` in Azurite, protecting `instance`.
fn worker_on(
    azurite: &spot_worker_testkit::Azurite,
    queue: &str,
    arm: &Arm,
    instance: &str,
    idle_grace: Duration,
) -> Worker {
    let storage = storage(azurite);
    let mut config = WorkerConfig {
        queue: queue.to_owned(),
        ..WorkerConfig::default()
    };
    config.imds.enabled = false;
    config.health_addr = "127.0.0.1:0".parse().unwrap();
    config.drain.handle_signals = false;
    config.drain.watchdog = false;
    let protection = ArmScaleInProtection::at(
        &arm.endpoint,
        &member(instance),
        Identity::new("token-of-the-workers"),
    )
    .unwrap();
    Worker::new(
        config,
        Arc::new(storage.queue(queue).unwrap()),
        Arc::new(storage.poison_queue(queue).unwrap()),
    )
    .with_scale_in_protection(Arc::new(protection), idle_grace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_in_removes_the_idle_vm_and_arm_errors_lose_nothing() {
    let azurite = start_azurite();
    let arm = Arm::start(SUB, RG).await.unwrap();
    arm.grant(
        "token-of-the-workers",
        Principal {
            actions: custom_role_actions().unwrap(),
            scope: arm.scale_set(SET),
        },
    );
    // vm-b was left protected by a worker that crashed.
    arm.add_vm(SET, "vm-a", false);
    arm.add_vm(SET, "vm-b", true);
    let queue_name = unique("scalein");
    let queue = storage(&azurite).queue(&queue_name).unwrap();
    queue.prepare().await.unwrap();
    queue.send("the one job", Duration::ZERO).await.unwrap();

    let grace = Duration::from_secs(1);
    let (took, mut taker) = mpsc::unbounded_channel::<&'static str>();
    let finish = Arc::new(Notify::new());
    let mut runs = Vec::new();
    let mut stops = Vec::new();
    for instance in ["vm-a", "vm-b"] {
        let worker = worker_on(&azurite, &queue_name, &arm, instance, grace);
        stops.push(worker.shutdown_token());
        let (took, finish) = (took.clone(), Arc::clone(&finish));
        runs.push(tokio::spawn(worker.run(handler_fn(move |job: Job| {
            let (took, finish) = (took.clone(), Arc::clone(&finish));
            async move {
                assert_eq!(job.text()?, "the one job");
                took.send(instance).unwrap();
                finish.notified().await;
                Ok::<(), HandlerError>(())
            }
        }))));
    }
    let busy = tokio::time::timeout(WAIT_LIMIT, taker.recv())
        .await
        .expect("a worker takes the job")
        .unwrap();
    let idle = if busy == "vm-a" { "vm-b" } else { "vm-a" };
    // The busy VM is protected; the idle one is not (vm-b's leftover
    // protection is cleared as its worker starts, whichever it is).
    arm.wait_for(
        "the busy VM protected, the idle one not",
        WAIT_LIMIT,
        |fleet| {
            let state = |i: &str| {
                fleet
                    .vms
                    .get(&format!("{}/virtualmachines/{i}", arm.scale_set(SET)).to_lowercase())
                    .map(|vm| vm.protected)
            };
            state(busy) == Some(true) && state(idle) == Some(false)
        },
    )
    .await
    .unwrap();
    // Azure's autoscale asks for two fewer: only the idle one can go.
    assert_eq!(arm.scale_in(SET, 2), [idle.to_owned()]);
    assert_eq!(arm.vm(SET, busy), Some(arm::Vm { protected: true }));

    // The release after the job meets a throttled ARM, then a failing one.
    arm.fail_next(&[
        (StatusCode::TOO_MANY_REQUESTS, Some(1)),
        (StatusCode::INTERNAL_SERVER_ERROR, None),
    ]);
    finish.notify_one();
    arm.wait_for(
        "the busy VM released after the errors",
        WAIT_LIMIT,
        |fleet| fleet.vms.values().all(|vm| !vm.protected),
    )
    .await
    .unwrap();
    assert_eq!(arm.answered(429), 1);
    assert_eq!(arm.answered(500), 1);
    assert_eq!(arm.vm(SET, busy), Some(arm::Vm { protected: false }));

    for stop in &stops {
        stop.cancel();
    }
    let mut succeeded = 0;
    for run in runs {
        let report = tokio::time::timeout(WAIT_LIMIT, run)
            .await
            .expect("the workers stop")
            .unwrap()
            .unwrap();
        succeeded += report.stats.succeeded;
    }
    assert_eq!(succeeded, 1, "the job finished once");
    let left = queue.receive(32, Duration::from_secs(30)).await.unwrap();
    assert!(left.is_empty(), "nothing left in the queue: {left:?}");
}
