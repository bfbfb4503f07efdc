//! The command path deployed: the templates rendered with `workerCommand`
//! (`python3 primes.py`, with the flags `examples/command/primes.py` asks
//! for) and an application bundle (`examples/command`, packed as
//! `scripts/deploy.sh` packs a directory). `install-worker.sh` installs the
//! `spot-worker` command and unpacks the bundle; the unit's `ExecStart`,
//! split as systemd splits it, runs in its `WorkingDirectory` with exactly
//! the rendered environment file. A Python job succeeds (its result equals
//! `primes`'), and a Preempt drains a running one: exit 0 within the drain
//! budget, the event approved, the message back at once, progress saved.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spot_worker::azure::AzureQueue;
use spot_worker::storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_primes::{PrimesJob, expected_result};
use spot_worker_testkit::chaos::cli_binary;

use super::run;
use super::the_box::{TheBox, deployment_values, note, sha256, take_back_released, wait_for};
use super::vm::Vm;
use crate::common::enqueue_primes;
use crate::rendered::{exec_start_words, render, repo};

/// The program and the `run` settings it needs (`--job-key`: checkpoints
/// and results by `job_id`; `--result-name`: `primes`' result names).
const RUN_FLAGS: &str = "--job-key job_id --result-name {job_key}.json";
const COMMAND: &str = "python3 primes.py";

/// What `main.bicep` passes for `workerCommand`, `workerRunFlags` and a
/// bundle: `workerArgs` as its expression builds it.
fn command_values(
    account: &str,
    cli_sha256: &str,
    bundle: &str,
    bundle_sha256: &str,
) -> BTreeMap<&'static str, String> {
    let blob = format!("https://{account}.blob.core.windows.net/");
    let mut values = deployment_values(account, cli_sha256);
    values.insert("workerBinaryUrl", format!("{blob}artifacts/spot-worker"));
    values.insert("workerArgs", format!("run {RUN_FLAGS} -- {COMMAND}"));
    values.insert("workerBundleUrl", format!("{blob}artifacts/{bundle}"));
    values.insert("workerBundleSha256", bundle_sha256.to_owned());
    values
}

impl TheBox {
    pub async fn the_command_path_works(&self, queue: &AzureQueue) {
        // The bundle, packed as scripts/deploy.sh packs a directory.
        let bundle = self.dir.join("app.tar.gz");
        let examples = repo().join("examples/command");
        run(
            "tar",
            &[
                "-czf",
                bundle.to_str().unwrap(),
                "-C",
                examples.to_str().unwrap(),
                ".",
            ],
        );
        let bundle_sha256 = sha256(&bundle);
        let bundle_name = format!("app-{}.tar.gz", &bundle_sha256[..16]);
        let cli = cli_binary().expect("the spot-worker command (built by the outer test)");
        let cli_sha256 = sha256(&cli);
        let rendered = render(&command_values(
            &self.account,
            &cli_sha256,
            &bundle_name,
            &bundle_sha256,
        ));
        let env = rendered.env.clone();
        assert_eq!(
            env,
            self.vm_env(),
            "the command path has the same environment file"
        );

        let root = self
            .install_into(
                &rendered,
                "root-command",
                &[("spot-worker", &cli), (&bundle_name, &bundle)],
            )
            .await;
        let words = exec_start_words(&rendered.unit["ExecStart"]);
        note(format!("command path: ExecStart={}", words.join(" ")));
        assert_eq!(words[..2], ["/opt/spot-worker/bin/worker", "run"]);
        assert!(
            words.ends_with(&["--".into(), "python3".into(), "primes.py".into()]),
            "{words:?}"
        );
        let inside = |path: &str| root.join(path.trim_start_matches('/'));
        let program = inside(&words[0]);
        assert_eq!(sha256(&program), cli_sha256);
        let workdir = inside(rendered.unit["WorkingDirectory"].trim_start_matches('-'));
        assert!(
            workdir.join("primes.py").is_file(),
            "the bundle is unpacked into {}",
            workdir.display()
        );

        let mut vm = Vm::exec(&program, &words[1..], Some(&workdir), &env);
        self.python_jobs_and_a_preempt(&mut vm, &env, queue).await;
    }

    async fn python_jobs_and_a_preempt(
        &self,
        vm: &mut Vm,
        env: &BTreeMap<String, String>,
        queue: &AzureQueue,
    ) {
        let started = Instant::now();
        vm.until_ready().await;
        note(format!(
            "spot-worker run ready after {:?}",
            started.elapsed()
        ));
        let (results, checkpoints) = self.worker_stores(env);
        let small = enqueue_primes(queue, "py-small", 2_000_000).await;
        let bytes = wait_for(vm, "result py-small.json", || async {
            results.get("py-small.json").await.unwrap()
        })
        .await;
        let result: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(result, expected_result(&small));
        note(format!("python job py-small: result {result}"));

        let big = PrimesJob::new("py-big", 0, 200_000_000_000).unwrap();
        queue.send(&big.to_message(), Duration::ZERO).await.unwrap();
        wait_for(vm, "the python job's first checkpoint", || async {
            checkpoints.read("py-big").await.unwrap()
        })
        .await;
        let preempt = self
            .preempt_drains(vm, env, "spot-worker run exited 0")
            .await;
        assert!(
            self.emulator
                .approvals()
                .iter()
                .any(|a| a.event_id == preempt.id),
            "the Preempt was not approved; log:\n{}",
            vm.log()
        );
        self.emulator.complete_event(&preempt.id).unwrap();
        take_back_released(queue, "py-big").await;
        let saved = checkpoints.read("py-big").await.unwrap();
        assert!(saved.is_some(), "the python job's progress is saved");
        for line in vm.transcript(&["warmup gate", "Preempt", "approv", "released", "stopped"]) {
            note(format!("  spot-worker run: {line}"));
        }
    }
}
