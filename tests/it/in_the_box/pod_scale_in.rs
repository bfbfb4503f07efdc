//! The pod-in-a-box scale-in (issue 39, item 2): two pods, one busy and one
//! idle, each keeping its pod's deletion cost through the API server's
//! stand-in at `https://10.0.0.1` with the Deployment's shipped settings;
//! KEDA scales the Deployment from 2 to 1, the ReplicaSet controller (the
//! stand-in) picks the idle pod by its cost, the kubelet stops it
//! (`podman stop -t 35`); the busy one keeps its job and finishes it. Then
//! a scale-in of the last, busy pod drains it: exit 0, its message visible
//! again at once, not counted as a failure.
//!
//! With the shipped step (`SPOT_WORKER_POD_DELETION_COST_STEP`, a minute)
//! a busy pod's cost is 1 until a minute of work is unsaved and changes at
//! most once a minute; the box's jobs save every 10 s, so here the cost goes
//! 0 → 1 → 0. Its rise with unsaved work and fall at a save is shown on
//! loopback (`tests/it/pod_deletion_cost.rs`, a 1 s step).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spot_worker::azure::AzureQueue;
use spot_worker::storage::{Checkpoint, CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::PrimesJob;

use super::pod::{API_SERVER_IP, NAMESPACE, Node, note};
use super::pod_cases::{GRACE, Measured, RELEASED, env_or};
use super::the_box::wait_for;
use super::vm::{PATIENCE, Vm};
use crate::common::enqueue_primes;

/// The job the busy pod keeps through the scale-in: long enough to be
/// held when the scale-in comes (a few seconds after it is taken: the
/// image's worker counts it in about 8 s of one core), short enough that
/// the test's own unoptimised recount (a debug build, about 80 s of one
/// core, started when the job is sent) ends within the rest of the run.
/// The dev profile stays unoptimised for the sieve: the end-to-end suites
/// size their jobs for a debug build's speed.
const KEPT_JOB_END: u64 = 5_000_000_000;

impl Node {
    /// A scale-in from 2 to 1 with one busy and one idle pod removes the
    /// idle one; the busy one keeps and finishes its job; then a scale-in
    /// of the last pod while busy drains it.
    pub async fn scale_in_removes_the_idle_pod_and_drains_a_busy_one(
        &self,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
        measured: &mut Measured,
    ) {
        // A fixed interval, so the jobs save within the waits below: by now
        // the fleet's counts hold the first pods' cheap saves and their
        // drains that saved, and the adaptive interval (Daly's) is minutes.
        let mut env = env.clone();
        env.insert("SPOT_WORKER_CHECKPOINT_EVERY".to_owned(), "10s".to_owned());
        let env = &env;
        // The earlier cases' pods have stopped: their objects are gone, so
        // the ReplicaSet holds the two below.
        for name in self.kube.cluster().pods.keys() {
            self.kube.delete_pod(name);
        }
        let mut pods = BTreeMap::new();
        for (i, name) in ["worker-c", "worker-d"].into_iter().enumerate() {
            let tokens = self.token_dir(name, Some(3600));
            let mut pod = self.start_pod(name, env, 8083 + i as u16, &tokens, i);
            pod.until_ready().await;
            pods.insert(name, pod);
        }
        self.kube
            .wait_for("both pods' deletion cost 0, written once", PATIENCE, |c| {
                c.costs("worker-c") == [0] && c.costs("worker-d") == [0]
            })
            .await
            .unwrap();
        self.refused_outside_the_role().await;

        let kept = PrimesJob::new("kept-job", 0, KEPT_JOB_END).unwrap();
        // The test's own count of the range, to check the result against:
        // as long as the worker's, so it runs beside it, off the runtime.
        let expected = tokio::task::spawn_blocking({
            let kept = kept.clone();
            move || {
                let counting = Instant::now();
                (
                    spot_worker_primes::expected_result(&kept),
                    counting.elapsed(),
                )
            }
        });
        queue
            .send(&kept.to_message(), Duration::ZERO)
            .await
            .unwrap();
        let busy_now = |c: &spot_worker_testkit::kube_stand_in::Cluster| {
            ["worker-c", "worker-d"]
                .into_iter()
                .find(|p| c.pods.get(*p).is_some_and(|pod| pod.cost() > 0))
        };
        self.kube
            .wait_for("a pod's deletion cost above 0", PATIENCE, |c| {
                busy_now(c).is_some()
            })
            .await
            .unwrap();
        let busy = busy_now(&self.kube.cluster()).unwrap();
        let idle = if busy == "worker-c" {
            "worker-d"
        } else {
            "worker-c"
        };
        let costs = self.kube.cluster();
        note(format!(
            "deletion costs written: {busy} (took kept-job) {:?}, {idle} {:?}",
            costs.costs(busy),
            costs.costs(idle)
        ));
        // KEDA scales the Deployment from 2 to 1: the controller picks.
        let removed = self.kube.scale_in(1);
        assert_eq!(removed, [idle], "{costs:?}");
        let mut gone = pods.remove(idle).unwrap();
        let stop_took = self.stop_pod(idle, GRACE).await;
        let status = gone.exit_within(Duration::from_secs(5)).await;
        let log = gone.log();
        assert!(status.success(), "{idle}: exit {status}:\n{log}");
        assert!(!log.contains(RELEASED), "{idle} held nothing:\n{log}");
        note(format!(
            "scale-in 2 -> 1: the stand-in removed {removed:?}; podman stop -t {} of it \
             returned after {stop_took:?}, exit 0",
            GRACE.as_secs()
        ));

        // The busy one keeps its job and finishes it; idle again, its cost
        // goes back to 0.
        let mut survivor = pods.remove(busy).unwrap();
        let results = self
            .operator
            .result_store(&env_or(env, "SPOT_WORKER_RESULTS_CONTAINER", "results"))
            .unwrap();
        let finishing = Instant::now();
        let result = wait_for(&survivor, "kept-job's result", || async {
            results.get("kept-job.json").await.unwrap()
        })
        .await;
        let result_seen = finishing.elapsed();
        let result: serde_json::Value = serde_json::from_slice(&result).unwrap();
        let (expected, counted_in) = expected.await.unwrap();
        assert_eq!(result, expected);
        self.kube
            .wait_for(&format!("{busy}'s cost back to 0"), PATIENCE, |c| {
                c.costs(busy).last() == Some(&0) && c.costs(busy).iter().any(|v| *v > 0)
            })
            .await
            .unwrap();
        survivor.assert_running("idle after its job");
        note(format!(
            "{busy} kept kept-job and finished it: its result seen {result_seen:?} after the \
             scale-in (the test's own count of the range took {counted_in:?}), its cost back \
             to 0 seen {:?} after; its costs {:?}",
            finishing.elapsed(),
            self.kube.costs(busy)
        ));

        self.busy_pod_drains(env, queue, busy, &mut survivor, measured)
            .await;
        let cluster = self.kube.cluster();
        let refused: Vec<_> = cluster.log.iter().filter(|a| a.status != 200).collect();
        assert_eq!(
            refused.len(),
            2,
            "only the test's two requests outside the Role were refused: {refused:?}"
        );
        for pod in ["worker-c", "worker-d"] {
            let log = if pod == busy {
                survivor.log()
            } else {
                gone.log()
            };
            assert!(!log.contains(&self.kube_token), "{pod} logged its token");
        }
    }

    /// Requests outside the Role (a `get` of a pod, a `patch` in another
    /// namespace) with the service account's own token: both 403.
    async fn refused_outside_the_role(&self) {
        let ca = std::fs::read(&self.ca_cert).unwrap();
        let client = reqwest::Client::builder()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).unwrap())
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let base = format!("https://{API_SERVER_IP}:443/api/v1/namespaces");
        let get = client
            .get(format!("{base}/{NAMESPACE}/pods/worker-c"))
            .bearer_auth(&self.kube_token)
            .send()
            .await
            .unwrap();
        let patch = client
            .patch(format!("{base}/default/pods/worker-c"))
            .bearer_auth(&self.kube_token)
            .header("content-type", "application/merge-patch+json")
            .body(r#"{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"9"}}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            (get.status().as_u16(), patch.status().as_u16()),
            (403, 403),
            "outside the Role"
        );
        note("outside the Role (get a pod; patch in namespace default): 403, 403");
    }

    /// A KEDA scale-in of the last pod while it is busy: `podman stop -t
    /// 35` drains it: exit 0, message released at once, not counted.
    async fn busy_pod_drains(
        &self,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
        name: &str,
        pod: &mut Vm,
        measured: &mut Measured,
    ) {
        let checkpoints = self.checkpoints(env);
        enqueue_primes(queue, "scaled-in-job", 200_000_000_000).await;
        wait_for(pod, "scaled-in-job's first checkpoint", || async {
            checkpoints.read("scaled-in-job").await.unwrap()
        })
        .await;
        let stopping = Instant::now();
        let stop_took = self.stop_pod(name, GRACE).await;
        let status = pod.exit_within(Duration::from_secs(5)).await;
        let exited = stopping.elapsed();
        let log = pod.log();
        assert!(status.success(), "exit {status}:\n{log}");
        assert!(stop_took < GRACE, "drained before the SIGKILL:\n{log}");
        assert!(log.contains(RELEASED), "the job was released:\n{log}");
        let back = queue.receive(1, Duration::from_secs(30)).await.unwrap();
        assert_eq!(back.len(), 1, "the message is visible again at once");
        assert_eq!(
            PrimesJob::parse(back[0].body.as_bytes()).unwrap().job_id,
            "scaled-in-job"
        );
        // Not counted: the message's attempt record (beside the
        // checkpoints) holds the release, and no failure.
        let record = checkpoints
            .read(&format!(".spot-worker/attempts/{}", back[0].id))
            .await
            .unwrap()
            .expect("the release is recorded");
        let Checkpoint::InProgress { progress } = record.checkpoint else {
            panic!("an attempt record is in progress: {:?}", record.checkpoint);
        };
        assert_eq!(progress["releases"], 1, "{progress}");
        assert_eq!(progress["failures"], 0, "{progress}");
        queue
            .delete(&back[0].id, &back[0].pop_receipt)
            .await
            .unwrap();
        measured.stop_to_exit = stop_took;
        note(format!(
            "podman stop -t {} of busy {name} (a KEDA scale-in): exit 0, released uncounted; \
             podman stop returned after {stop_took:?} (exit seen after {exited:?})",
            GRACE.as_secs()
        ));
    }
}
