//! The IMDS endpoints behave like the real service.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use spot_worker_imds_emulator::{EmulatorConfig, EventSpec};

const NEWEST: [&str; 3] = ["2020-07-01", "2019-08-01", "2019-04-01"];

#[tokio::test]
async fn empty_document_and_content_type() {
    let emulator = unlimited().await;
    let answer = events(&client(), &emulator.url(), VERSION).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.content_type, "application/json; charset=utf-8");
    assert_eq!(answer.text, r#"{"DocumentIncarnation":1,"Events":[]}"#);
}

#[tokio::test]
async fn metadata_header_is_required() {
    let emulator = unlimited().await;
    let client = client();
    let url = format!(
        "{}/metadata/scheduledevents?api-version={VERSION}",
        emulator.url()
    );
    let missing = answer(client.get(&url)).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.json(),
        json!({"error": "Bad request. Required metadata header not specified"})
    );
    let wrong = answer(client.get(&url).header("Metadata", "yes")).await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    let upper = answer(client.get(&url).header("metadata", "TRUE")).await;
    assert_eq!(upper.status, StatusCode::OK);
    assert_eq!(emulator.stats().bad_requests, 2);
}

#[tokio::test]
async fn api_version_is_checked() {
    let emulator = unlimited().await;
    let client = client();
    let missing = answer(
        client
            .get(format!("{}/metadata/scheduledevents", emulator.url()))
            .header("Metadata", "true"),
    )
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.json(),
        json!({
            "error": "Bad request. api-version was not specified in the request. For more information refer to aka.ms/azureimds",
            "newest-versions": NEWEST,
        })
    );
    for invalid in ["latest", "2018-01-01", "2021-02-01"] {
        let answer = events(&client, &emulator.url(), invalid).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{invalid}");
        assert_eq!(
            answer.json(),
            json!({
                "error": "Bad request. api-version is invalid or was not specified in the request. For more information refer to aka.ms/azureimds",
                "newest-versions": NEWEST,
            })
        );
    }
    for valid in spot_worker_imds_emulator::SCHEDULED_EVENTS_API_VERSIONS {
        assert_eq!(
            events(&client, &emulator.url(), valid).await.status,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn proxied_requests_are_refused() {
    let emulator = unlimited().await;
    let answer = answer(
        client()
            .get(format!(
                "{}/metadata/scheduledevents?api-version={VERSION}",
                emulator.url()
            ))
            .header("Metadata", "true")
            .header("X-Forwarded-For", "10.0.0.1"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"].is_string());
}

#[tokio::test]
async fn unknown_paths_are_json_404() {
    let emulator = unlimited().await;
    let answer = answer(client().get(format!("{}/metadata/nothing", emulator.url()))).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(answer.json()["error"].is_string());
}

#[tokio::test]
async fn event_wire_format() {
    let emulator = unlimited().await;
    let client = client();
    let before = SystemTime::now();
    let scheduled = emulator.schedule(EventSpec::preempt()).expect("valid");
    let answer = events(&client, &emulator.url(), VERSION).await;
    // Field order as in the real service.
    let positions: Vec<usize> = [
        "DocumentIncarnation",
        "Events",
        "EventId",
        "EventType",
        "ResourceType",
        "Resources",
        "EventStatus",
        "NotBefore",
        "Description",
        "EventSource",
        "DurationInSeconds",
    ]
    .iter()
    .map(|field| answer.text.find(&format!("\"{field}\"")).expect(field))
    .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{}", answer.text);

    let document = answer.json();
    assert_eq!(document["DocumentIncarnation"], 2);
    let event = &document["Events"][0];
    assert_eq!(event["EventId"], scheduled.id.as_str());
    assert_eq!(scheduled.id, scheduled.id.to_uppercase());
    assert!(scheduled.id.parse::<uuid_like::Id>().is_ok());
    assert_eq!(event["EventType"], "Preempt");
    assert_eq!(event["ResourceType"], "VirtualMachine");
    assert_eq!(event["Resources"], json!(["spotvmss_0"]));
    assert_eq!(event["EventStatus"], "Scheduled");
    assert_eq!(event["EventSource"], "Platform");
    assert_eq!(event["DurationInSeconds"], -1);
    assert_eq!(
        event["Description"],
        "Virtual machine is being evicted from the Spot pool."
    );

    let not_before = event["NotBefore"].as_str().expect("a string");
    assert!(not_before.ends_with(" GMT"), "{not_before}");
    let parsed = httpdate::parse_http_date(not_before).expect("RFC 1123");
    assert_eq!(httpdate::fmt_http_date(parsed), not_before);
    let notice = parsed.duration_since(before).expect("in the future");
    assert!(
        notice >= Duration::from_secs(30) && notice <= Duration::from_secs(32),
        "{notice:?}"
    );
    assert_eq!(Some(parsed), scheduled.not_before);
}

/// Checks the shape of a UUID without depending on a UUID crate.
mod uuid_like {
    pub struct Id;
    impl std::str::FromStr for Id {
        type Err = ();
        fn from_str(s: &str) -> Result<Self, ()> {
            let groups: Vec<_> = s.split('-').map(str::len).collect();
            let hex = s.chars().all(|c| c == '-' || c.is_ascii_hexdigit());
            (groups == [8, 4, 4, 4, 12] && hex).then_some(Id).ok_or(())
        }
    }
}

#[tokio::test]
async fn approval_starts_event_once() {
    let emulator = unlimited().await;
    let client = client();
    let base = emulator.url();
    let scheduled = emulator.schedule(EventSpec::reboot()).expect("valid");

    let first = document(&client, &base).await;
    let again = document(&client, &base).await;
    assert_eq!(first, again, "nothing changed between two GETs");
    assert_eq!(first["DocumentIncarnation"], 2);

    let body = json!({"StartRequests": [{"EventId": scheduled.id}]}).to_string();
    let approved = approve(&client, &base, body.clone()).await;
    assert_eq!(approved.status, StatusCode::OK);
    let started = document(&client, &base).await;
    assert_eq!(started["DocumentIncarnation"], 3);
    let event = &started["Events"][0];
    assert_eq!(event["EventId"], scheduled.id.as_str());
    assert_eq!(event["EventStatus"], "Started");
    assert_eq!(event["NotBefore"], "");

    // Approving again (e.g. by another VM) is fine and changes nothing.
    assert_eq!(approve(&client, &base, body).await.status, StatusCode::OK);
    assert_eq!(document(&client, &base).await, started);

    let approvals = emulator.approvals();
    assert_eq!(approvals.len(), 2);
    assert_eq!(approvals[0].event_id, scheduled.id);
    assert!(approvals[0].changed);
    assert!(!approvals[1].changed);
    assert_eq!(emulator.stats().posts, 2);
}

#[tokio::test]
async fn bad_approvals_are_400() {
    let emulator = unlimited().await;
    let client = client();
    let base = emulator.url();
    let scheduled = emulator.schedule(EventSpec::freeze()).expect("valid");
    for body in [
        "{not json".to_owned(),
        json!({"Events": []}).to_string(),
        json!({"StartRequests": [{"EventId": "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"}]}).to_string(),
        json!({"StartRequests": [{"EventId": scheduled.id}, {"EventId": "nope"}]}).to_string(),
    ] {
        let answer = approve(&client, &base, body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer.json()["error"].is_string());
    }
    let unknown = approve(
        &client,
        &base,
        json!({"StartRequests": [{"EventId": "nope"}]}).to_string(),
    )
    .await;
    assert!(
        unknown.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("nope"))
    );
    // Nothing changed, nothing recorded.
    assert_eq!(emulator.incarnation(), 2);
    assert!(emulator.approvals().is_empty());
    assert_eq!(emulator.stats().bad_requests, 5);
}

#[tokio::test]
async fn event_starts_by_itself_at_not_before() {
    let (emulator, http) = unlimited_over_http().await;
    let scheduled = emulator
        .schedule(EventSpec::preempt().notice(Duration::from_secs(1)))
        .expect("valid");
    let not_before = scheduled.not_before.expect("scheduled");
    let started = http
        .poll_until(|d| d["Events"][0]["EventStatus"] == "Started")
        .await;
    assert!(SystemTime::now() >= not_before);
    assert_eq!(started["DocumentIncarnation"], 3);
    assert_eq!(started["Events"][0]["EventId"], scheduled.id.as_str());
    assert_eq!(started["Events"][0]["NotBefore"], "");
}

#[tokio::test]
async fn started_events_complete_and_disappear() {
    let (emulator, http) = unlimited_over_http().await;
    let scheduled = emulator
        .schedule(EventSpec::freeze().complete_after(Duration::from_millis(300)))
        .expect("valid");
    emulator.start_event(&scheduled.id).expect("exists");
    let gone = http.poll_until(|d| d["Events"] == json!([])).await;
    assert_eq!(gone["DocumentIncarnation"], 4);
}

#[tokio::test]
async fn wait_for_incarnation_follows_time() {
    let emulator = unlimited().await;
    emulator
        .schedule(
            EventSpec::reboot()
                .notice(Duration::from_secs(1))
                .complete_after(Duration::from_millis(100)),
        )
        .expect("valid");
    tokio::time::timeout(Duration::from_secs(5), emulator.wait_for_incarnation(4))
        .await
        .expect("started and completed in time");
    assert_eq!(emulator.document()["Events"], json!([]));
}

#[tokio::test]
async fn cancel_removes_scheduled_events_only() {
    let emulator = unlimited().await;
    let a = emulator.schedule(EventSpec::reboot()).expect("valid");
    let b = emulator
        .schedule(EventSpec::reboot().started())
        .expect("valid");
    emulator.cancel_event(&a.id).expect("scheduled");
    assert_eq!(emulator.incarnation(), 4);
    assert!(emulator.cancel_event(&b.id).is_err());
    assert!(emulator.cancel_event(&a.id).is_err());
    assert_eq!(emulator.document()["Events"][0]["EventId"], b.id.as_str());
}

#[tokio::test]
async fn old_api_versions_see_less() {
    let emulator = unlimited().await;
    let client = client();
    let base = emulator.url();
    emulator.schedule(EventSpec::terminate()).expect("valid");
    emulator.schedule(EventSpec::freeze()).expect("valid");

    let old = events(&client, &base, "2017-11-01").await.json();
    assert_eq!(old["DocumentIncarnation"], 3);
    let types: Vec<_> = old["Events"]
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["EventType"].clone())
        .collect();
    assert_eq!(types, vec![json!("Freeze")]);
    assert!(old["Events"][0].get("EventSource").is_none());
    assert!(old["Events"][0].get("DurationInSeconds").is_none());

    let v2019 = events(&client, &base, "2019-01-01").await.json();
    assert_eq!(v2019["Events"].as_array().map(Vec::len), Some(2));
    assert!(v2019["Events"][0].get("EventSource").is_none());

    let v201908 = events(&client, &base, "2019-08-01").await.json();
    assert_eq!(v201908["Events"][1]["EventSource"], "Platform");
    assert_eq!(v201908["Events"][1]["DurationInSeconds"], 5);
}

#[tokio::test]
async fn rate_limit_throttles_the_sixth_request_in_a_second() {
    let emulator = with_config(EmulatorConfig::default()).await;
    let http = Http::to(&emulator);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(http.events().await.status);
    }
    assert_eq!(&statuses[..5], &[StatusCode::OK; 5]);
    assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS);
    let throttled = http.events().await;
    assert_eq!(throttled.json(), json!({"error": "Too many requests"}));
    // The instance endpoint shares the limit; the control API does not.
    let instance = http.instance().await;
    assert_eq!(instance.status, StatusCode::TOO_MANY_REQUESTS);
    let state = http.get("/emulator/state").await.json();
    assert_eq!(state["stats"]["throttled"], 3);
    assert_eq!(state["stats"]["scheduledevents_gets"], 5);
}

