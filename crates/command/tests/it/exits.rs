//! The exit rules with real programs on a real Azurite: a permanent status
//! poisons at once with stderr's tail, others are retried and counted, a
//! kill from outside is a failure; output and results follow the contract.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_command::CommandHandler;
use spot_worker_testkit::worker::{Env, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_65_is_poisoned_at_once_with_the_tail_of_stderr() {
    let env = Env::start().await;
    env.queue.send("not a job", Duration::ZERO).await.unwrap();
    let script = "i=0; while [ $i -lt 300 ]; do echo \"noise line $i\" >&2; i=$((i+1)); done; \
                  echo 'bad input: expected JSON' >&2; exit 65";
    let handler = Observed::new(shell(&env, script));
    let running = Running::start(consumer(&env, 5), handler.clone());
    let record = within("the poison record", poisoned(&env)).await;
    let stats = running.stop().await;

    assert_eq!(stats.retried, 0, "poisoned at once");
    assert_eq!(record.failures, 0, "no retry before it");
    let reason = &record.last_error;
    assert!(reason.contains("exited with status 65"), "{reason}");
    assert!(reason.contains("permanent"), "{reason}");
    assert!(reason.ends_with("bad input: expected JSON"), "{reason}");
    // Only the tail: the first noise lines are gone.
    assert!(!reason.contains("noise line 0\n"), "{reason}");
    assert!(reason.contains("noise line 299"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_1_is_retried_and_poisoned_after_max_failures() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("deliveries");
    env.queue.send("{\"n\":1}", Duration::ZERO).await.unwrap();
    let script = format!(
        "echo \"$SPOT_WORKER_DELIVERY $SPOT_WORKER_FAILURES $(cat)\" >> {}; echo failing >&2; exit 1",
        quoted(&log)
    );
    let handler = Observed::new(shell(&env, &script));
    let running = Running::start(consumer(&env, 3), handler.clone());
    let record = within("the poison record", poisoned(&env)).await;
    let stats = running.stop().await;

    assert_eq!(
        lines(&log),
        ["1 0 {\"n\":1}", "2 1 {\"n\":1}", "3 2 {\"n\":1}"],
        "the body on stdin; deliveries and failures so far in the environment"
    );
    assert_eq!(stats.retried, 2);
    assert_eq!(record.failures, 3);
    assert!(
        record.last_error.contains("exited with status 1")
            && record.last_error.ends_with("failing"),
        "{}",
        record.last_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_killed_from_outside_counts_as_a_failure() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (log, pid_file) = (dir.path().join("failures"), dir.path().join("pid"));
    env.queue.send("job", Duration::ZERO).await.unwrap();
    // The first delivery waits to be killed; the second succeeds.
    let script = format!(
        "echo \"$SPOT_WORKER_FAILURES\" >> {log}; \
         if [ \"$SPOT_WORKER_FAILURES\" = 0 ]; then echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; exec sleep 60; fi",
        log = quoted(&log),
        pid = quoted(&pid_file)
    );
    let handler = Observed::new(shell(&env, &script));
    let running = Running::start(consumer(&env, 5), handler.clone());
    let mut pid = None;
    for _ in 0..1200 {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            pid = text.trim().parse::<i32>().ok();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = pid.expect("the program started");
    // An out-of-memory kill, as far as the runner can tell.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    handler.finished(2).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;

    assert_eq!(lines(&log), ["0", "1"], "the kill was counted");
    assert_eq!((stats.retried, stats.succeeded, stats.poisoned), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_stored_create_only_and_a_different_one_is_permanent() {
    let env = Env::start().await;
    let body = r#"{"job_id":"r1","x":2}"#;
    env.queue.send(body, Duration::ZERO).await.unwrap();
    let handler = results_by_job_key(
        &env,
        "read line; printf '%s' \"result of $line\" > \"$SPOT_WORKER_RESULT\"",
    );
    let running = Running::start(consumer(&env, 5), handler.clone());
    handler.finished(1).await;
    let stored = env.results.get("out/r1.txt").await.unwrap();
    assert_eq!(
        stored.as_deref(),
        Some(format!("result of {body}").as_bytes())
    );

    // The same job again under another message: completed, deleted unrun.
    env.queue.send(body, Duration::ZERO).await.unwrap();
    // Another job whose result name is taken by different bytes.
    env.results
        .put_new("out/r2.txt", b"someone else's")
        .await
        .unwrap();
    env.queue
        .send(r#"{"job_id":"r2"}"#, Duration::ZERO)
        .await
        .unwrap();
    let record = within("the poison record", poisoned(&env)).await;
    let stats = running.stop().await;

    assert_error_has(
        &record,
        "a different result is already stored as out/r2.txt",
    );
    assert_eq!(record.failures, 0, "poisoned at once");
    assert_eq!(stats.skipped_completed, 1, "the duplicate was not run");
    assert_eq!(
        env.results.get("out/r2.txt").await.unwrap().as_deref(),
        Some(&b"someone else's"[..])
    );
}

// Issue 37 item 6: two runs of one job both finish, with different bytes.
// The other run stored its result and completed the job while this one
// ran: this run is a duplicate, settled as done (no failure counted,
// nothing poisoned), and the stored result stays the other run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_job_another_run_completed_is_a_duplicate_not_a_failure() {
    use spot_worker_storage::{Checkpoint, WritePrecondition};

    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (started, go) = (dir.path().join("started"), dir.path().join("go"));
    env.queue
        .send(r#"{"job_id":"r3"}"#, Duration::ZERO)
        .await
        .unwrap();
    // Writes its result, then waits (bounded) until the other run is done.
    let script = format!(
        "printf 'this run' > \"$SPOT_WORKER_RESULT\"; touch {started}; i=0; \
         while [ ! -e {go} ] && [ $i -lt 2400 ]; do sleep 0.025; i=$((i+1)); done",
        started = quoted(&started),
        go = quoted(&go)
    );
    let handler = results_by_job_key(&env, &script);
    let running = Running::start(consumer(&env, 5), handler.clone());
    wait_for_file(&started, "the program started").await;
    // The other run: its result, then the job marked completed.
    env.results
        .put_new("out/r3.txt", b"the other run")
        .await
        .unwrap();
    let precondition = match env.checkpoints.read("r3").await.unwrap() {
        Some(stored) => WritePrecondition::IfMatch(stored.etag),
        None => WritePrecondition::Create,
    };
    let completed = Checkpoint::Completed {
        result: serde_json::json!({ "result": "out/r3.txt" }),
    };
    env.checkpoints
        .write("r3", &completed, precondition, None)
        .await
        .unwrap();
    std::fs::write(&go, b"").unwrap();
    handler.finished(1).await;
    let stats = running.stop_when(|stats| stats.succeeded == 1).await;

    assert_eq!((stats.succeeded, stats.retried, stats.poisoned), (1, 0, 0));
    assert_eq!(
        env.results.get("out/r3.txt").await.unwrap().as_deref(),
        Some(&b"the other run"[..])
    );
    assert!(
        env.poison
            .receive(1, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty(),
        "nothing poisoned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_the_job_key_field_is_permanent() {
    let env = Env::start().await;
    env.queue
        .send(r#"{"id":"x"}"#, Duration::ZERO)
        .await
        .unwrap();
    let handler = spot_worker_command::CommandHandler::new(
        sh("exit 0").with_job_key("job_id"),
        env.results.clone(),
    );
    let record = poisoned_by(&env, 5, handler).await;
    assert_error_has(&record, "field \"job_id\"");
}

/// `sh -c script` for jobs keyed by their `job_id`, its result stored as
/// `out/{job_key}.txt`, observed.
fn results_by_job_key(env: &Env, script: &str) -> Observed<CommandHandler> {
    let config = sh(script)
        .with_job_key("job_id")
        .with_result_name("out/{job_key}.txt");
    Observed::new(CommandHandler::new(config, env.results.clone()))
}
