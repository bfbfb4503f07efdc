//! How the client treats the network between it and IMDS: proxies are
//! ignored, redirects refused, bodies bounded, dead endpoints reported fast.
//!
//! The odd servers here are a few lines of raw TCP on loopback, because the
//! emulator (rightly) never misbehaves this way.

use crate::common;

use std::time::Duration;

use common::*;
use spot_worker_imds::{ImdsClient, ImdsConfig, ImdsError, NoticePolicy, Watcher, WatcherConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `response` verbatim to every connection, after reading the request
/// head.
/// The error the client's Scheduled Events GET meets when the server
/// answers `response`.
async fn error_for(response: Vec<u8>) -> ImdsError {
    let url = canned_server(response).await;
    match client(&url).scheduled_events().await {
        Ok(document) => panic!("{url} answered {document:?}, not an error"),
        Err(error) => error,
    }
}

async fn canned_server(response: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let _ = socket.read(&mut head).await;
                let _ = socket.write_all(&response).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test]
async fn redirects_are_refused_not_followed() {
    let error = error_for(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://evil.example/\r\nContent-Length: 0\r\n\r\n"
            .to_vec(),
    )
    .await;
    match error {
        ImdsError::Redirect { status, location } => {
            assert_eq!(status, 307);
            assert_eq!(location.as_deref(), Some("http://evil.example/"));
        }
        other => panic!("expected a refused redirect, got {other}"),
    }
}

#[tokio::test]
async fn oversized_responses_are_refused() {
    let body = format!(
        "{{\"DocumentIncarnation\":1,\"Events\":[],\"pad\":\"{}\"}}",
        "x".repeat(300 * 1024)
    );
    // Once with a Content-Length, once streamed without one.
    let declared = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let streamed = format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{body}");
    for response in [declared, streamed] {
        let error = error_for(response.into_bytes()).await;
        assert!(
            matches!(error, ImdsError::TooLarge { limit } if limit == 256 * 1024),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_dead_endpoint_fails_fast_with_a_clear_error() {
    // A port bound and never listened on, held to the end: connections to
    // it are refused. (A port bound then released could be taken by
    // another suite's emulator in between: a side-by-side run once got
    // that emulator's events here.)
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = held.local_addr().unwrap().port();
    let config = ImdsConfig {
        first_call_timeout: Duration::from_secs(10),
        ..ImdsConfig::default().with_endpoint(format!("http://127.0.0.1:{port}"))
    };
    let client = ImdsClient::new(config).unwrap();
    let error = within("a refused connection", client.scheduled_events())
        .await
        .unwrap_err();
    assert!(matches!(error, ImdsError::Transport { .. }), "{error}");
    assert!(error.is_transient());
    assert!(error.to_string().contains(&format!("127.0.0.1:{port}")));
}

#[tokio::test]
async fn bad_request_messages_come_from_imds() {
    let error = error_for(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 47\r\n\r\n{\"error\":\"Bad request. api-version is invalid\"}"
            .to_vec(),
    )
    .await;
    assert_eq!(
        error.to_string(),
        "IMDS rejected the request (400 Bad Request): Bad request. api-version is invalid"
    );
    assert!(!error.is_transient());
}

/// Answers Scheduled Events with `document` and instance metadata with 503,
/// and says on `requests` each time a request arrives.
async fn imds_without_instance_metadata(
    document: &'static str,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let n = socket.read(&mut head).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&head[..n]).into_owned();
                let _ = tx.send(head.clone());
                let response = if head.contains("/metadata/instance") {
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{document}",
                        document.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, rx)
}

#[tokio::test]
async fn events_are_watched_even_while_instance_metadata_fails() {
    let (url, _requests) = imds_without_instance_metadata(
        r#"{"DocumentIncarnation":2,"Events":[{"EventId":"E","EventType":"Preempt",
            "EventStatus":"Scheduled","Resources":["somebody"],"NotBefore":""}]}"#,
    )
    .await;
    let config = WatcherConfig {
        vm_name: None,
        ..watcher_config()
    };
    let mut watcher = Watcher::new(client(&url), config);
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let running = watcher.spawn();
    // Without a name, every event is taken to concern this VM: drain.
    within("the shutdown token", shutdown.cancelled()).await;
    let health = running.health().borrow().clone();
    assert_eq!(health.vm_name, None);
    assert!(
        !health.is_healthy(Duration::from_secs(60)),
        "not identified"
    );
    assert!(
        health
            .last_error
            .unwrap_or_default()
            .starts_with("instance metadata: IMDS answered 503")
    );
}

#[tokio::test]
async fn stopping_the_watcher_abandons_a_hung_request() {
    // A server that accepts, reads, and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = vec![0u8; 4096];
        let _ = socket.read(&mut head).await;
        let _ = arrived_tx.send(());
        let _ = socket.read(&mut head).await; // hold the connection open
    });
    let config = ImdsConfig {
        first_call_timeout: Duration::from_secs(120),
        ..client_config(&url)
    };
    let running = Watcher::new(ImdsClient::new(config).unwrap(), watcher_config()).spawn();
    within("the request to arrive", arrived).await.unwrap();
    // The first-call timeout is two minutes; stopping must not wait for it.
    tokio::time::timeout(Duration::from_secs(5), running.stop())
        .await
        .expect("stopped promptly");
}
