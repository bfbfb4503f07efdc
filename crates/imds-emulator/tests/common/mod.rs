//! Helpers shared by the HTTP tests: a started emulator on 127.0.0.1 and a
//! client that talks to it directly.

#![allow(dead_code)]

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::Value;
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};

mod http;
pub use http::{Http, unlimited_over_http};

pub const VERSION: &str = "2020-07-01";

/// An emulator without rate limit, so that polling tests are not throttled.
pub async fn unlimited() -> RunningEmulator {
    with_config(EmulatorConfig {
        rate_limit_per_sec: None,
        ..EmulatorConfig::default()
    })
    .await
}

pub async fn with_config(config: EmulatorConfig) -> RunningEmulator {
    Emulator::start(config).await.expect("bind 127.0.0.1:0")
}

pub fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client")
}

pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

pub async fn answer(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("a response");
    Answer {
        status: response.status(),
        content_type: response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        text: response.text().await.expect("a body"),
    }
}

/// `GET /metadata/scheduledevents?api-version={version}` with the header.
pub async fn events(client: &Client, base: &str, version: &str) -> Answer {
    answer(
        client
            .get(format!(
                "{base}/metadata/scheduledevents?api-version={version}"
            ))
            .header("Metadata", "true"),
    )
    .await
}

/// The current document (api-version 2020-07-01), asserting a 200.
pub async fn document(client: &Client, base: &str) -> Value {
    let answer = events(client, base, VERSION).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    answer.json()
}

/// Approves `ids` through the IMDS POST.
pub async fn approve(client: &Client, base: &str, body: String) -> Answer {
    answer(
        client
            .post(format!(
                "{base}/metadata/scheduledevents?api-version={VERSION}"
            ))
            .header("Metadata", "true")
            .body(body),
    )
    .await
}

pub async fn control_post(client: &Client, base: &str, path: &str, body: Value) -> Answer {
    answer(client.post(format!("{base}{path}")).json(&body)).await
}

/// Polls the document (at most 60 times, 100 ms apart, i.e. about 6 s)
/// until `done` holds for it.
pub async fn poll_until(client: &Client, base: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..60 {
        let document = document(client, base).await;
        if done(&document) {
            return document;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the document never reached the expected state");
}
