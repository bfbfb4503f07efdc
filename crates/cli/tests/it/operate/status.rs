//! `spot-worker status`.

use std::process::Stdio;
use std::sync::Arc;

use spot_worker_azure::AzureStorage;
use spot_worker_consumer::{HandlerError, Job, handler_fn};
use spot_worker_storage::{
    Checkpoint, CheckpointStore as _, FleetLedger, MessageEncoding, WritePrecondition,
};

use spot_worker_decisions::cadence::InterruptionCounts;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use super::common::*;

/// A port on loopback nobody listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_queues_the_jobs_in_progress_and_the_workers_readiness() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    enqueue_lines(&azurite, b"{\"job_id\":\"a\"}\n{\"job_id\":\"b\"}\n").await;
    let store = prepared_checkpoints(&storage).await;
    let running = Checkpoint::InProgress {
        progress: serde_json::json!({"done": 3, "of": 10}),
    };
    store
        .write("a", &running, WritePrecondition::Create, None)
        .await
        .unwrap();
    let done = Checkpoint::Completed {
        result: serde_json::json!(1),
    };
    store
        .write("b", &done, WritePrecondition::Create, None)
        .await
        .unwrap();
    // The fleet's interruption counts, as workers left them.
    let history = InterruptionCounts {
        drained: 3,
        unsaved: 1,
        late: 1,
        no_outcome: 2,
        job_seconds: 50.0 * 3600.0,
        saves: 4,
        save_seconds: 2.0,
        losses: 2,
        lost_seconds: 5.0,
        ..InterruptionCounts::default()
    };
    FleetLedger::for_queue(Arc::new(store.clone()), QUEUE)
        .add(&history)
        .await
        .unwrap();
    let nobody = format!("http://127.0.0.1:{}", closed_port());
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    let screen = run(cli().args(["status", "--health", &nobody])).await;
    screen.assert_success();
    let text = &screen.stdout;
    assert!(text.contains("queue   jobs"), "{text}");
    assert!(
        text.contains("~2 message(s), oldest visible waiting"),
        "{text}"
    );
    assert!(text.contains("poison  jobs-poison"), "{text}");
    assert!(text.contains("~0 message(s)"), "{text}");
    assert!(
        text.contains("jobs    1 in progress, 1 completed"),
        "{text}"
    );
    assert!(text.contains("{\"done\":3,\"of\":10}"), "{text}");
    assert!(text.contains(&format!("{nobody}/readyz")), "{text}");
    assert!(text.contains("NOT READY (unreachable)"), "{text}");
    assert!(
        text.contains("fleet: 50.0 job-hours; 3 evictions saved at the notice, 1 drained without a save after it, 1 with a notice too late, 2 deliveries with no outcome"),
        "{text}"
    );
    // Per queue: the share of notices that saved, the work lost per
    // interruption.
    assert!(
        text.contains("60.0 % of notices saved (3 of 5 evictions; 1 drained without a save after the notice, 1 too late); 2.5 s of work lost per interruption that lost work (2 measured)"),
        "{text}"
    );
    assert!(
        text.contains("Daly's, for the fleet's mean save of 0.500 s"),
        "{text}"
    );

    // Each checkpoint read is a request: --max-reads bounds them.
    let bounded = run(cli().args(["status", "--json", "--max-reads", "0"])).await;
    bounded.assert_success();
    let bounded: serde_json::Value = serde_json::from_str(&bounded.stdout).unwrap();
    assert_eq!(bounded["checkpoints_not_read"], 2, "{bounded}");
    assert_eq!(
        bounded["jobs_in_progress"],
        serde_json::json!([]),
        "{bounded}"
    );

    // A real worker on the same storage: ready once its gate opened.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = format!("http://{}", listener.local_addr().unwrap());
    let worker = worker_off_azure(&storage)
        .with_checkpoints(Arc::new(store))
        .with_health_listener(listener);
    let stop = worker.shutdown_token();
    let mut readiness = worker.readiness();
    let handler = handler_fn(|_job: Job| async { Ok::<(), HandlerError>(()) });
    let task = tokio::spawn(worker.run(handler));
    tokio::time::timeout(WAIT_LIMIT, readiness.wait_for(|r| r.is_ready()))
        .await
        .expect("the worker gets ready in time")
        .unwrap();

    let json = run(cli().args([
        "status",
        "--json",
        "--watch",
        "--interval",
        "100ms",
        "--count",
        "2",
        "--health",
        &health,
    ]))
    .await;
    json.assert_success();
    let screens: Vec<serde_json::Value> = json
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(screens.len(), 2, "{}", json.stdout);
    let last = &screens[1];
    assert_eq!(last["workers"][0]["ready"], true, "{last}");
    assert_eq!(last["workers"][0]["detail"], "200 OK", "{last}");
    assert_eq!(last["poison"]["name"], "jobs-poison");
    assert_eq!(last["jobs_in_progress"][0]["job"], "a");
    assert_eq!(last["jobs_in_progress"][0]["progress"]["done"], 3);
    assert_eq!(last["completed_jobs"], 1);
    assert_eq!(last["checkpoints_not_read"], 0);
    assert!(last["queue"]["approximate_depth"].is_u64(), "{last}");

    stop.cancel();
    tokio::time::timeout(WAIT_LIMIT, task)
        .await
        .expect("the worker stops in time")
        .unwrap()
        .unwrap();
    // The worker added the job time it saw to the fleet's counts as it
    // stopped, keeping the history.
    let after = run(cli().args(["status", "--json"])).await;
    after.assert_success();
    let after: serde_json::Value = serde_json::from_str(&after.stdout).unwrap();
    let counts = &after["checkpoint_interval"]["counts"];
    assert_eq!(counts["drained"], 3, "{after}");
    assert_eq!(after["notices"][0]["queue"], QUEUE, "{after}");
    assert_eq!(after["notices"][0]["saved_share"], 0.6, "{after}");
    assert_eq!(
        after["notices"][0]["lost_per_interruption_seconds"], 2.5,
        "{after}"
    );
    assert!(
        counts["job_seconds"].as_f64().unwrap() > history.job_seconds,
        "{after}"
    );

    let bad = run(cli().args(["status", "--health", "10.0.0.4:8080"])).await;
    bad.assert_refused("is not a URL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_refreshes_until_ctrl_c() {
    let azurite = start_azurite();
    let mut child = spot_worker(&azurite, MessageEncoding::Text)
        .args(["status", "--watch", "--json", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut screens = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = tokio::time::timeout(PATIENCE, screens.next_line())
            .await
            .expect("a screen in time")
            .unwrap()
            .expect("a screen");
        let screen: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(screen["queue"]["name"], QUEUE);
    }
    // Ctrl-C (SIGINT) ends the loop: a clean exit, not a kill.
    let pid = child.id().expect("still running").to_string();
    let kill = Command::new("kill").args(["-INT", &pid]).status().await;
    assert!(kill.unwrap().success());
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("it stops in time")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Issue 16 item 7: the README's worker (progress saved, `complete` never
/// called, checkpoints keyed by the message id) leaves no checkpoint behind
/// once its messages are deleted, so `status` shows nothing in progress for
/// ever after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_worker_leaves_no_job_in_progress_once_its_jobs_are_done() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    enqueue_lines(&azurite, b"{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n").await;
    let store = storage.checkpoint_store("checkpoints").unwrap();
    let worker = worker_off_azure(&storage).with_checkpoints(Arc::new(store.clone()));
    let stop = worker.shutdown_token();
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (all_done, done) = tokio::sync::mpsc::channel::<()>(3);
    let mut done = done;
    // The README's handler, as printed there (three steps instead of ten).
    let handler = handler_fn({
        let keys = Arc::clone(&keys);
        move |job: Job| {
            let (keys, all_done) = (Arc::clone(&keys), all_done.clone());
            async move {
                let mut checkpoint = job.checkpoint().await?;
                let done = checkpoint
                    .progress()
                    .and_then(|p| p["step"].as_u64())
                    .unwrap_or(0);
                for step in done..3 {
                    if job.cancellation().is_cancelled() {
                        return Err("interrupted".into());
                    }
                    checkpoint
                        .save_progress(serde_json::json!({ "step": step + 1 }))
                        .await?;
                }
                keys.lock().unwrap().push(job.key().to_owned());
                let _ = all_done.send(()).await;
                Ok::<(), HandlerError>(())
            }
        }
    });
    let task = tokio::spawn(worker.run(handler));
    for _ in 0..3 {
        tokio::time::timeout(WAIT_LIMIT, done.recv())
            .await
            .expect("the jobs finish in time")
            .unwrap();
    }
    // Stopping settles what has finished: deleted, with its checkpoint.
    stop.cancel();
    let report = tokio::time::timeout(WAIT_LIMIT, task)
        .await
        .expect("the worker stops in time")
        .unwrap()
        .unwrap();
    assert_eq!(report.stats.succeeded, 3, "{:?}", report.stats);

    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    for key in &keys {
        assert_eq!(store.read(key).await.unwrap(), None, "checkpoint {key}");
    }
    let screen = run(spot_worker(&azurite, MessageEncoding::Text).args(["status"])).await;
    screen.assert_success();
    screen.assert_stdout_has("jobs    0 in progress, 0 completed");
}

/// A job that failed once after some work and then succeeded: its
/// completion record (two deliveries) is what `status` sums up, with its
/// cost when a price is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_goodput_of_finished_jobs_and_their_cost() {
    use std::time::Duration;

    use spot_worker_consumer::{Consumer, ConsumerConfig};
    use spot_worker_storage::MessageQueue as _;

    let azurite = start_azurite();
    let storage = storage(&azurite);
    let checkpoints = prepared_checkpoints(&storage).await;
    let queue = storage.queue(QUEUE).unwrap();
    queue.prepare().await.unwrap();
    queue.send("one job", Duration::ZERO).await.unwrap();
    let config = ConsumerConfig {
        retry_backoff_base: Duration::from_secs(1),
        idle_backoff_floor: Duration::from_millis(50),
        idle_backoff_max: Duration::from_millis(300),
        ..ConsumerConfig::default()
    };
    let poison = storage.poison_queue(QUEUE).unwrap();
    let consumer = Consumer::new(Arc::new(queue), Arc::new(poison), config)
        .unwrap()
        .with_checkpoints(Arc::new(checkpoints));
    // The first delivery works 300 ms and fails without saving: redone.
    let handler = handler_fn(|job: Job| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if job.dequeue_count() == 1 {
            return Err::<(), HandlerError>("failed after some work".into());
        }
        Ok(())
    });
    run_consumer_until(
        &consumer,
        handler,
        "the job to succeed on its second delivery",
        |stats| stats.succeeded == 1,
    )
    .await;

    let cli = || spot_worker(&azurite, MessageEncoding::Text);
    let screen = run(cli()
        .args(["status", "--json"])
        .env("SPOT_WORKER_PRICE_PER_HOUR", "3.6"))
    .await;
    screen.assert_success();
    let status: serde_json::Value = serde_json::from_str(&screen.stdout).unwrap();
    let goodput = &status["goodput"];
    assert_eq!(goodput["jobs"], 1, "{goodput}");
    let seconds = |kind: &str| goodput[format!("{kind}_seconds")].as_f64().unwrap();
    assert!(seconds("redone") >= 0.3, "{goodput}");
    assert!(seconds("useful") >= 0.3, "{goodput}");
    let share = goodput["goodput"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{goodput}");
    // The VM's share and the requests: redone time costs money too.
    let cost = &goodput["cost"];
    assert!(cost["redone"].as_f64().unwrap() > 0.0, "{goodput}");
    assert!(
        cost["total"].as_f64().unwrap() >= cost["useful"].as_f64().unwrap(),
        "{goodput}"
    );

    let text = run(cli().args(["status"])).await;
    text.assert_success();
    text.assert_stdout_has("useful over 1 finished job(s)");
    text.assert_stdout_has("  redone ");

    // A price that is not a number is refused, saying which setting.
    let refused = run(cli()
        .args(["status"])
        .env("SPOT_WORKER_PRICE_PER_HOUR", "cheap"))
    .await;
    assert!(refused.code != Some(0), "{}", refused.stdout);
    refused.assert_stderr_has("SPOT_WORKER_PRICE_PER_HOUR");
}

