//! No key material or token over plain http, and an account SAS scoped to
//! what the worker does: endpoints that would carry a SAS or bearer token
//! in clear are refused before any request (loopback emulators excepted),
//! and against a real Azurite the worker's SAS does all the worker does but
//! cannot list, and an https-only SAS is not accepted over http.

use crate::common;

use std::time::Duration;

use azure_core::credentials::Secret;
use azure_core::http::{Method, Request, StatusCode, Url, new_http_client};
use common::*;
use spot_worker_azure::{
    AccountEndpoints, AccountSasScope, AzureStorage, ConnectionString, ConnectionStringError,
    Credentials, StorageConfig, StorageConfigError, sign_account_sas,
};
use spot_worker_storage::{CheckpointStore, MessageQueue, ResultStore};
use spot_worker_testkit::{ACCOUNT_KEY, ACCOUNT_NAME};

#[test]
fn plain_http_is_refused_except_to_loopback() {
    let key = "AccountKey=a2V5";
    for refused in [
        format!("DefaultEndpointsProtocol=http;AccountName=acct;{key}"),
        format!(
            "AccountName=acct;{key};BlobEndpoint=http://10.1.2.3/acct;QueueEndpoint=https://acct.queue.core.windows.net"
        ),
        format!(
            "AccountName=acct;{key};BlobEndpoint=https://acct.blob.core.windows.net;QueueEndpoint=http://storage.example.com/acct"
        ),
        "SharedAccessSignature=sv=1&sig=c2VjcmV0;BlobEndpoint=http://acct.blob.core.windows.net;QueueEndpoint=http://acct.queue.core.windows.net".to_owned(),
    ] {
        let err = refused.parse::<ConnectionString>().unwrap_err();
        assert!(
            matches!(err, ConnectionStringError::InvalidEndpoint { .. }),
            "{refused}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("must be https") && text.contains("loopback"),
            "{text}"
        );
        assert!(!text.contains("c2VjcmV0") && !text.contains("a2V5"), "{text}");
    }
    for allowed in [
        "http://127.0.0.1:10000/devstoreaccount1",
        "http://127.9.8.7:10000/devstoreaccount1",
        "http://localhost:10000/devstoreaccount1",
        "http://[::1]:10000/devstoreaccount1",
    ] {
        let text = format!("AccountName=a;{key};BlobEndpoint={allowed};QueueEndpoint={allowed}");
        assert!(text.parse::<ConnectionString>().is_ok(), "{allowed}");
    }
}

#[test]
fn bearer_tokens_never_go_over_plain_http_either() {
    let err = AccountEndpoints::new(
        "http://acct.blob.core.windows.net",
        "https://acct.queue.core.windows.net",
    )
    .unwrap_err();
    assert!(
        matches!(err, StorageConfigError::InvalidUrl { .. })
            && err.to_string().contains("must be https"),
        "{err}"
    );
    // Hand-built endpoints (public fields) are checked when a client is made.
    let endpoints = AccountEndpoints {
        blob: Url::parse("https://acct.blob.core.windows.net").unwrap(),
        queue: Url::parse("http://acct.queue.core.windows.net").unwrap(),
    };
    let credentials = Credentials::managed_identity(
        endpoints,
        Some("00000000-0000-0000-0000-000000000001".to_owned()),
    )
    .unwrap();
    let storage = AzureStorage::new(StorageConfig::new(credentials)).unwrap();
    let err = storage.queue("jobs").unwrap_err().to_string();
    assert!(err.contains("must be https"), "{err}");
    assert!(
        storage.checkpoint_store("checkpoints").is_ok(),
        "blob is https"
    );
}

/// A request signed with an account SAS of `scope`, made directly (not
/// through the code under test); returns the status.
async fn status_with(scope: &AccountSasScope, url: &str) -> StatusCode {
    let expiry = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let sas = sign_account_sas(ACCOUNT_NAME, &Secret::new(ACCOUNT_KEY), scope, expiry).unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = Url::parse(&format!("{url}{separator}{}", sas.secret())).unwrap();
    let mut request = Request::new(url, Method::Get);
    request.insert_header("x-ms-version", "2021-08-06");
    new_http_client(None)
        .execute_request(&request)
        .await
        .expect("azurite answers")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_sas_does_what_the_worker_does_and_no_more() {
    let azurite = start_azurite();
    // The stores run on the worker's SAS (signed by AzureStorage).
    let storage = storage(&azurite);
    let queue = storage.queue(&unique("jobs")).unwrap();
    queue.prepare().await.unwrap();
    queue.send("hello", Duration::ZERO).await.unwrap();
    let received = queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(received.len(), 1);
    let message = &received[0];
    let receipt = queue
        .update_visibility(&message.id, &message.pop_receipt, Duration::from_secs(30))
        .await
        .unwrap();
    queue.delete(&message.id, &receipt).await.unwrap();
    let container = unique("checkpoints");
    let checkpoints = storage.checkpoint_store(&container).unwrap();
    checkpoints.prepare().await.unwrap();
    assert!(checkpoints.read("job").await.unwrap().is_none());
    let results = storage.result_store(&unique("results")).unwrap();
    results.prepare().await.unwrap();
    results.put_new("r.json", b"{}").await.unwrap();
    assert_eq!(results.get("r.json").await.unwrap().unwrap(), b"{}");

    // The worker lists blobs (the Spot sightings' notes are found by
    // listing) but not the account's queues; the operator's scope has both.
    let worker = AccountSasScope::WORKER.allowing_http();
    let operator = AccountSasScope::OPERATOR.allowing_http();
    let list_blobs = format!(
        "{}/{container}?restype=container&comp=list",
        azurite.blob_endpoint()
    );
    let list_queues = format!("{}?comp=list", azurite.queue_endpoint());
    assert_eq!(status_with(&operator, &list_blobs).await, StatusCode::Ok);
    assert_eq!(status_with(&operator, &list_queues).await, StatusCode::Ok);
    assert_eq!(status_with(&worker, &list_blobs).await, StatusCode::Ok);
    assert_eq!(
        status_with(&worker, &list_queues).await,
        StatusCode::Forbidden
    );
    // An https-only SAS is refused over plain http.
    assert_eq!(
        status_with(&AccountSasScope::OPERATOR, &list_blobs).await,
        StatusCode::Forbidden
    );
}
