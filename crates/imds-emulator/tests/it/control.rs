//! The control API, injected faults and the first-call delay, over HTTP.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use spot_worker_imds_emulator::{EmulatorConfig, Fault};

#[tokio::test]
async fn event_round_trip() {
    let (_emulator, http) = unlimited_over_http().await;

    let created = http.new_event(json!({"event_type": "Preempt"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let created = created.json();
    assert_eq!(created["incarnation"], 2);
    let id = created["event"]["EventId"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert_eq!(created["event"]["EventStatus"], "Scheduled");
    assert_eq!(created["event"]["Resources"], json!(["spotvmss_0"]));
    assert_eq!(http.document().await["Events"][0], created["event"]);

    let started = http.post(&format!("/emulator/events/{id}/start")).await;
    assert_eq!(started.status, StatusCode::OK);
    assert_eq!(started.json()["incarnation"], 3);
    assert_eq!(http.document().await["Events"][0]["EventStatus"], "Started");

    // A started event cannot be cancelled, but it can complete.
    let cancel = http.delete(&format!("/emulator/events/{id}")).await;
    assert_eq!(cancel.status, StatusCode::CONFLICT);
    let complete = http.post(&format!("/emulator/events/{id}/complete")).await;
    assert_eq!(complete.status, StatusCode::OK);
    assert_eq!(
        http.document().await,
        json!({"DocumentIncarnation": 4, "Events": []})
    );

    for gone in [
        http.post(&format!("/emulator/events/{id}/start")).await,
        http.post(&format!("/emulator/events/{id}/complete")).await,
        http.delete(&format!("/emulator/events/{id}")).await,
    ] {
        assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.text);
    }
}

#[tokio::test]
async fn event_options() {
    let (_emulator, http) = unlimited_over_http().await;
    let created = http
        .new_event(json!({
            "event_type": "Freeze",
            "resources": ["spotvmss_0", "spotvmss_1"],
            "notice_secs": 60,
            "source": "User",
            "duration_secs": 9,
            "description": "custom",
            "complete_after_secs": 0.5,
        }))
        .await
        .json();
    let event = &created["event"];
    assert_eq!(event["Resources"], json!(["spotvmss_0", "spotvmss_1"]));
    assert_eq!(event["EventSource"], "User");
    assert_eq!(event["DurationInSeconds"], 9);
    assert_eq!(event["Description"], "custom");

    let hardware = http
        .new_event(json!({"event_type": "Reboot", "status": "Started"}))
        .await
        .json();
    assert_eq!(hardware["event"]["EventStatus"], "Started");
    assert_eq!(hardware["event"]["NotBefore"], "");

    let defaults = http.new_event(json!({"event_type": "Freeze"})).await.json();
    assert_eq!(defaults["event"]["DurationInSeconds"], 5);
    let custom_type = http.new_event(json!({"event_type": "Hibernate"})).await;
    assert_eq!(custom_type.status, StatusCode::CREATED);
}

/// A shared event (one Reboot of several VMs) is listed under the same
/// `EventId` on each VM: the control API takes the id, and refuses an empty
/// one or one already listed.
#[tokio::test]
async fn event_with_a_given_id() {
    let (_emulator, http) = unlimited_over_http().await;
    let shared = json!({
        "event_type": "Reboot",
        "event_id": "5A1E0C4D-0000-4000-8000-00000000C4A0",
        "resources": ["chaos_0", "chaos_1"],
        "notice_secs": 30,
    });
    let created = http.new_event(shared.clone()).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(
        created.json()["event"]["EventId"],
        "5A1E0C4D-0000-4000-8000-00000000C4A0"
    );
    let document = http.document().await;
    assert_eq!(
        document["Events"][0]["EventId"],
        "5A1E0C4D-0000-4000-8000-00000000C4A0"
    );
    assert_eq!(
        document["Events"][0]["Resources"],
        json!(["chaos_0", "chaos_1"])
    );

    let again = http.new_event(shared).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    let empty = http
        .new_event(json!({"event_type": "Reboot", "event_id": " "}))
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn invalid_events_are_400() {
    let (emulator, http) = unlimited_over_http().await;
    for body in [
        json!({"event_type": "Terminate", "notice_secs": 60}),
        json!({"event_type": "Terminate", "notice_secs": 1000}),
        json!({"event_type": "Preempt", "resources": []}),
        json!({"event_type": "Preempt", "notice_secs": -1}),
        json!({"event_type": "Preempt", "colour": "blue"}),
        json!({"event_type": ""}),
        json!({"notice_secs": 30}),
    ] {
        let answer = http.new_event(body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer.json()["error"].is_string());
    }
    let terminate = http
        .new_event(json!({"event_type": "Terminate", "notice_secs": 600}))
        .await;
    assert_eq!(terminate.status, StatusCode::CREATED);
    assert_eq!(emulator.incarnation(), 2);
}

#[tokio::test]
async fn state_and_reset() {
    let (_emulator, http) = unlimited_over_http().await;
    let created = http.new_event(json!({"event_type": "Reboot"})).await.json();
    let id = created["event"]["EventId"]
        .as_str()
        .expect("an id")
        .to_owned();
    http.approve(json!({"StartRequests": [{"EventId": id}]}).to_string())
        .await;

    let state = http.get("/emulator/state").await.json();
    assert_eq!(state["incarnation"], 3);
    assert_eq!(state["events"][0]["EventId"], id.as_str());
    assert_eq!(state["approvals"][0]["event_id"], id.as_str());
    assert_eq!(state["approvals"][0]["changed"], true);
    assert_eq!(state["stats"]["posts"], 1);
    assert_eq!(state["stats"]["scheduledevents_gets"], 0);

    let reset = http.post("/emulator/reset").await;
    assert_eq!(reset.status, StatusCode::OK);
    let state = http.get("/emulator/state").await.json();
    assert_eq!(state["incarnation"], 4, "the incarnation never goes back");
    assert_eq!(state["events"], json!([]));
    assert_eq!(state["approvals"], json!([]));
}

#[tokio::test]
async fn status_faults() {
    let (emulator, http) = unlimited_over_http().await;
    let injected = http
        .fault(json!({"kind": "status", "status": 503, "count": 2}))
        .await;
    assert_eq!(injected.status, StatusCode::OK);
    for _ in 0..2 {
        let failed = http.events().await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(failed.json()["error"].is_string());
    }
    assert_eq!(http.events().await.status, StatusCode::OK);
    assert_eq!(emulator.stats().faults_served, 2);

    // Faults only hit Scheduled Events GETs, and can be cleared.
    emulator.inject_faults(Fault::Status(StatusCode::INTERNAL_SERVER_ERROR), 5);
    let instance = http.instance().await;
    assert_eq!(instance.status, StatusCode::OK);
    let cleared = http.delete("/emulator/faults").await;
    assert_eq!(cleared.json()["pending_faults"], json!([]));
    assert_eq!(http.events().await.status, StatusCode::OK);

    let bad = http.fault(json!({"kind": "explode"})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn malformed_fault() {
    let (_emulator, http) = unlimited_over_http().await;
    http.fault(json!({"kind": "malformed"})).await;
    let broken = http.events().await;
    assert_eq!(broken.status, StatusCode::OK);
    assert!(
        serde_json::from_str::<serde_json::Value>(&broken.text).is_err(),
        "{}",
        broken.text
    );
    assert!(!broken.text.is_empty());
    assert_eq!(http.document().await["DocumentIncarnation"], 1);
}

#[tokio::test]
async fn drop_fault_closes_the_connection() {
    let (emulator, http) = unlimited_over_http().await;
    http.fault(json!({"kind": "drop", "count": 1})).await;
    let started = Instant::now();
    let dropped = http
        .client
        .get(format!(
            "{}/metadata/scheduledevents?api-version={VERSION}",
            http.base
        ))
        .header("Metadata", "true")
        .send()
        .await;
    let error = dropped.expect_err("no response");
    assert!(!error.is_timeout(), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The server carries on.
    assert_eq!(http.events().await.status, StatusCode::OK);
    assert_eq!(emulator.stats().faults_served, 1);
}

#[tokio::test]
async fn delay_fault() {
    let (_emulator, http) = unlimited_over_http().await;
    http.fault(json!({"kind": "delay", "millis": 400})).await;
    let started = Instant::now();
    let slow = http.events().await;
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(slow.status, StatusCode::OK);
    assert_eq!(slow.json()["DocumentIncarnation"], 1);
    let started = Instant::now();
    http.events().await;
    assert!(started.elapsed() < Duration::from_millis(400));
}

#[tokio::test]
async fn first_call_delay() {
    let emulator = with_config(EmulatorConfig {
        rate_limit_per_sec: None,
        first_call_delay: Duration::from_millis(400),
        ..EmulatorConfig::default()
    })
    .await;
    let http = Http::to(&emulator);
    let started = Instant::now();
    assert_eq!(http.events().await.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(400));
    let started = Instant::now();
    http.events().await;
    assert!(started.elapsed() < Duration::from_millis(400));

    // Setting it again re-arms it.
    let config = http.configure(json!({"first_call_delay_ms": 300})).await;
    assert_eq!(config.status, StatusCode::OK);
    assert_eq!(config.json()["first_call_delay_ms"], 300);
    let started = Instant::now();
    http.events().await;
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn rate_limit_can_be_changed_at_run_time() {
    let emulator = with_config(EmulatorConfig::default()).await;
    let http = Http::to(&emulator);
    let config = http.configure(json!({"rate_limit_per_sec": null})).await;
    assert_eq!(config.json()["rate_limit_per_sec"], serde_json::Value::Null);
    for _ in 0..8 {
        assert_eq!(http.events().await.status, StatusCode::OK);
    }
    http.configure(json!({"rate_limit_per_sec": 1})).await;
    http.events().await;
    assert_eq!(http.events().await.status, StatusCode::TOO_MANY_REQUESTS);
    let zero = http.configure(json!({"rate_limit_per_sec": 0})).await;
    assert_eq!(zero.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn scenarios_over_http() {
    let (emulator, http) = unlimited_over_http().await;
    let listed = http.get("/emulator/scenarios").await.json();
    let names: Vec<_> = listed["scenarios"]
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, spot_worker_imds_emulator::Scenario::BUILTIN);

    // 20 s of cancelled maintenance in 0.2 s.
    let played = http
        .control(
            "/emulator/scenarios/cancelled-maintenance",
            json!({"speed": 100.0}),
        )
        .await;
    assert_eq!(played.status, StatusCode::ACCEPTED, "{}", played.text);
    assert_eq!(played.json()["scenario"]["steps"][1]["action"], "cancel");
    tokio::time::timeout(Duration::from_secs(5), emulator.wait_for_incarnation(3))
        .await
        .expect("cancelled in time");
    assert_eq!(http.document().await["Events"], json!([]));

    // A 30 s eviction notice in 1 s; the event starts by itself.
    http.control("/emulator/scenarios/spot-eviction", json!({"speed": 30.0}))
        .await;
    let started = http
        .poll_until(|d| d["Events"][0]["EventStatus"] == "Started")
        .await;
    assert_eq!(started["Events"][0]["EventType"], "Preempt");

    let unknown = http
        .control("/emulator/scenarios/meteor-strike", json!({}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let slow = http
        .control("/emulator/scenarios/spot-eviction", json!({"speed": 0}))
        .await;
    assert_eq!(slow.status, StatusCode::BAD_REQUEST);
    let short = http
        .control(
            "/emulator/scenarios/scale-in-terminate",
            json!({"notice_secs": 60}),
        )
        .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    let empty_body = http.post("/emulator/scenarios/scale-in-terminate").await;
    assert_eq!(empty_body.status, StatusCode::ACCEPTED);

    // Reset stops the players.
    http.post("/emulator/reset").await;
    assert_eq!(emulator.document()["Events"], json!([]));
}

#[tokio::test]
async fn drop_fault_sends_no_bytes_at_all() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let emulator = unlimited().await;
    emulator.inject_fault(Fault::Drop);
    let mut stream = tokio::net::TcpStream::connect(emulator.addr())
        .await
        .expect("connects");
    stream
        .write_all(
            format!(
                "GET /metadata/scheduledevents?api-version={VERSION} HTTP/1.1\r\n\
                 Host: 127.0.0.1\r\nMetadata: true\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("request written");
    let mut reply = Vec::new();
    // Closed by a FIN (Ok) or a reset (Err), either way in time and without
    // a single byte: curl's "Empty reply from server".
    let _closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply))
        .await
        .expect("closed in time");
    assert!(reply.is_empty(), "{}", String::from_utf8_lossy(&reply));
}

#[tokio::test]
async fn instance_metadata_can_be_missing_like_a_stand_in_for_imds() {
    let emulator = with_config(EmulatorConfig::default()).await;
    let http = Http::to(&emulator);
    let config = http
        .configure(json!({"instance_metadata_missing": true}))
        .await;
    assert_eq!(config.json()["instance_metadata_missing"], true);
    let missing = http.instance().await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.content_type.starts_with("text/html"),
        "{}",
        missing.content_type
    );
    assert!(
        missing.text.lines().count() > 3 && missing.text.len() > 200,
        "a whole page: {}",
        missing.text
    );
    http.configure(json!({"instance_metadata_missing": false}))
        .await;
    assert_eq!(http.instance().await.status, StatusCode::OK);
    assert_eq!(emulator.stats().instance_gets, 2, "both requests counted");
}
