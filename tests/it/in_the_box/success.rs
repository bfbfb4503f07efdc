//! The deployment working: the installed worker on exactly the rendered
//! environment becomes ready with a real token, does its jobs, drains and
//! approves a Preempt and exits 0; and short-lived tokens are refreshed while
//! it keeps working.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use spot_worker::azure::AzureQueue;
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::{PrimesJob, expected_result};

use super::the_box::{
    CLIENT_ID, INSTANCE_ID, TheBox, bearer_validations, note, take_back_released, wait_for,
};
use super::vm::{PATIENCE, Vm};
use crate::common::enqueue_primes;

impl TheBox {
    pub async fn the_deployment_works(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
        sentinel: &PrimesJob,
    ) {
        let started = Instant::now();
        let bearer_before = bearer_validations(&self.azurite);
        // ARM throttles, then fails, the worker's first call to it: the
        // protection is retried, nothing is lost.
        let (throttled, failed) = (self.arm.answered(429), self.arm.answered(500));
        self.arm.fail_next(&[
            (StatusCode::TOO_MANY_REQUESTS, Some(1)),
            (StatusCode::INTERNAL_SERVER_ERROR, None),
        ]);
        let protections_before = self.arm.protections().len();
        let mut vm = Vm::start(binary, env);
        vm.until_ready().await;
        note(format!(
            "worker ready after {:?} (warmup gate open)",
            started.elapsed()
        ));
        let (results, checkpoints) = self.worker_stores(env);
        let small = enqueue_primes(queue, "small", 2_000_000).await;
        for job in [sentinel, &small] {
            let name = format!("{}.json", job.job_id);
            let bytes = wait_for(&vm, &format!("result {name}"), || async {
                results.get(&name).await.unwrap()
            })
            .await;
            let result: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(result, expected_result(job));
            note(format!("job {}: result {result}", job.job_id));
        }

        // The keeper's retries follow the 429's Retry-After and its own
        // backoff, so the protection may land after these short jobs (it
        // lasts the idle grace, 120 s, past them).
        let (throttled, failed) = (throttled + 1, failed + 1);
        let outcome = self
            .arm
            .wait_for(
                "ARM answering 429, then 500, then the VM protected",
                PATIENCE,
                |fleet| {
                    let answered = |status| fleet.answered.get(&status).copied().unwrap_or(0);
                    answered(429) >= throttled
                        && answered(500) >= failed
                        && fleet.protections[protections_before..]
                            .iter()
                            .any(|(_, protect)| *protect)
                },
            )
            .await;
        assert!(outcome.is_ok(), "{outcome:?}; worker log:\n{}", vm.log());
        assert_eq!(
            (self.arm.answered(429), self.arm.answered(500)),
            (throttled, failed),
            "one 429 and one 500, each answered once"
        );

        let big = PrimesJob::new("big", 0, 200_000_000_000).unwrap();
        queue.send(&big.to_message(), Duration::ZERO).await.unwrap();
        wait_for(&vm, "the long job's first checkpoint", || async {
            checkpoints.read("big").await.unwrap()
        })
        .await;
        let protected = self.arm.vm(&self.scale_set, INSTANCE_ID);
        assert_eq!(
            protected.map(|vm| vm.protected),
            Some(true),
            "the VM is protected from scale-in while the long job runs"
        );
        let preempt = self.preempt_drains(&mut vm, env, "exit 0").await;
        let approval = self
            .emulator
            .approvals()
            .into_iter()
            .find(|a| a.event_id == preempt.id)
            .unwrap_or_else(|| panic!("the Preempt was not approved; log:\n{}", vm.log()));
        note(format!(
            "IMDS saw the approval POST for {}",
            approval.event_id
        ));
        let released = self.arm.vm(&self.scale_set, INSTANCE_ID);
        assert_eq!(
            (
                released.map(|vm| vm.protected),
                self.arm.protections().last().map(|(_, protect)| *protect)
            ),
            (Some(false), Some(false)),
            "the worker released its VM's protection on exit: {:?}",
            self.arm.protections()
        );
        note(format!(
            "ARM stand-in: protections {:?} (429 then 500 on one call), released on exit",
            &self.arm.protections()[protections_before..]
        ));
        // Azure evicts the VM now; the next VM in the box starts clean.
        self.emulator.complete_event(&preempt.id).unwrap();
        take_back_released(queue, "big").await;

        let tokens: Vec<_> = self
            .emulator
            .tokens()
            .into_iter()
            .filter(|t| t.client_id == CLIENT_ID)
            .collect();
        assert!(!tokens.is_empty());
        let bearer = bearer_validations(&self.azurite) - bearer_before;
        assert!(bearer > 0, "Azurite authorised requests by bearer token");
        note(format!(
            "IMDS issued {} token(s) to {CLIENT_ID} (resource {}); Azurite authorised {bearer} request(s) by bearer token",
            tokens.len(),
            tokens[0].resource
        ));
        for line in vm.transcript(&[
            "managed identity token acquired",
            "warmup gate",
            "Preempt",
            "approv",
            "drain",
            "released",
            "stopped",
        ]) {
            note(format!("  worker: {line}"));
        }
    }

    pub async fn short_lived_tokens_are_refreshed(
        &self,
        binary: &Path,
        env: &BTreeMap<String, String>,
    ) {
        const LIFETIME_SECS: u64 = 8;
        self.identity(serde_json::json!({"token_lifetime_secs": LIFETIME_SECS}))
            .await;
        let first_token_at = self.emulator.tokens().len();
        let queue = self.operator.queue(&env["SPOT_WORKER_QUEUE"]).unwrap();
        let results = self
            .operator
            .result_store(&env["SPOT_WORKER_RESULTS_CONTAINER"])
            .unwrap();
        let mut vm = Vm::start(binary, env);
        vm.until_ready().await;
        let first = self.emulator.tokens()[first_token_at].clone();
        let expired_at = SystemTime::UNIX_EPOCH + Duration::from_secs(first.expires_on);
        // Wait (bounded) until the first token has expired, then give work.
        wait_for(&vm, "the first token to expire", || async {
            (SystemTime::now() > expired_at + Duration::from_secs(1)).then_some(())
        })
        .await;
        let late = enqueue_primes(&queue, "after-expiry", 1_000_000).await;
        let bytes = wait_for(&vm, "the job given after expiry", || async {
            results.get("after-expiry.json").await.unwrap()
        })
        .await;
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            expected_result(&late)
        );
        assert!(vm.stop().await.success());
        let newer = self
            .emulator
            .tokens()
            .iter()
            .filter(|t| t.expires_on > first.expires_on)
            .count();
        assert!(
            newer > 0,
            "fresh tokens were fetched after the first expired"
        );
        self.identity(serde_json::json!({"token_lifetime_secs": 86_400}))
            .await;
        note(format!(
            "{LIFETIME_SECS} s tokens: the worker kept working past the first token's expiry ({newer} newer token(s) fetched)"
        ));
    }
}
