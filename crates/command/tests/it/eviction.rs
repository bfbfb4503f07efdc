//! Evictions with real programs, a real Azurite and the IMDS emulator: the
//! Python primes job resumes on a second worker from its checkpoint file
//! with primes' result, and a program that ignores SIGTERM is killed before
//! the release time with its last checkpoint file saved. Neither counts as
//! a failure.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler, from_progress};
use spot_worker_imds_emulator::EventSpec;
use spot_worker_primes::PrimesJob;
use spot_worker_runtime::DrainTrigger;
use spot_worker_testkit::worker::{Env, VM_A, VM_B, within};
use spot_worker_testkit::workspace_root;

/// The stored checkpoint file of `key`, if any.
async fn saved_file(env: &Env, key: &str) -> Option<Vec<u8>> {
    let stored = env.checkpoints.read(key).await.unwrap()?;
    match stored.checkpoint {
        spot_worker_storage::Checkpoint::InProgress { progress } => {
            Some(from_progress(&progress).unwrap())
        }
        spot_worker_storage::Checkpoint::Completed { .. } => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_job_evicted_mid_way_resumes_elsewhere_and_equals_primes() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    // Big enough that the Python sieve (about 10^9 numbers a second on an
    // idle machine) is still counting when the eviction comes.
    let job = PrimesJob::new("p1", 0, 1_000_000_000).unwrap();
    env.enqueue(&job).await;
    // Records what each run starts from, then is the example itself.
    let script = format!(
        "echo \"$SPOT_WORKER_FAILURES $(cat \"$SPOT_WORKER_CHECKPOINT\" 2>/dev/null || echo none)\" >> {starts}; \
         exec python3 {program} --save-every 0.02",
        starts = quoted(&starts),
        program = quoted(&workspace_root().join("examples/command/primes.py")),
    );
    let config = CommandConfig::new("sh", ["-c", script.as_str()])
        .with_job_key("job_id")
        .with_result_name("{job_key}.json")
        .with_checkpoint_every(Duration::from_millis(100));
    let handler = CommandHandler::new(config, env.results.clone());

    // Worker A is evicted once the job has saved some progress.
    let a = env.worker(env.config(VM_A));
    let running = tokio::spawn(a.run(handler.clone()));
    let mut progressed = false;
    for _ in 0..6000 {
        if saved_file(&env, "p1").await.is_some() {
            progressed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(progressed, "the job saved progress");
    env.emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    let report = within("worker A to drain", running).await.unwrap().unwrap();
    assert!(matches!(report.drain.trigger, DrainTrigger::Event(_)));
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        !report.drain.released_running_handlers,
        "it stopped on SIGTERM"
    );
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    let stopped_at = saved_file(&env, "p1").await.expect("progress saved");
    let cursor = serde_json::from_slice::<serde_json::Value>(&stopped_at).unwrap()["cursor"]
        .as_u64()
        .unwrap();
    assert!(
        (1..job.end).contains(&cursor),
        "evicted mid-way, at {cursor}"
    );

    // Worker B, another VM, resumes from the checkpoint file.
    let b = env.worker(env.config(VM_B));
    let stop = b.shutdown_token();
    let running = tokio::spawn(b.run(handler));
    let result = within("the result", env.result("p1")).await;
    stop.cancel();
    within("worker B to stop", running).await.unwrap().unwrap();

    assert_eq!(result, spot_worker_primes::expected_result(&job));
    let bytes = env.results.get("p1.json").await.unwrap().unwrap();
    let expected = format!(
        r#"{{"job_id":"p1","start":0,"end":1000000000,"primes":{}}}"#,
        result["primes"]
    );
    assert_eq!(String::from_utf8(bytes).unwrap(), expected, "primes' bytes");
    assert_eq!(
        lines(&starts),
        [
            "0 none".to_owned(),
            format!("0 {}", String::from_utf8(stopped_at).unwrap())
        ],
        "B started from A's saved file, and the eviction was not a failure"
    );
    env.assert_queues_empty().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_ignoring_sigterm_is_killed_before_the_release_and_its_file_saved() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (log, notice) = (dir.path().join("written"), dir.path().join("notice"));
    env.queue.send("stubborn", Duration::ZERO).await.unwrap();
    let script = format!(
        "trap '' TERM; i=0; while :; do i=$((i+1)); \
         echo $i > \"$SPOT_WORKER_CHECKPOINT.tmp\"; mv \"$SPOT_WORKER_CHECKPOINT.tmp\" \"$SPOT_WORKER_CHECKPOINT\"; \
         echo $i >> {log}; \
         if [ -f \"$SPOT_WORKER_NOTICE\" ] && [ ! -f {notice} ]; then \
         cp \"$SPOT_WORKER_NOTICE\" {notice}.tmp && mv {notice}.tmp {notice}; fi; \
         sleep 0.05; done",
        log = quoted(&log),
        notice = quoted(&notice),
    );
    // Saved only when the program ends: what is stored is its last file.
    let handler = Observed::new(CommandHandler::new(
        CommandConfig::new("sh", ["-c", script.as_str()])
            .with_checkpoint_every(Duration::from_secs(600)),
        env.results.clone(),
    ));
    let mut config = env.config(VM_A);
    config.drain.drain_budget = Duration::from_secs(4);
    config.drain.release_margin = Duration::from_secs(2);
    let worker = env.worker(config);
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler.clone()));
    for _ in 0..1200 {
        if lines(&log).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.cancel();
    let report = within("the drain", running).await.unwrap().unwrap();

    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        !report.drain.released_running_handlers,
        "killed and saved before the release time"
    );
    let took = report.drain.notice_to_drained;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(2),
        "SIGKILL a second before the release time (2 s): {took:?}"
    );
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    let written: Vec<u64> = lines(&log).iter().map(|l| l.parse().unwrap()).collect();
    let last = *written.last().unwrap();
    let message_id = {
        let again = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
        assert_eq!(again.len(), 1, "the message is back on the queue");
        assert_eq!(again[0].body, "stubborn");
        again[0].id.to_string()
    };
    let stored = saved_file(&env, &message_id)
        .await
        .expect("the last file saved");
    let stored: u64 = String::from_utf8(stored).unwrap().trim().parse().unwrap();
    assert!(
        stored == last || stored == last + 1,
        "saved {stored}, the program's last write was {last} (or the one after)"
    );
    let notice = std::fs::read_to_string(&notice).expect("the program saw the notice file");
    assert!(notice.starts_with("SPOT_WORKER_DEADLINE=20"), "{notice}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_seen_already_started_still_saves_the_checkpoint_file() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (written, notice) = (dir.path().join("written"), dir.path().join("notice"));
    env.queue.send("segments", Duration::ZERO).await.unwrap();
    // Like the ffmpeg wrapper: the next segment's index in the file, then
    // a long encode that ignores SIGTERM.
    let script = format!(
        "trap '' TERM; echo 7 > \"$SPOT_WORKER_CHECKPOINT.tmp\"; \
         mv \"$SPOT_WORKER_CHECKPOINT.tmp\" \"$SPOT_WORKER_CHECKPOINT\"; touch {written}; \
         while [ ! -f \"$SPOT_WORKER_NOTICE\" ]; do sleep 0.02; done; \
         cp \"$SPOT_WORKER_NOTICE\" {notice}.tmp && mv {notice}.tmp {notice}; \
         while :; do sleep 0.05; done",
        written = quoted(&written),
        notice = quoted(&notice),
    );
    // Never saved while it runs: only the final save can keep the file.
    let handler = CommandHandler::new(
        CommandConfig::new("sh", ["-c", script.as_str()])
            .with_checkpoint_every(Duration::from_secs(600)),
        env.results.clone(),
    );
    let mut config = env.config(VM_A);
    config.drain.watchdog = true;
    config.drain.release_floor = Duration::from_secs(2);
    let worker = env.worker(config);
    let running = tokio::spawn(worker.run(handler));
    wait_for_file(&written, "the program wrote its checkpoint file").await;

    // Seen only once it has started (after an IMDS outage, a host failure).
    env.emulator
        .schedule(EventSpec::preempt().started())
        .unwrap();
    let report = within("the drain", running).await.unwrap().unwrap();

    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        !report.drain.released_running_handlers,
        "killed and saved before the release"
    );
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    assert!(
        report.drain.notice_to_drained < Duration::from_secs(2),
        "released within the floor: {:?}",
        report.drain.notice_to_drained
    );
    let again = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1, "the message is back on the queue");
    let stored = saved_file(&env, again[0].id.as_str())
        .await
        .expect("the checkpoint file was saved");
    assert_eq!(stored, b"7\n");
    // The notice file told the real release time, not the 10 s used when
    // the worker gives none.
    let notice = std::fs::read_to_string(&notice).expect("the program saw the notice file");
    let deadline = notice
        .trim()
        .strip_prefix("SPOT_WORKER_DEADLINE=")
        .unwrap_or_else(|| panic!("{notice}"));
    let deadline =
        time::OffsetDateTime::parse(deadline, &time::format_description::well_known::Rfc3339)
            .unwrap();
    let drained = time::OffsetDateTime::now_utc();
    assert!(
        deadline < drained + time::Duration::seconds(2),
        "the deadline is the release time, within the 2 s floor of the notice: {notice}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_checkpoint_file_over_the_limit_at_the_final_save_of_a_drain_is_reported() {
    // One thread: the log of every task of this test is captured.
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let env = Env::start().await;
    env.queue
        .send(r#"{"job_id":"big"}"#, Duration::ZERO)
        .await
        .unwrap();
    // A small file first, then on SIGTERM one over the limit.
    let script = "trap 'head -c 2048 /dev/zero > \"$SPOT_WORKER_CHECKPOINT\"; exit 143' TERM; \
                  echo 1 > \"$SPOT_WORKER_CHECKPOINT\"; while :; do sleep 0.05; done";
    let handler = CommandHandler::new(
        CommandConfig::new("sh", ["-c", script])
            .with_job_key("job_id")
            .with_checkpoint_max_bytes(1024),
        env.results.clone(),
    );
    let worker = env.worker(env.config(VM_A));
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    let first_save = async {
        while saved_file(&env, "big").await.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within("the first save", first_save).await;
    stop.cancel();
    let report = within("the drain", running).await.unwrap().unwrap();

    assert_eq!(
        (report.stats.released, report.stats.retried),
        (1, 0),
        "a drain is never a counted failure"
    );
    assert_eq!(
        saved_file(&env, "big").await.as_deref(),
        Some(&b"1\n"[..]),
        "the last save within the limit is kept"
    );
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|line| line.contains("the last checkpoint was not saved")
                && line.contains("the checkpoint is 2048 bytes, over the limit of 1024 bytes")),
        "the over-limit file is reported:\n{lines:#?}"
    );
}
