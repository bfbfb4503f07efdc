//! `spot-worker checkpoints`.

use spot_worker_storage::{Checkpoint, CheckpointStore as _, MessageEncoding, WritePrecondition};

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_listed_shown_and_deleted_but_never_the_workers_records() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = prepared_checkpoints(&storage).await;
    let checkpoints = [
        (
            "job-a",
            Checkpoint::InProgress {
                progress: serde_json::json!({"next": 7}),
            },
        ),
        (
            "job-b",
            Checkpoint::Completed {
                result: serde_json::json!(42),
            },
        ),
        // Where the consumer keeps an attempt record: not a job.
        (
            ".spot-worker/attempts/m1",
            Checkpoint::InProgress {
                progress: serde_json::json!({"failures": 1}),
            },
        ),
    ];
    for (key, checkpoint) in &checkpoints {
        store
            .write(key, checkpoint, WritePrecondition::Create, None)
            .await
            .unwrap();
    }
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    let list = run(cli().args(["checkpoints", "list"])).await;
    list.assert_success();
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", list.stdout);
    assert!(lines[1].starts_with("job-a "), "{}", lines[1]);
    assert!(lines[1].contains("in_progress"), "{}", lines[1]);
    assert!(lines[1].ends_with("{\"next\":7}"), "{}", lines[1]);
    assert!(lines[2].starts_with("job-b "), "{}", lines[2]);
    assert!(lines[2].contains("completed"), "{}", lines[2]);
    assert!(lines[2].contains(" ago "), "{}", lines[2]);
    assert_eq!(lines[3], "2 job checkpoint(s) in container checkpoints");

    let json = run(cli().args(["checkpoints", "list", "--in-progress", "--json"])).await;
    json.assert_success();
    let documents: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(documents.as_array().unwrap().len(), 1, "{documents}");
    assert_eq!(documents[0]["job"], "job-a");
    assert_eq!(documents[0]["status"], "in_progress");
    assert_eq!(documents[0]["progress"]["next"], 7);
    assert!(documents[0]["last_write"].is_string(), "{documents}");

    let show = run(cli().args(["checkpoints", "show", "job-a"])).await;
    show.assert_success();
    show.assert_stdout_has("status:      in_progress");
    show.assert_stdout_has("\"next\": 7");
    let missing = run(cli().args(["checkpoints", "show", "nope"])).await;
    missing.assert_refused("no checkpoint for job \"nope\"");

    let refused = run(cli().args(["checkpoints", "delete", "job-b"])).await;
    refused.assert_refused("refusing without --yes");
    let records =
        run(cli().args(["checkpoints", "delete", ".spot-worker/attempts/m1", "--yes"])).await;
    records.assert_refused("the worker's own records");
    let deleted = run(cli().args(["checkpoints", "delete", "job-b", "--yes"])).await;
    deleted.assert_success();
    assert!(store.read("job-b").await.unwrap().is_none());
    assert!(store.read("job-a").await.unwrap().is_some());
    assert!(
        store
            .read(".spot-worker/attempts/m1")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_decodes_a_checkpoint_file_saved_by_the_runner() {
    let azurite = start_azurite();
    let storage = storage(&azurite);
    let store = prepared_checkpoints(&storage).await;
    // As `spot-worker run` saves a program's checkpoint file.
    let binary: Vec<u8> = vec![0xff, 0xfe, 0x00, 0x41];
    for (job, bytes) in [
        ("text-job", &b"cursor=42\nphase=sieve\n"[..]),
        ("binary-job", &binary),
    ] {
        let checkpoint = Checkpoint::InProgress {
            progress: spot_worker_command::to_progress(bytes),
        };
        store
            .write(job, &checkpoint, WritePrecondition::Create, None)
            .await
            .unwrap();
    }
    let cli = || spot_worker(&azurite, MessageEncoding::Text);

    let text = run(cli().args(["checkpoints", "show", "text-job"])).await;
    text.assert_success();
    assert!(
        text.stdout.ends_with(
            "progress:\ncheckpoint file of 22 byte(s) saved by `spot-worker run`, as text:\n\
             cursor=42\nphase=sieve\n\n"
        ),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("file_base64"), "{}", text.stdout);

    let bytes = run(cli().args(["checkpoints", "show", "binary-job"])).await;
    bytes.assert_success();
    bytes.assert_stdout_has(
        "checkpoint file of 4 byte(s) saved by `spot-worker run`, not UTF-8 text; in hex:\n\
             00000000  ff fe 00 41\n",
    );
}
