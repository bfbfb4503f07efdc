//! Every built-in scenario, applied step by step without waiting, ends in
//! the expected document.

use serde_json::{Value, json};
use spot_worker_imds_emulator::{Action, Emulator, EmulatorConfig, Scenario};

/// Applies `name` step by step; returns the document after every step.
fn walk(name: &str) -> (Emulator, Vec<Value>) {
    let config = EmulatorConfig::default();
    let emulator = Emulator::new(config.clone());
    let scenario = Scenario::builtin(name, &config).expect("built in");
    let documents = scenario
        .steps
        .iter()
        .map(|step| {
            emulator.apply(&step.action).expect("applies");
            emulator.document()
        })
        .collect();
    (emulator, documents)
}

fn empty(incarnation: u64) -> Value {
    json!({"DocumentIncarnation": incarnation, "Events": []})
}

#[test]
fn spot_eviction() {
    let (emulator, documents) = walk("spot-eviction");
    let scheduled = &documents[0]["Events"][0];
    assert_eq!(scheduled["EventType"], "Preempt");
    assert_eq!(scheduled["EventStatus"], "Scheduled");
    let last = &documents[1];
    assert_eq!(last["DocumentIncarnation"], 3);
    assert_eq!(last["Events"][0]["EventId"], scheduled["EventId"]);
    assert_eq!(last["Events"][0]["EventStatus"], "Started");
    assert_eq!(last["Events"][0]["Resources"], json!(["spotvmss_0"]));
    assert_eq!(
        emulator.event_id("evict").as_deref(),
        scheduled["EventId"].as_str()
    );
}

#[test]
fn scale_in_terminate() {
    let (_, documents) = walk("scale-in-terminate");
    assert_eq!(documents[0]["Events"][0]["EventType"], "Terminate");
    assert_eq!(documents[1]["Events"][0]["EventStatus"], "Started");
    assert_eq!(documents[1]["DocumentIncarnation"], 3);
}

#[test]
fn scale_in_terminate_with_longer_notice() {
    let config = EmulatorConfig::default();
    let scenario = Scenario::builtin("scale-in-terminate", &config)
        .expect("built in")
        .with_notice(std::time::Duration::from_secs(600));
    let emulator = Emulator::new(config);
    emulator.apply(&scenario.steps[0].action).expect("applies");
    let not_before = emulator.document()["Events"][0]["NotBefore"]
        .as_str()
        .map(str::to_owned);
    let not_before = httpdate::parse_http_date(&not_before.expect("a date")).expect("RFC 1123");
    let notice = not_before
        .duration_since(std::time::SystemTime::now())
        .expect("in the future");
    assert!(
        notice.as_secs() >= 598 && notice.as_secs() <= 601,
        "{notice:?}"
    );
}

#[test]
fn live_migration_freeze() {
    let (_, documents) = walk("live-migration-freeze");
    let event = &documents[0]["Events"][0];
    assert_eq!(event["EventType"], "Freeze");
    assert_eq!(event["DurationInSeconds"], 5);
    assert_eq!(
        event["Description"],
        "Virtual machine is being paused because of a memory-preserving Live Migration operation."
    );
    assert_eq!(documents[1]["Events"][0]["EventStatus"], "Started");
    assert_eq!(documents[2], empty(4));
}

#[test]
fn user_reboot() {
    let (_, documents) = walk("user-reboot");
    assert_eq!(documents[0]["Events"][0]["EventType"], "Reboot");
    assert_eq!(documents[0]["Events"][0]["EventSource"], "User");
    assert_eq!(documents[2], empty(4));
}

#[test]
fn redeploy() {
    let (_, documents) = walk("redeploy");
    assert_eq!(documents[0]["Events"][0]["EventType"], "Redeploy");
    assert_eq!(documents[1]["Events"][0]["EventStatus"], "Started");
    assert_eq!(documents[2], empty(4));
}

#[test]
fn cancelled_maintenance() {
    let (_, documents) = walk("cancelled-maintenance");
    assert_eq!(documents[0]["Events"][0]["EventStatus"], "Scheduled");
    assert_eq!(documents[1], empty(3));
}

#[test]
fn hardware_failure() {
    let (_, documents) = walk("hardware-failure");
    let event = &documents[0]["Events"][0];
    assert_eq!(event["EventType"], "Reboot");
    assert_eq!(event["EventStatus"], "Started");
    assert_eq!(event["NotBefore"], "");
    assert_eq!(documents[0]["DocumentIncarnation"], 2);
    assert_eq!(documents[1], empty(3));
}

#[test]
fn two_vms_one_event() {
    let (_, documents) = walk("two-vms-one-event");
    assert_eq!(
        documents[0]["Events"][0]["Resources"],
        json!(["spotvmss_0", "spotvmss_1"])
    );
    assert_eq!(documents[1]["Events"][0]["EventStatus"], "Started");
    assert_eq!(documents[2], empty(4));
}

#[test]
fn other_vm_preempt() {
    let (_, documents) = walk("other-vm-preempt");
    let event = &documents[1]["Events"][0];
    assert_eq!(event["EventType"], "Preempt");
    assert_eq!(event["Resources"], json!(["spotvmss_1"]));
    assert_eq!(event["EventStatus"], "Started");
}

#[test]
fn apply_scenario_and_unknown_keys() {
    let config = EmulatorConfig::default();
    let emulator = Emulator::new(config.clone());
    for scenario in Scenario::builtins(&config) {
        emulator.apply_scenario(&scenario).expect("applies");
    }
    // Preempt (this VM), Terminate, Preempt (other VM) never complete.
    let events = emulator.document()["Events"].as_array().map(Vec::len);
    assert_eq!(events, Some(3));
    emulator.reset();
    assert!(emulator.apply(&Action::start("evict")).is_err());
}
