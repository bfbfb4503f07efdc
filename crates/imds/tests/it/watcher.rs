//! The watcher and client against the emulator: identity, deadlines,
//! approvals, faults and the IMDS rate limit.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use reqwest::StatusCode;
use spot_worker_imds::{
    Approval, ApprovalScope, EventId, ImdsClient, ImdsConfig, ImdsError, NoticePolicy,
    TransitionKind, Watcher, WatcherConfig,
};
use spot_worker_imds_emulator::{EmulatorConfig, EventSpec, Fault, RunningEmulator};
use tokio::time::Instant;

#[tokio::test]
async fn preempt_cancels_the_token_with_not_before_as_deadline() {
    let emulator = emulator().await;
    let (_running, shutdown) = watching(&emulator).await;
    assert!(!shutdown.token().is_cancelled());

    let event = emulator.schedule(EventSpec::preempt()).unwrap();
    within("the shutdown token", shutdown.cancelled()).await;

    let notice = shutdown.notice().expect("a notice with the token");
    assert_eq!(notice.event_id, EventId(event.id.clone()));
    let not_before = event.not_before.expect("scheduled events have NotBefore");
    assert_eq!(notice.not_before.map(SystemTime::from), Some(not_before));
    // The deadline is NotBefore on the monotonic clock: compare both clocks'
    // time left, allowing for the time between the two readings.
    let wall_left = not_before.duration_since(SystemTime::now()).unwrap();
    let mono_left = notice.deadline - Instant::now();
    let skew = wall_left.abs_diff(mono_left);
    assert!(skew < Duration::from_millis(250), "deadline skew {skew:?}");
    assert!(mono_left > Duration::from_secs(25), "{mono_left:?} left");
}

#[tokio::test]
async fn learns_its_name_from_instance_metadata() {
    let emulator = emulator_with(EmulatorConfig::for_vm("workers_7")).await;
    let config = WatcherConfig {
        vm_name: None,
        ..watcher_config()
    };
    let mut watcher = Watcher::new(client(&emulator.url()), config);
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let running = watcher.spawn();
    let health = health_until(&running, "the first poll", |h| h.polls > 0).await;
    assert_eq!(health.vm_name.as_deref(), Some("workers_7"));
    assert!(health.is_healthy(Duration::from_secs(60)));

    emulator
        .schedule(EventSpec::preempt().resources(["workers_7"]))
        .unwrap();
    within("the shutdown token", shutdown.cancelled()).await;
}

#[tokio::test]
async fn events_present_at_start_are_acted_on() {
    let emulator = emulator().await;
    emulator.schedule(EventSpec::terminate()).unwrap();
    let mut watcher = Watcher::new(client(&emulator.url()), watcher_config());
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let _running = watcher.spawn();
    within("the shutdown token", shutdown.cancelled()).await;
}

#[tokio::test]
async fn unchanged_incarnations_emit_nothing() {
    let emulator = emulator().await;
    let watcher = Watcher::new(client(&emulator.url()), watcher_config());
    let mut transitions = watcher.subscribe();
    let running = watcher.spawn();
    emulator.schedule(EventSpec::reboot()).unwrap();
    caught_up(&running, emulator.incarnation()).await;
    let polls = running.health().borrow().polls;
    health_until(&running, "three more polls", |h| h.polls >= polls + 3).await;
    let seen = drain(&mut transitions);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind, TransitionKind::Scheduled);
}

#[tokio::test]
async fn survives_every_kind_of_imds_failure_and_recovers() {
    let emulator = emulator().await;
    let (running, shutdown) = watching(&emulator).await;

    let faults = [
        (Fault::Status(StatusCode::INTERNAL_SERVER_ERROR), "500"),
        (Fault::Status(StatusCode::SERVICE_UNAVAILABLE), "503"),
        (Fault::Malformed, "malformed Scheduled Events document"),
        (Fault::Drop, "failed"),
        (Fault::Delay(Duration::from_secs(3)), "timed out after 2s"),
    ];
    for (fault, expected) in faults {
        let failures = running.health().borrow().failures;
        emulator.inject_fault(fault.clone());
        running.refresh();
        // One failure, then the next poll succeeds: the watcher kept going.
        let health = health_until(&running, "a failure, then recovery", |h| {
            h.failures > failures && h.consecutive_failures == 0
        })
        .await;
        let error = health.last_error.unwrap_or_default();
        assert!(error.contains(expected), "{fault:?}: {error}");
        assert!(!shutdown.token().is_cancelled());
    }

    // And an eviction after all that is still caught.
    emulator.schedule(EventSpec::preempt()).unwrap();
    within("the shutdown token", shutdown.cancelled()).await;
}

