//! The pod-in-a-box cases: two pods on one node drained by its Preempt
//! without approving it, and a pod set up wrongly failing clearly with
//! nothing taken (the scale-ins are in `pod_scale_in`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spot_worker::azure::{AzureQueue, BlobCheckpointStore};
use spot_worker::storage::{CheckpointStore, MessageQueue};
use spot_worker_imds_emulator::EventSpec;

use super::pod::{NODE_VM, Node, TOKEN_FILE, WORKER_CLIENT_ID, note};
use super::the_box::{assert_untouched, bearer_validations, wait_for};
use super::vm::{PATIENCE, Vm};
use crate::common::enqueue_primes;

/// `terminationGracePeriodSeconds` in deploy/kubernetes/deployment.yaml.
pub const GRACE: Duration = Duration::from_secs(35);
/// The worker's drain budget (`SPOT_WORKER_DRAIN_BUDGET`'s default, which
/// the Deployment keeps).
const DRAIN_BUDGET: Duration = Duration::from_secs(25);
/// A Preempt's notice.
const NOTICE: Duration = Duration::from_secs(30);
/// What the worker logs for a job released by a drain.
pub const RELEASED: &str = "released on shutdown (not counted as a failure)";

/// What a run measured, for docs/benchmarks.md.
#[derive(Debug, Default)]
pub struct Measured {
    /// Notice -> both messages visible again (seen from outside).
    pub preempt_released: Duration,
    /// Each pod's own notice -> drained (its log's `notice_to_drained_ms`).
    pub preempt_drained_ms: Vec<u64>,
    /// Notice -> each pod's exit (when the unapproved event starts).
    pub preempt_exits: Vec<Duration>,
    pub stop_to_exit: Duration,
}

impl Node {
    /// A client id Entra ID does not know: AADSTS700016 in `/readyz`.
    pub async fn wrong_client_id(&self, env: &BTreeMap<String, String>, queue: &AzureQueue) {
        let mut env = env.clone();
        env.insert(
            "AZURE_CLIENT_ID".into(),
            "11111111-2222-3333-4444-555555555555".into(),
        );
        let tokens = self.token_dir("wrong-client", Some(3600));
        let mut pod = self.start_pod("wrong-client", &env, 8091, &tokens, 0);
        let error = pod.until_gate_fails_with("storage", "700016").await;
        self.stop_negative(&mut pod, "wrong-client").await;
        assert_untouched(queue).await;
        note(format!(
            "wrong client id: not ready, /readyz storage: {error}"
        ));
    }

    /// A projected token past its expiry: AADSTS700024 in `/readyz`.
    pub async fn expired_token(&self, env: &BTreeMap<String, String>, queue: &AzureQueue) {
        let tokens = self.token_dir("expired", Some(-600));
        let mut pod = self.start_pod("expired", env, 8092, &tokens, 0);
        let error = pod.until_gate_fails_with("storage", "700024").await;
        self.stop_negative(&mut pod, "expired").await;
        assert_untouched(queue).await;
        note(format!(
            "expired token file: not ready, /readyz storage: {error}"
        ));
    }

    /// No token file where `AZURE_FEDERATED_TOKEN_FILE` says: the worker
    /// exits at start with an error naming it.
    pub async fn missing_token_file(&self, env: &BTreeMap<String, String>, queue: &AzureQueue) {
        let tokens = self.token_dir("missing", None);
        let mut pod = self.start_pod("missing", env, 8093, &tokens, 0);
        let status = pod.exit_within(PATIENCE).await;
        let log = pod.log();
        assert!(!status.success(), "the worker must not run:\n{log}");
        assert!(
            log.contains(TOKEN_FILE) && log.contains("AZURE_FEDERATED_TOKEN_FILE"),
            "the error names the file and the variable:\n{log}"
        );
        assert_untouched(queue).await;
        let line = log
            .lines()
            .find(|l| l.contains(TOKEN_FILE))
            .unwrap_or_default();
        note(format!("missing token file: exit {status}: {line}"));
    }

    async fn stop_negative(&self, pod: &mut Vm, name: &str) {
        self.stop_pod(name, Duration::from_secs(10)).await;
        let status = pod.exit_within(Duration::from_secs(30)).await;
        assert!(status.success(), "exit {status}:\n{}", pod.log());
    }

