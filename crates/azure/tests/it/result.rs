//! BlobResultStore and every store's `prepare` against a real Azurite: the
//! contract every result store meets (create, identical re-put, conflicting
//! put, missing name), racing creates, containers and queues created by
//! `prepare`, probes cleaned up, and a clear, redacted error while storage
//! is down.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, MessageQueue, PutOutcome, ResultStore, StorageError,
    WritePrecondition,
};
use spot_worker_testkit::contract;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blob_result_store_meets_the_contract() {
    let (_azurite, storage) = azurite_and_storage();
    let container = unique("results");
    let results = storage.result_store(&container).unwrap();
    assert_eq!(results.name(), container);
    // Another worker's client of the same container.
    let racer = storage.result_store(&container).unwrap();
    contract::result_store(&results, &racer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creates_of_one_result_leave_exactly_one() {
    let (_azurite, storage) = azurite_and_storage();
    let results = storage.result_store(&unique("results")).unwrap();
    results.prepare().await.unwrap();
    // Eight writers with two different bodies race for one name: one body
    // wins, every writer of that body succeeds, every other one conflicts.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let results = results.clone();
            tokio::spawn(async move {
                let body = if i % 2 == 0 { "even" } else { "odd" };
                (body, results.put_new("race.json", body.as_bytes()).await)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let stored = results.get("race.json").await.unwrap().unwrap();
    let winner = String::from_utf8(stored).unwrap();
    let created = outcomes
        .iter()
        .filter(|(_, r)| *r == Ok(PutOutcome::Created))
        .count();
    assert_eq!(created, 1, "{outcomes:?}");
    for (body, outcome) in &outcomes {
        if *body == winner {
            assert!(outcome.is_ok(), "{outcomes:?}");
        } else {
            assert!(
                matches!(outcome, Err(StorageError::Conflict { .. })),
                "{outcomes:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_creates_missing_queues_and_containers_and_leaves_no_probe() {
    let (azurite, storage) = azurite_and_storage();
    let queue = storage.queue(&unique("jobs")).unwrap();
    // Missing at first: a receive fails.
    assert!(matches!(
        queue.receive(1, Duration::from_secs(1)).await,
        Err(StorageError::NotFound { .. })
    ));
    queue.prepare().await.unwrap();
    queue.prepare().await.unwrap();
    assert!(
        queue
            .receive(1, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty(),
        "prepare put nothing into the queue"
    );
    assert_eq!(queue.approximate_message_count().await.unwrap(), 0);

    let ckpt_container = unique("ckpt");
    let checkpoints = storage.checkpoint_store(&ckpt_container).unwrap();
    checkpoints.prepare().await.unwrap();
    checkpoints.prepare().await.unwrap();
    checkpoints
        .write(
            "job",
            &Checkpoint::InProgress {
                progress: serde_json::json!(1),
            },
            WritePrecondition::Create,
            None,
        )
        .await
        .unwrap();
    assert_eq!(list_blob_names(&azurite, &ckpt_container).await, ["job"]);

    let container = unique("results");
    let results = storage.result_store(&container).unwrap();
    results.prepare().await.unwrap();
    results.prepare().await.unwrap();
    results.put_new("only.json", b"1").await.unwrap();
    // Every probe blob was deleted again: only what jobs wrote is left.
    assert_eq!(list_blob_names(&azurite, &container).await, ["only.json"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_fails_clearly_and_without_secrets_while_storage_is_down() {
    let mut azurite = start_azurite();
    let storage = storage(&azurite);
    let queue = storage.queue(&unique("jobs")).unwrap();
    let checkpoints = storage.checkpoint_store(&unique("ckpt")).unwrap();
    let results = storage.result_store(&unique("results")).unwrap();
    tokio::task::block_in_place(|| azurite.stop()).unwrap();

    let errors = [
        queue.prepare().await.unwrap_err(),
        checkpoints.prepare().await.unwrap_err(),
        results.prepare().await.unwrap_err(),
        results.put_new("a.json", b"1").await.unwrap_err(),
        results.get("a.json").await.unwrap_err(),
    ];
    for error in errors {
        assert!(error.is_transient(), "{error:?}");
        let text = format!("{error} {error:?}");
        assert!(!text.contains(spot_worker_testkit::ACCOUNT_KEY), "{text}");
        let lower = text.to_ascii_lowercase();
        for (at, _) in lower.match_indices("sig=") {
            assert!(text[at + 4..].starts_with("REDACTED"), "{text}");
        }
    }

    // Storage is back: prepare succeeds and creates what is missing.
    tokio::task::block_in_place(|| azurite.start_again()).unwrap();
    queue.prepare().await.unwrap();
    checkpoints.prepare().await.unwrap();
    results.prepare().await.unwrap();
}

/// Lists the names of the blobs in `container` with a List Blobs request
/// made directly (account SAS, plain HTTP), so the check does not go through
/// the code under test.
async fn list_blob_names(azurite: &spot_worker_testkit::Azurite, container: &str) -> Vec<String> {
    use azure_core::credentials::Secret;
    use azure_core::http::{Method, Request, Url, new_http_client};
    use spot_worker_testkit::{ACCOUNT_KEY, ACCOUNT_NAME};

    let expiry = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let scope = spot_worker_azure::AccountSasScope::OPERATOR.allowing_http();
    let sas = spot_worker_azure::sign_account_sas(
        ACCOUNT_NAME,
        &Secret::new(ACCOUNT_KEY),
        &scope,
        expiry,
    )
    .unwrap();
    let url = format!(
        "{}/{container}?restype=container&comp=list&{}",
        azurite.blob_endpoint(),
        sas.secret()
    );
    let mut request = Request::new(Url::parse(&url).unwrap(), Method::Get);
    request.insert_header("x-ms-version", "2021-08-06");
    let response = new_http_client(None)
        .execute_request(&request)
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let xml = response.into_body().collect_string().await.unwrap();
    xml.split("<Name>")
        .skip(1)
        .filter_map(|rest| rest.split("</Name>").next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_bigger_than_a_block_is_streamed_create_only() {
    use std::io::Write as _;
    let (_azurite, storage) = azurite_and_storage();
    let results = storage.result_store(&unique("results")).unwrap();
    results.prepare().await.unwrap();
    // Two and a half blocks.
    let bytes = contract::pseudo_random(10 * 1024 * 1024 + 12345, 9);
    let file_of = |bytes: &[u8]| {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file
    };
    let len = bytes.len() as u64;
    assert_eq!(
        results
            .put_new_file("big.bin", file_of(&bytes), len)
            .await
            .unwrap(),
        spot_worker_storage::PutOutcome::Created
    );
    assert_eq!(
        results.get("big.bin").await.unwrap().as_deref(),
        Some(&bytes[..])
    );
    // The same bytes again: compared range by range, nothing written.
    assert_eq!(
        results
            .put_new_file("big.bin", file_of(&bytes), len)
            .await
            .unwrap(),
        spot_worker_storage::PutOutcome::AlreadyExistsIdentical
    );
    // One byte different, in the last block: a conflict, the first kept.
    let mut other = bytes.clone();
    *other.last_mut().unwrap() ^= 1;
    let error = results
        .put_new_file("big.bin", file_of(&other), len)
        .await
        .unwrap_err();
    assert!(
        matches!(error, spot_worker_storage::StorageError::Conflict { .. }),
        "{error:?}"
    );
    assert_eq!(
        results.get("big.bin").await.unwrap().as_deref(),
        Some(&bytes[..])
    );
}

/// Two writers of one large result, started together, `rounds` times
/// against fresh names: the stored result is always exactly one writer's
/// bytes (never a mixture of their blocks), exactly one writer is told
/// `Created`, and the other settles as the contract says: the same bytes
/// are `AlreadyExistsIdentical`, other bytes `Conflict`.
async fn race_two_large_writers(identical: bool) {
    use std::io::Write as _;
    let (_azurite, storage) = azurite_and_storage();
    let results = storage.result_store(&unique("results")).unwrap();
    results.prepare().await.unwrap();
    // Six blocks each, differing in every block.
    let len = 24 * 1024 * 1024;
    let first = contract::pseudo_random(len, 1);
    let second = if identical {
        first.clone()
    } else {
        contract::pseudo_random(len, 2)
    };
    let file_of = |bytes: &[u8]| {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file
    };
    for round in 0..3 {
        let name = format!("race-{round}.bin");
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let writers: Vec<_> = [&first, &second]
            .into_iter()
            .map(|bytes| {
                let (results, name, start) = (results.clone(), name.clone(), start.clone());
                let file = file_of(bytes);
                tokio::spawn(async move {
                    start.wait().await;
                    results.put_new_file(&name, file, len as u64).await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for writer in writers {
            outcomes.push(writer.await.unwrap());
        }
        let stored = results.get(&name).await.unwrap().unwrap();
        assert!(
            stored == first || stored == second,
            "round {round}: the stored result is a mixture of both writers ({outcomes:?})"
        );
        let created: Vec<_> = (0..2)
            .filter(|&i| outcomes[i] == Ok(PutOutcome::Created))
            .collect();
        assert_eq!(created.len(), 1, "round {round}: {outcomes:?}");
        let winner = created[0];
        assert!(
            stored == *[&first, &second][winner],
            "round {round}: the writer told Created is not the one stored ({outcomes:?})"
        );
        let loser = &outcomes[1 - winner];
        if identical {
            assert_eq!(
                *loser,
                Ok(PutOutcome::AlreadyExistsIdentical),
                "round {round}: {outcomes:?}"
            );
        } else {
            assert!(
                matches!(loser, Err(StorageError::Conflict { .. })),
                "round {round}: {outcomes:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_of_different_large_results_never_store_a_mixture() {
    race_two_large_writers(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_of_the_same_large_result_both_settle() {
    race_two_large_writers(true).await;
}