#[tokio::test]
async fn instance_metadata() {
    let emulator = unlimited().await;
    let http = Http::to(&emulator);
    let answer_ok = http.instance().await;
    assert_eq!(answer_ok.status, StatusCode::OK);
    assert_eq!(answer_ok.content_type, "application/json; charset=utf-8");
    let instance: Value = answer_ok.json();
    let compute = &instance["compute"];
    assert_eq!(compute["name"], "spotvmss_0");
    assert_eq!(compute["vmScaleSetName"], "spotvmss");
    assert_eq!(compute["priority"], "Spot");
    assert_eq!(compute["evictionPolicy"], "Delete");
    assert_eq!(compute["location"], "westeurope");
    assert_eq!(compute["vmSize"], "Standard_D2s_v5");
    assert_eq!(compute["osType"], "Linux");
    assert!(compute["vmId"].as_str().is_some_and(|id| id.len() == 36));
    assert!(
        compute["resourceId"]
            .as_str()
            .is_some_and(|id| id.starts_with("/subscriptions/"))
    );
    assert_eq!(instance["network"]["interface"], json!([]));

    for version in ["2019-06-01", "2023-07-01"] {
        let ok = http.instance_at(version).await;
        assert_eq!(ok.status, StatusCode::OK, "{version}");
    }
    assert_eq!(
        http.get("/metadata/instance?api-version=2021-02-01")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let invalid = http.instance_at("latest").await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert!(invalid.json()["newest-versions"].is_array());
    // Refused requests count too; only throttled ones do not.
    assert_eq!(emulator.stats().instance_gets, 5);
}

#[tokio::test]
async fn configurable_vm_name() {
    let emulator = with_config(EmulatorConfig {
        rate_limit_per_sec: None,
        ..EmulatorConfig::for_vm("workers_7")
    })
    .await;
    emulator.schedule(EventSpec::preempt()).expect("valid");
    assert_eq!(
        emulator.document()["Events"][0]["Resources"],
        json!(["workers_7"])
    );
    let instance = answer(
        client()
            .get(format!(
                "{}/metadata/instance?api-version=2021-02-01",
                emulator.url()
            ))
            .header("Metadata", "true"),
    )
    .await
    .json();
    assert_eq!(instance["compute"]["name"], "workers_7");
    assert_eq!(instance["compute"]["vmScaleSetName"], "workers");
}