/// A checkpoint directory no save can store (over the 10,000-entry cap)
/// fails its delivery at the first look; `status` names the job by its
/// key with the refusal while its message waits to be tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_checkpoint_no_save_can_store_by_its_job_key() {
    let azurite = start_azurite();
    let _storage = deployed(&azurite).await;
    let cli = || spot_worker(&azurite, MessageEncoding::Text);
    enqueue_lines(&azurite, b"{\"job_id\":\"too-many-files\"}\n").await;
    // Made beside, then moved in whole: one look sees all of it.
    let program = "cd \"$SPOT_WORKER_WORK_DIR\" && mkdir many && cd many && \
                   seq 0 10000 | xargs touch && \
                   mv \"$SPOT_WORKER_WORK_DIR/many\" \"$SPOT_WORKER_CHECKPOINT_DIR/\" && exec sleep 60";
    let mut worker = start_worker(
        cli()
            .args(["run", "--", "sh", "-c", program])
            .env("SPOT_WORKER_JOB_KEY", "job_id")
            // Never poisoned while the test looks: the job keeps failing.
            .env("SPOT_WORKER_MAX_FAILURES", "1000"),
    );
    let screen = status_showing(&cli, "status naming the failing job", "too-many-files").await;
    let json = run(cli().args(["status", "--json"])).await;
    let status = stop_with_sigterm(&mut worker).await;
    assert_eq!(status.code(), Some(0));
    let line = screen
        .lines()
        .find(|line| line.contains("too-many-files"))
        .expect("a line for the job");
    assert!(
        line.contains("failure(s), last: ")
            && line.contains("more than 10000 files and directories"),
        "{screen}"
    );
    json.assert_success();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let failing = &json["failing"]["jobs"][0];
    assert_eq!(failing["job"], "too-many-files", "{json}");
    assert!(failing["failures"].as_u64() >= Some(1), "{json}");
    assert!(
        failing["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("more than 10000 files and directories")),
        "{json}"
    );
}

