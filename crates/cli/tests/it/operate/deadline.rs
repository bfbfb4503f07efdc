//! `spot-worker enqueue --deadline WHEN --work DURATION`: each job carries
//! its deadline in an envelope around the body exactly as written, and
//! goes to the Spot lane, or to the regular lane when it has no slack.

use std::time::{Duration, SystemTime};

use spot_worker_decisions::lanes::Lane;
use spot_worker_lanes::Envelope;
use spot_worker_storage::MessageEncoding;

use super::common::*;

const REGULAR: &str = "jobs-regular";

/// `enqueue` with lanes: the regular lane's queue deployed and named.
async fn with_lanes(
    azurite: &spot_worker_testkit::Azurite,
    encoding: MessageEncoding,
) -> tokio::process::Command {
    storage(azurite)
        .queue(REGULAR)
        .unwrap()
        .create_if_missing()
        .await
        .unwrap();
    let mut command = spot_worker(azurite, encoding);
    command.env("SPOT_WORKER_REGULAR_QUEUE", REGULAR);
    command
}

/// The envelope and body of every message in `queue`, decoded.
async fn opened(
    storage: &spot_worker_azure::AzureStorage,
    queue: &str,
    encoding: MessageEncoding,
) -> Vec<(Envelope, Vec<u8>)> {
    peek_texts(storage, queue)
        .await
        .into_iter()
        .map(|text| {
            let bytes = encoding.decode(&text).unwrap();
            let (envelope, body) = Envelope::unwrap(&bytes).unwrap();
            (envelope.expect("an envelope"), body.to_vec())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_with_a_deadline_go_to_the_lane_the_rule_picks_their_bodies_unchanged() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let lines = "{\"job_id\":\"a\"}\n{\"job_id\":\"b\",\"text\":\"h\u{e9}llo <&>\"}\n";
    let (_dir, path) = input_file(lines);

    // 48 h of work due in 52 h: slack for the Spot lane.
    let output = run(with_lanes(&azurite, MessageEncoding::Text)
        .await
        .args(["enqueue", "--deadline", "52h", "--work", "48h"])
        .arg(&path))
    .await;
    output.assert_success();
    output.assert_stdout_has("2 to queue jobs (the Spot lane), 0 to queue jobs-regular");
    let sent = opened(&storage, QUEUE, MessageEncoding::Text).await;
    let bodies: Vec<&[u8]> = sent.iter().map(|(_, body)| body.as_slice()).collect();
    assert_eq!(
        bodies,
        [
            b"{\"job_id\":\"a\"}".as_slice(),
            "{\"job_id\":\"b\",\"text\":\"h\u{e9}llo <&>\"}".as_bytes()
        ]
    );
    let now = SystemTime::now();
    for (envelope, _) in &sent {
        let deadline = envelope.deadline;
        assert_eq!(deadline.work, Duration::from_secs(48 * 3600));
        let horizon = deadline.due.duration_since(deadline.start).unwrap();
        assert_eq!(horizon.as_secs() / 60, 52 * 60, "{deadline:?}");
        assert!(deadline.start <= now);
        assert_eq!((envelope.generation, envelope.lane), (0, Some(Lane::Spot)));
    }
    assert!(peek_texts(&storage, REGULAR).await.is_empty());

    // 48 h of work due in 48 h 5 min: less slack than two switches (6 min
    // each, the default seed): straight to the regular lane.
    let output = run(with_lanes(&azurite, MessageEncoding::Base64)
        .await
        .args(["enqueue", "--raw", "--deadline", "2885m", "--work", "48h"])
        .arg(&path))
    .await;
    output.assert_success();
    output.assert_stdout_has("to queue jobs-regular (base64)");
    output.assert_stdout_has("the regular lane, due ");
    let tight = opened(&storage, REGULAR, MessageEncoding::Base64).await;
    assert_eq!(tight.len(), 1);
    assert_eq!(
        tight[0].1,
        lines.as_bytes(),
        "--raw: the whole input, byte for byte"
    );
    assert_eq!(tight[0].0.lane, Some(Lane::Regular));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_needs_the_regular_lane_work_and_a_future() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let (_dir, path) = input_file("{\"job_id\":\"a\"}\n");
    // (extra arguments, with lanes, what the error says)
    let rows: [(&[&str], bool, &str); 4] = [
        (
            &["--deadline", "52h", "--work", "48h"],
            false,
            "set SPOT_WORKER_REGULAR_QUEUE",
        ),
        (&["--deadline", "52h"], true, "--work"),
        (
            &["--deadline", "2020-01-01T00:00:00Z", "--work", "1h"],
            true,
            "has passed already",
        ),
        (
            &["--deadline", "next week", "--work", "1h"],
            true,
            "neither a time",
        ),
    ];
    for (args, lanes, says) in rows {
        let mut command = if lanes {
            with_lanes(&azurite, MessageEncoding::Text).await
        } else {
            spot_worker(&azurite, MessageEncoding::Text)
        };
        let output = run(command.arg("enqueue").args(args).arg(&path)).await;
        assert_ne!(output.code, Some(0), "{args:?}");
        assert!(output.stderr.contains(says), "{args:?}: {}", output.stderr);
    }
    assert!(peek_texts(&storage, QUEUE).await.is_empty(), "nothing sent");
}

/// Half of a deadline is named alone, before any storage is needed: not
/// as a clap usage line that lists the settings the environment gave
/// (`--imds-endpoint <IMDS_ENDPOINT>` after `spot-worker dev env`) as if
/// they were required.
#[tokio::test]
async fn half_a_deadline_is_an_error_naming_the_other_half_only() {
    let (_dir, path) = input_file("{\"job_id\":\"a\"}\n");
    let rows: [(&[&str], &str); 2] = [
        (&["--deadline", "52h"], "--deadline needs --work"),
        (&["--work", "48h"], "--work goes with --deadline"),
    ];
    for (args, says) in rows {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_spot-worker"));
        command
            .env_clear()
            .env("SPOT_WORKER_IMDS_ENDPOINT", "http://127.0.0.1:9")
            .arg("enqueue")
            .args(args)
            .arg(&path);
        let output = run(&mut command).await;
        assert_eq!(output.code, Some(1), "{args:?}: {}", output.stderr);
        let lines: Vec<&str> = output.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {}", output.stderr);
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(says),
            "{}",
            lines[0]
        );
        assert!(
            !output.stderr.contains("imds-endpoint"),
            "{}",
            output.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_regular_lane_the_jobs_at_risk_and_the_hours_by_lane() {
    use spot_worker_consumer::{CompletionRecord, DeadlineOutcome};
    use spot_worker_decisions::goodput::Ledger;
    use spot_worker_storage::{Checkpoint, CheckpointStore as _, WritePrecondition};

    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    // Enqueued as the workers key them: each envelope carries its key.
    for (job, deadline) in [("roomy", "52h"), ("tight", "2885m")] {
        let (_dir, path) = input_file(&format!("{{\"job_id\":\"{job}\"}}\n"));
        run(with_lanes(&azurite, MessageEncoding::Text)
            .await
            .env("SPOT_WORKER_JOB_KEY", "job_id")
            .args(["enqueue", "--deadline", deadline, "--work", "48h"])
            .arg(&path))
        .await
        .assert_success();
    }
    // A finished job's completion record, as a worker leaves it: 3 h on
    // Spot, 1 h on regular capacity, its deadline met.
    let checkpoints = prepared_checkpoints(&storage).await;
    let record = CompletionRecord {
        job: "done".into(),
        message_id: "m".into(),
        finished_at: "2026-11-27T00:00:00Z".into(),
        goodput: Ledger {
            useful_ms: 4 * 3_600_000,
            regular_ms: 3_600_000,
            deliveries: 3,
            ..Ledger::default()
        },
        deadline: Some(DeadlineOutcome {
            start: time::OffsetDateTime::UNIX_EPOCH,
            due: time::OffsetDateTime::UNIX_EPOCH,
            work_s: 14_400.0,
            met: true,
            lane: Lane::Regular,
            moves: 1,
        }),
        progress: Some(1.0),
    };
    let result = serde_json::to_value(&record).unwrap();
    checkpoints
        .write(
            &CompletionRecord::key("done"),
            &Checkpoint::Completed { result },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();

    let output = run(with_lanes(&azurite, MessageEncoding::Text)
        .await
        .env("SPOT_WORKER_JOB_KEY", "job_id")
        .env("SPOT_WORKER_PRICE_PER_HOUR", "0.02")
        .env("SPOT_WORKER_REGULAR_PRICE_PER_HOUR", "0.06")
        .env("SPOT_WORKER_CONCURRENCY", "1")
        .arg("status"))
    .await;
    output.assert_success();
    let text = &output.stdout;
    for expected in [
        "regular jobs-regular",
        "lanes   d 360 s per switch",
        "2 job(s) with a deadline not finished: 1 at risk, 0 late",
        "by lane: Spot 3.00 h ($0.0600), regular 1.00 h ($0.0600); deadlines 1 met, 0 missed",
    ] {
        assert!(text.contains(expected), "{expected:?} in:\n{text}");
    }
    let tight = text
        .lines()
        .find(|line| line.contains("AT RISK"))
        .expect("an at-risk line");
    assert!(
        tight.starts_with("  tight") && tight.contains("regular waiting"),
        "{tight}"
    );

    // Without the setting, status still names the waiting jobs by their
    // keys: their envelopes carry them.
    let json = run(with_lanes(&azurite, MessageEncoding::Text)
        .await
        .args(["status", "--json"]))
    .await;
    json.assert_success();
    let status: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let mut named: Vec<&str> = status["lanes"]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|job| job["job"].as_str())
        .collect();
    named.sort_unstable();
    assert_eq!(named, ["roomy", "tight"], "{status}");
    assert_eq!(status["lanes"]["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(status["lanes"]["at_risk"], 1);
    assert_eq!(status["regular"]["approximate_depth"], 1);
    assert_eq!(status["lane_accounting"]["deadlines_met"], 1);
}

/// A job moved to the regular lane and waiting there, that its program
/// said was 37.5 % done at its last save: `status` shows it by its job
/// key, in the regular lane, waiting, 37.5 % done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_moved_job_waiting_in_its_lane_with_its_reported_progress() {
    use spot_worker_decisions::goodput::{Ledger, stamp_with_progress};
    use spot_worker_decisions::lanes::Deadline;
    use spot_worker_lanes::{LaneRecord, LaneRecords};
    use spot_worker_storage::{
        Checkpoint, CheckpointStore as _, MessageQueue as _, WritePrecondition,
    };

    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let now = SystemTime::now();
    let deadline = Deadline {
        start: now - Duration::from_secs(3600),
        due: now + Duration::from_secs(10 * 3600),
        work: Duration::from_secs(4 * 3600),
    };
    let checkpoints = prepared_checkpoints(&storage).await;
    // Its last save: 37.5 % done by the program's progress file, 10 s of
    // useful time (what a status reading the ledger would show: 0.1 %).
    let ledger = Ledger {
        useful_ms: 10_000,
        deliveries: 1,
        ..Ledger::default()
    };
    checkpoints
        .write(
            "half",
            &Checkpoint::InProgress {
                progress: serde_json::json!({"trial": 6}),
            },
            WritePrecondition::Create,
            Some(&stamp_with_progress("v1", &ledger, Some(0.375))),
        )
        .await
        .unwrap();
    // Its lane record as the Spot worker that released it left it: the
    // live message m-old in the Spot lane, moving to the regular lane.
    let record = LaneRecord {
        generation: 0,
        message: "m-old".into(),
        moved_from: None,
        origin: "m-old".into(),
        finished: false,
        poisoned: false,
        held: 1,
        lane: Lane::Spot,
        moving: Some(Lane::Regular),
        start: time::OffsetDateTime::from(deadline.start),
        deadline: time::OffsetDateTime::from(deadline.due),
        work_s: deadline.work.as_secs_f64(),
        updated_at: time::OffsetDateTime::now_utc(),
    };
    checkpoints
        .write(
            &LaneRecords::key("half"),
            &Checkpoint::InProgress {
                progress: serde_json::to_value(&record).unwrap(),
            },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    // The message the move sent, waiting in the regular lane's queue.
    let moved = Envelope {
        generation: 1,
        key: Some("half".into()),
        lane: Some(Lane::Regular),
        moved_from: Some("m-old".into()),
        ..Envelope::new(deadline)
    };
    let regular = storage.queue(REGULAR).unwrap();
    regular.create_if_missing().await.unwrap();
    let text = MessageEncoding::Text
        .encode(&moved.wrap(b"{\"study\":\"s1\"}"))
        .unwrap();
    regular.send(&text, Duration::ZERO).await.unwrap();

    let output = run(with_lanes(&azurite, MessageEncoding::Text)
        .await
        .arg("status"))
    .await;
    output.assert_success();
    let text = &output.stdout;
    assert!(
        text.contains("1 job(s) with a deadline not finished"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|line| line.starts_with("  half ") && line.contains("% done"))
        .unwrap_or_else(|| panic!("a line for the job key half in:\n{text}"));
    assert!(line.contains("regular waiting"), "{line}");
    assert!(line.contains(" 37.5 % done"), "{line}");
}