#[tokio::test]
async fn after_an_outage_the_next_notice_is_seen_within_one_poll_interval() {
    let emulator = emulator().await;
    // The production interval: a Preempt must be seen within a second.
    let interval = Duration::from_secs(1);
    let config = WatcherConfig {
        poll_interval: interval,
        ..watcher_config()
    };
    let mut watcher = Watcher::new(client(&emulator.url()), config);
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let running = watcher.spawn();
    caught_up(&running, emulator.incarnation()).await;

    // Two malformed answers and two 500s in a row, then IMDS recovers.
    emulator.inject_faults(Fault::Malformed, 2);
    emulator.inject_faults(Fault::Status(StatusCode::INTERNAL_SERVER_ERROR), 2);
    running.refresh();
    health_until(&running, "the fourth failure", |h| {
        h.consecutive_failures >= 4
    })
    .await;
    let recovered = Instant::now();
    emulator.schedule(EventSpec::preempt()).unwrap();
    within("the shutdown token", shutdown.cancelled()).await;
    let seen_after = recovered.elapsed();
    // One interval plus room for a slow machine; a backoff grown to 2.5-5 s
    // (the exponential one this replaced) cannot pass.
    assert!(
        seen_after < interval + Duration::from_millis(1400),
        "the notice was seen {seen_after:?} after IMDS recovered"
    );
}

#[tokio::test]
async fn a_failure_does_not_lose_or_invent_transitions() {
    let emulator = emulator().await;
    let watcher = Watcher::new(client(&emulator.url()), watcher_config());
    let mut transitions = watcher.subscribe();
    let running = watcher.spawn();
    let event = emulator.schedule(EventSpec::reboot()).unwrap();
    caught_up(&running, emulator.incarnation()).await;

    // A broken document must not read as "the event is gone".
    emulator.inject_faults(Fault::Malformed, 3);
    emulator.start_event(&event.id).unwrap();
    caught_up(&running, emulator.incarnation()).await;
    let kinds: Vec<_> = drain(&mut transitions).iter().map(|t| t.kind).collect();
    assert_eq!(kinds, [TransitionKind::Scheduled, TransitionKind::Started]);
}

#[tokio::test]
async fn the_first_call_gets_its_own_longer_timeout() {
    let emulator = emulator().await;
    emulator.set_first_call_delay(Duration::from_millis(1500));
    let config = ImdsConfig {
        request_timeout: Duration::from_millis(500),
        first_call_timeout: Duration::from_secs(10),
        ..ImdsConfig::default().with_endpoint(emulator.url())
    };
    let client = ImdsClient::new(config).unwrap();
    let document = client
        .scheduled_events()
        .await
        .expect("the slow first call");
    assert_eq!(document.incarnation, 1);

    // Later calls use the short timeout.
    emulator.inject_fault(Fault::Delay(Duration::from_millis(1500)));
    let error = client.scheduled_events().await.unwrap_err();
    assert!(
        matches!(error, ImdsError::Timeout { after, .. } if after == Duration::from_millis(500))
    );
}

#[tokio::test]
async fn a_first_call_slower_than_its_timeout_is_retried() {
    let emulator = emulator().await;
    emulator.set_first_call_delay(Duration::from_secs(3));
    let config = ImdsConfig {
        first_call_timeout: Duration::from_millis(300),
        ..client_config(&emulator.url())
    };
    let running = Watcher::new(ImdsClient::new(config).unwrap(), watcher_config()).spawn();
    let health = health_until(&running, "success after the slow start", |h| h.polls > 0).await;
    assert!(health.failures >= 1);
    assert!(health.is_healthy(Duration::from_secs(60)));
    let error = health.last_error.unwrap_or_default();
    assert!(error.contains("timed out after 300ms"), "{error}");
}

#[tokio::test]
async fn approval_starts_this_vms_event_once() {
    let emulator = emulator().await;
    let client = client(&emulator.url());
    let id = scheduled(&emulator, EventSpec::preempt());
    let scope = ApprovalScope::ThisVm(VM.into());

    assert_eq!(approve(&client, &id, &scope).await, Approval::Approved);
    let document = client.scheduled_events().await.unwrap();
    assert_eq!(document.event(&id).unwrap().status.as_str(), "Started");
    assert_eq!(
        approve(&client, &id, &scope).await,
        Approval::AlreadyStarted
    );
    assert_eq!(emulator.approvals().len(), 1);
}