    /// Two pods on the node, each with a long job; the node's Preempt
    /// drains and releases both, neither approves, both exit 0 in time.
    pub async fn preempt_drains_two_pods(
        &self,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
        measured: &mut Measured,
    ) {
        let checkpoints = self.checkpoints(env);
        let mut pods = Vec::new();
        for (i, job_id) in ["pod-a-job", "pod-b-job"].into_iter().enumerate() {
            let name = format!("worker-{}", ["a", "b"][i]);
            let tokens = self.token_dir(&name, Some(3600));
            let started = Instant::now();
            let mut pod = self.start_pod(&name, env, 8081 + i as u16, &tokens, i);
            pod.until_ready().await;
            note(format!("{name} ready after {:?}", started.elapsed()));
            // One job at a time, each taken by the pod started last: the
            // other already holds its one (concurrency 1 on one CPU).
            enqueue_primes(queue, job_id, 200_000_000_000).await;
            wait_for(&pod, &format!("{job_id}'s first checkpoint"), || async {
                checkpoints.read(job_id).await.unwrap()
            })
            .await;
            pods.push((name, pod));
        }
        // Storage reached with tokens from the exchange, by bearer token.
        for (name, pod) in &pods {
            assert!(
                pod.log().contains("storage credentials chosen")
                    && pod.log().contains("\"workload identity\""),
                "{name} names its credential:\n{}",
                pod.log()
            );
        }
        let exchanged = self
            .emulator
            .tokens()
            .iter()
            .filter(|t| t.client_id == WORKER_CLIENT_ID)
            .count();
        let bearer = bearer_validations(&self.azurite);
        assert!(exchanged >= 2 && bearer > 0, "{exchanged} tokens, {bearer}");
        note(format!(
            "Entra ID's exchange issued {exchanged} storage token(s) to {WORKER_CLIENT_ID}; \
             Azurite authorised {bearer} request(s) by bearer token"
        ));
        let preempt = self
            .emulator
            .schedule(EventSpec::preempt().resources([NODE_VM]))
            .unwrap();
        let notice = Instant::now();
        // Released while the notice runs: both messages visible again
        // (peeked, so not taken) within the drain budget.
        let jobs = ["pod-a-job", "pod-b-job"];
        wait_for(&pods[0].1, "both messages visible again", || async {
            let peeked = queue.peek(32).await.unwrap();
            jobs.iter()
                .all(|job| peeked.iter().any(|m| m.body.contains(job)))
                .then_some(())
        })
        .await;
        let released = notice.elapsed();
        assert!(released < DRAIN_BUDGET, "released after {released:?}");
        measured.preempt_released = released;
        note(format!(
            "Preempt {}: both messages visible again {released:?} after the notice",
            preempt.id
        ));
        for (name, pod) in &pods {
            assert!(
                !pod.is_ready().await,
                "{name} is not ready while it waits for the event:\n{}",
                pod.log()
            );
        }
        // Not approved, the event starts at its NotBefore (the node goes
        // down then); parked until then, each pod exits 0 when it starts.
        let exits = futures_util::future::join_all(pods.iter_mut().map(|(_, pod)| async move {
            let status = pod.exit_within(NOTICE + Duration::from_secs(15)).await;
            (status, notice.elapsed())
        }))
        .await;
        for ((name, pod), (status, after)) in pods.iter().zip(&exits) {
            let log = pod.log();
            assert!(status.success(), "{name}: exit {status}:\n{log}");
            assert!(log.contains(RELEASED), "{name} released its job:\n{log}");
            assert!(log.contains("not approved"), "{name} parked:\n{log}");
            let drained = drained_ms(&log);
            note(format!(
                "{name}: drained {drained} ms after seeing the notice, not approved; \
                 exit 0 {after:?} after the notice (the event started)"
            ));
            measured.preempt_drained_ms.push(drained);
            measured.preempt_exits.push(*after);
        }
        let approvals: Vec<_> = self
            .emulator
            .approvals()
            .into_iter()
            .filter(|a| a.event_id == preempt.id)
            .collect();
        assert!(
            approvals.is_empty(),
            "a pod approved its node's Preempt: {approvals:?}"
        );
        self.emulator.complete_event(&preempt.id).unwrap();
        let mut back = queue.receive(32, Duration::from_secs(30)).await.unwrap();
        back.retain(|m| jobs.iter().any(|job| m.body.contains(job)));
        assert_eq!(back.len(), 2, "both messages are visible");
        for message in back {
            queue
                .delete(&message.id, &message.pop_receipt)
                .await
                .unwrap();
        }
        for job_id in jobs {
            assert!(checkpoints.read(job_id).await.unwrap().is_some());
        }
        note(format!(
            "Preempt {} of {NODE_VM}: no approval; both exited 0, the last {:?} after the \
             notice ({NOTICE:?} notice, {GRACE:?} grace)",
            preempt.id,
            exits.iter().map(|(_, after)| *after).max().unwrap()
        ));
    }
}

pub fn env_or(env: &BTreeMap<String, String>, key: &str, default: &str) -> String {
    env.get(key).cloned().unwrap_or_else(|| default.to_owned())
}

impl Node {
    /// The checkpoint store the pods of `env` save to, as the operator reads it.
    pub fn checkpoints(&self, env: &BTreeMap<String, String>) -> BlobCheckpointStore {
        self.operator
            .checkpoint_store(&env_or(
                env,
                "SPOT_WORKER_CHECKPOINT_CONTAINER",
                "checkpoints",
            ))
            .unwrap()
    }
}

/// The worker's `notice_to_drained_ms` from its (possibly coloured) log.
fn drained_ms(log: &str) -> u64 {
    let plain: String = {
        let mut out = String::new();
        let mut chars = log.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // An ANSI colour sequence: ESC [ ... m.
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    plain
        .split("notice_to_drained_ms=")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no notice_to_drained_ms in the log:\n{log}"))
}
