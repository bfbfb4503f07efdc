//! How the client treats the network between it and IMDS: proxies are
//! ignored, redirects refused, bodies bounded, dead endpoints reported fast.
//!
//! The odd servers here are a few lines of raw TCP on loopback, because the
//! emulator (rightly) never misbehaves this way.

mod common;

use std::time::Duration;

use common::*;
use spot_worker::imds::{ImdsClient, ImdsConfig, ImdsError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `response` verbatim to every connection, after reading the request
/// head.
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
    let url = canned_server(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://evil.example/\r\nContent-Length: 0\r\n\r\n"
            .to_vec(),
    )
    .await;
    let error = client(&url).scheduled_events().await.unwrap_err();
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
        let url = canned_server(response.into_bytes()).await;
        let error = client(&url).scheduled_events().await.unwrap_err();
        assert!(
            matches!(error, ImdsError::TooLarge { limit } if limit == 256 * 1024),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_dead_endpoint_fails_fast_with_a_clear_error() {
    // Bind then drop to get a port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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
    let url = canned_server(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 47\r\n\r\n{\"error\":\"Bad request. api-version is invalid\"}"
            .to_vec(),
    )
    .await;
    let error = client(&url).scheduled_events().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "IMDS rejected the request (400 Bad Request): Bad request. api-version is invalid"
    );
    assert!(!error.is_transient());
}
