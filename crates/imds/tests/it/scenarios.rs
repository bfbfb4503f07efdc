//! Every built-in emulator scenario, driven step by step through the real
//! HTTP path, checked against the transitions the watcher reports and the
//! shutdown signal the default policy derives from them.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use spot_worker_imds::{
    EventSource, EventStatus, EventType, NoticePolicy, NoticeSignal, Transition, TransitionKind,
    Watcher,
};
use spot_worker_imds_emulator::{EmulatorConfig, Scenario};
use tokio::time::Instant;

use TransitionKind::{Cancelled, Completed, Scheduled, Started};

/// What one scenario must produce.
struct Expected {
    kinds: &'static [TransitionKind],
    concerns_this_vm: bool,
    drains: bool,
}

impl Expected {
    /// An event of this VM that drains it.
    const fn drains(kinds: &'static [TransitionKind]) -> Self {
        Expected {
            kinds,
            concerns_this_vm: true,
            drains: true,
        }
    }

    /// An event of this VM the default policy lets it work through.
    const fn works_through(kinds: &'static [TransitionKind]) -> Self {
        Expected {
            kinds,
            concerns_this_vm: true,
            drains: false,
        }
    }

    /// Another VM's event: seen, not acted on.
    const fn elsewhere(kinds: &'static [TransitionKind]) -> Self {
        Expected {
            kinds,
            concerns_this_vm: false,
            drains: false,
        }
    }
}

/// Plays `name` one step at a time and returns every transition seen and the
/// shutdown signal of the default policy.
async fn play(name: &str) -> (Vec<Transition>, NoticeSignal) {
    let config = EmulatorConfig::for_vm(VM);
    let scenario = Scenario::builtin(name, &config).expect("a built-in scenario");
    let emulator = emulator_with(config).await;
    let mut watcher = Watcher::new(client(&emulator.url()), watcher_config());
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let mut transitions = watcher.subscribe();
    let running = watcher.spawn();
    caught_up(&running, emulator.incarnation()).await;

    let mut seen = Vec::new();
    for step in &scenario.steps {
        emulator
            .apply(&step.action)
            .unwrap_or_else(|e| panic!("{name}: step {:?}: {e}", step.action));
        caught_up(&running, emulator.incarnation()).await;
        seen.extend(drain(&mut transitions));
    }
    running.stop().await;
    (seen, shutdown)
}

async fn check(name: &str, expected: Expected) -> (Vec<Transition>, NoticeSignal) {
    let (seen, shutdown) = play(name).await;
    let kinds: Vec<_> = seen.iter().map(|t| t.kind).collect();
    assert_eq!(kinds, expected.kinds, "{name}: transitions");
    let first_id = &seen[0].event.id;
    for t in &seen {
        assert_eq!(&t.event.id, first_id, "{name}: one EventId throughout");
        assert_eq!(
            t.concerns_this_vm, expected.concerns_this_vm,
            "{name}: concerns_this_vm"
        );
    }
    assert_eq!(
        shutdown.token().is_cancelled(),
        expected.drains,
        "{name}: shutdown triggered"
    );
    (seen, shutdown)
}

#[tokio::test]
async fn spot_eviction_drains_with_the_30_second_deadline() {
    let (seen, shutdown) = check("spot-eviction", Expected::drains(&[Scheduled, Started])).await;
    let scheduled = &seen[0].event;
    assert_eq!(scheduled.event_type, EventType::Preempt);
    assert_eq!(seen[1].previous_status, Some(EventStatus::Scheduled));
    let not_before = scheduled
        .not_before
        .instant()
        .expect("NotBefore while scheduled");
    let notice = SystemTime::from(not_before)
        .duration_since(seen[0].observed_at)
        .expect("NotBefore is in the future");
    assert!(
        notice > Duration::from_secs(20) && notice <= Duration::from_secs(31),
        "notice {notice:?}"
    );
    // Once started, the deadline is the moment the start was seen.
    let notice = shutdown.notice().expect("a notice");
    assert_eq!(notice.status, EventStatus::Started);
    assert!(notice.deadline <= Instant::now());
}

#[tokio::test]
async fn scale_in_terminate_drains() {
    let (seen, _) = check(
        "scale-in-terminate",
        Expected::drains(&[Scheduled, Started]),
    )
    .await;
    assert_eq!(seen[0].event.event_type, EventType::Terminate);
}

#[tokio::test]
async fn short_live_migration_freeze_does_not_drain() {
    let (seen, shutdown) = check(
        "live-migration-freeze",
        Expected::works_through(&[Scheduled, Started, Completed]),
    )
    .await;
    assert_eq!(seen[0].event.event_type, EventType::Freeze);
    assert_eq!(seen[0].event.duration(), Some(Duration::from_secs(5)));
    assert!(shutdown.notice().is_none());
}

#[tokio::test]
async fn user_reboot_drains_and_names_its_source() {
    let (seen, _) = check(
        "user-reboot",
        Expected::drains(&[Scheduled, Started, Completed]),
    )
    .await;
    assert_eq!(seen[0].event.event_type, EventType::Reboot);
    assert_eq!(seen[0].event.source, Some(EventSource::User));
}

#[tokio::test]
async fn redeploy_drains() {
    let (seen, _) = check(
        "redeploy",
        Expected::drains(&[Scheduled, Started, Completed]),
    )
    .await;
    assert_eq!(seen[0].event.event_type, EventType::Redeploy);
}

#[tokio::test]
async fn cancelled_maintenance_is_observed_as_a_withdrawn_notice() {
    let (_, shutdown) = check(
        "cancelled-maintenance",
        Expected::drains(&[Scheduled, Cancelled]),
    )
    .await;
    assert!(shutdown.notice().expect("a notice").withdrawn);
}

#[tokio::test]
async fn hardware_failure_appears_started_and_drains_at_once() {
    let (seen, shutdown) = check("hardware-failure", Expected::drains(&[Started, Completed])).await;
    assert_eq!(seen[0].previous_status, None, "never announced");
    assert!(seen[0].event.not_before.instant().is_none());
    assert!(shutdown.deadline().expect("a deadline") <= Instant::now());
}

#[tokio::test]
async fn an_event_for_two_vms_concerns_each_of_them() {
    let (seen, _) = check(
        "two-vms-one-event",
        Expected::works_through(&[Scheduled, Started, Completed]),
    )
    .await;
    assert_eq!(seen[0].event.resources, [VM, PEER]);
}

#[tokio::test]
async fn another_vms_eviction_is_seen_but_not_acted_on() {
    let (seen, shutdown) = check(
        "other-vm-preempt",
        Expected::elsewhere(&[Scheduled, Started]),
    )
    .await;
    assert_eq!(seen[0].event.resources, [PEER]);
    assert!(shutdown.notice().is_none());
}

#[test]
fn every_builtin_scenario_is_covered_here() {
    let covered = [
        "spot-eviction",
        "scale-in-terminate",
        "live-migration-freeze",
        "user-reboot",
        "redeploy",
        "cancelled-maintenance",
        "hardware-failure",
        "two-vms-one-event",
        "other-vm-preempt",
    ];
    let mut builtin = Scenario::BUILTIN.to_vec();
    builtin.sort_unstable();
    let mut covered = covered.to_vec();
    covered.sort_unstable();
    assert_eq!(builtin, covered);
}