/// A checkpoint directory the program never lets hold still: the runner
/// records it at the tenth read in a row that found it changing, and
/// `status` shows it by the job's key (`save_trouble`, text and `--json`);
/// once the program holds still, the next good save deletes the record and
/// `status` shows it no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_directory_that_never_holds_still_until_it_is_saved() {
    let azurite = start_azurite();
    let _storage = deployed(&azurite).await;
    let cli = || spot_worker(&azurite, MessageEncoding::Text);
    enqueue_lines(&azurite, b"{\"job_id\":\"restless\"}\n").await;
    let dir = tempfile::tempdir().unwrap();
    let still = dir.path().join("still");
    // 8 MiB of ballast: a read takes longer than a rewrite of `state`
    // (as in crates/command/tests/unsettled.rs); then it holds still.
    let program = format!(
        "cd \"$SPOT_WORKER_CHECKPOINT_DIR\" && head -c 8388608 /dev/zero > ballast && i=0; \
         while [ ! -e '{still}' ] && [ $i -lt 400000 ]; do i=$((i + 1)); echo $i > state; done; \
         exec sleep 120",
        still = still.display()
    );
    let mut worker = start_worker(
        cli()
            .args(["run", "--", "sh", "-c", &program])
            .env("SPOT_WORKER_JOB_KEY", "job_id")
            .env("SPOT_WORKER_CHECKPOINT_EVERY", "1s"),
    );
    let screen = status_showing(
        &cli,
        "status naming the job that never held still",
        "directory never held still",
    )
    .await;
    let json = run(cli().args(["status", "--json"])).await;
    std::fs::write(&still, b"").unwrap();
    let after = poll_until("status with the record gone", || async {
        let json = run(cli().args(["status", "--json"])).await;
        json.assert_success();
        let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        (json["save_trouble"]["jobs"] == serde_json::json!([])).then_some(json)
    })
    .await;
    let status = stop_with_sigterm(&mut worker).await;
    assert_eq!(status.code(), Some(0));
    let line = screen
        .lines()
        .find(|line| line.contains("restless"))
        .expect("a line for the job");
    assert!(line.contains("directory never held still for"), "{screen}");
    json.assert_success();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let trouble = &json["save_trouble"]["jobs"][0];
    assert_eq!(trouble["job"], "restless", "{json}");
    assert_eq!(trouble["kind"], "never_held_still", "{json}");
    assert!(trouble["looks"].as_u64() >= Some(10), "{json}");
    assert!(trouble["for_seconds"].as_i64() >= Some(0), "{json}");
    assert_eq!(after["failing"]["jobs"], serde_json::json!([]), "{after}");
}

/// A worker of the library on `storage`'s queue, off Azure (no instance
/// metadata) and leaving signals and the watchdog to the test.
fn worker_off_azure(storage: &AzureStorage) -> spot_worker::Worker {
    let mut config = spot_worker::WorkerConfig {
        queue: QUEUE.to_owned(),
        ..spot_worker::WorkerConfig::default()
    };
    config.imds.enabled = false; // not an Azure VM
    config.drain.handle_signals = false;
    config.drain.watchdog = false;
    spot_worker::Worker::new(
        config,
        Arc::new(storage.queue(QUEUE).unwrap()),
        Arc::new(storage.poison_queue(QUEUE).unwrap()),
    )
}