#[tokio::test]
async fn approval_refuses_an_event_shared_with_other_vms_unless_told() {
    let emulator = emulator().await;
    let client = client(&emulator.url());
    let id = scheduled(&emulator, EventSpec::reboot().resources([VM, PEER]));

    let error = refused(&client, &id, &ApprovalScope::ThisVm(VM.into())).await;
    assert!(matches!(error, ImdsError::SharedEvent { .. }), "{error}");
    assert!(error.to_string().contains(PEER), "{error}");
    assert!(emulator.approvals().is_empty(), "nothing was sent");

    let scope = ApprovalScope::SharedWithThisVm(VM.to_ascii_uppercase());
    assert_eq!(approve(&client, &id, &scope).await, Approval::Approved);
    assert_eq!(emulator.approvals().len(), 1);
}

#[tokio::test]
async fn a_configured_name_is_checked_against_instance_metadata() {
    let emulator = emulator().await;
    let config = WatcherConfig {
        vm_name: Some("spotvmss_9".to_owned()),
        ..watcher_config()
    };
    let running = Watcher::new(client(&emulator.url()), config).spawn();
    let health = health_until(&running, "instance metadata", |h| {
        h.metadata_vm_name.is_some()
    })
    .await;
    assert_eq!(health.vm_name_mismatch(), Some(("spotvmss_9", VM)));
}

#[tokio::test]
async fn approval_refuses_other_vms_events_unless_told() {
    let emulator = emulator().await;
    let client = client(&emulator.url());
    let id = scheduled(&emulator, EventSpec::preempt().resources([PEER]));

    let error = refused(&client, &id, &ApprovalScope::ThisVm(VM.into())).await;
    assert!(matches!(error, ImdsError::NotThisVm { .. }), "{error}");
    assert!(emulator.approvals().is_empty(), "nothing was sent");

    let approval = client.approve(&id, &ApprovalScope::AnyVm).await.unwrap();
    assert_eq!(approval, Approval::Approved);
}

#[tokio::test]
async fn approval_of_an_unknown_event_is_a_clear_error() {
    let emulator = emulator().await;
    let client = client(&emulator.url());
    let error = refused(&client, &EventId("NOPE".into()), &ApprovalScope::AnyVm).await;
    assert_eq!(
        error.to_string(),
        "event NOPE is not in the current Scheduled Events document"
    );
}

#[tokio::test]
async fn a_burst_of_calls_stays_under_the_imds_rate_limit() {
    let emulator = emulator().await;
    let client = std::sync::Arc::new(client(&emulator.url()));
    let calls: Vec<_> = (0..12)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.scheduled_events().await })
        })
        .collect();
    for call in calls {
        within("a paced call", call)
            .await
            .unwrap()
            .expect("not throttled");
    }
    let stats = emulator.stats();
    assert_eq!(stats.throttled, 0);
    assert_eq!(stats.scheduledevents_gets, 12);
}

#[tokio::test]
async fn throttled_calls_are_retried() {
    // Another process on the VM has used up the budget: IMDS allows one
    // request per second here, and this client makes three in a row.
    let emulator = emulator().await;
    emulator.set_rate_limit(Some(1));
    let client = client(&emulator.url());
    for _ in 0..3 {
        within("a retried call", client.scheduled_events())
            .await
            .expect("retried past the throttling");
    }
    assert!(emulator.stats().throttled >= 1);
}

#[tokio::test]
async fn the_emulator_rejects_calls_without_the_metadata_header() {
    // The client always sends it; this pins the emulator's side of the
    // contract the client relies on.
    let emulator = emulator().await;
    let response = reqwest_get(&format!(
        "{}/metadata/scheduledevents?api-version=2020-07-01",
        emulator.url()
    ))
    .await;
    assert_eq!(response.0, 400);
    assert!(
        response
            .1
            .contains("Required metadata header not specified")
    );
}

async fn reqwest_get(url: &str) -> (u16, String) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Schedules `spec` on `emulator` and returns the new event's id.
fn scheduled(emulator: &RunningEmulator, spec: EventSpec) -> EventId {
    let event = emulator.schedule(spec).expect("a valid event");
    EventId(event.id)
}

/// Approves `id` for `scope`, expecting an answer.
async fn approve(client: &ImdsClient, id: &EventId, scope: &ApprovalScope) -> Approval {
    client
        .approve(id, scope)
        .await
        .unwrap_or_else(|e| panic!("approving {id:?} for {scope:?}: {e}"))
}

/// The error approving `id` for `scope` is refused with.
async fn refused(client: &ImdsClient, id: &EventId, scope: &ApprovalScope) -> ImdsError {
    match client.approve(id, scope).await {
        Ok(approval) => panic!("approving {id:?} for {scope:?} was {approval:?}, not refused"),
        Err(error) => error,
    }
}
