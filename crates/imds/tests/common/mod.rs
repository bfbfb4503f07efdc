//! Shared set-up for the integration tests: an emulator on loopback, a client
//! with test-sized timeouts, and bounded waits (never bare sleeps).

#![allow(dead_code)] // Each test binary uses its own subset.

use std::future::Future;
use std::time::Duration;

use spot_worker_imds::{
    ImdsClient, ImdsConfig, NoticePolicy, NoticeSignal, RunningWatcher, Transition, Watcher,
    WatcherConfig, WatcherHealth,
};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use tokio::sync::broadcast;

/// The VM the emulator pretends to be.
pub const VM: &str = "spotvmss_0";
/// Another instance of the same scale set.
pub const PEER: &str = "spotvmss_1";
/// The most any single wait may take: generous, so that a slow machine
/// fails no test, but bounded, so that a bug cannot hang the suite.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub async fn emulator() -> RunningEmulator {
    emulator_with(EmulatorConfig::for_vm(VM)).await
}

pub async fn emulator_with(config: EmulatorConfig) -> RunningEmulator {
    Emulator::start(config)
        .await
        .expect("the emulator binds a loopback port")
}

pub fn client_config(url: &str) -> ImdsConfig {
    ImdsConfig {
        request_timeout: Duration::from_secs(2),
        first_call_timeout: Duration::from_secs(5),
        ..ImdsConfig::default().with_endpoint(url)
    }
}

pub fn client(url: &str) -> ImdsClient {
    ImdsClient::new(client_config(url)).expect("a valid endpoint")
}

/// Polls as fast as IMDS allows (retrying as quickly), knows its name.
pub fn watcher_config() -> WatcherConfig {
    WatcherConfig {
        poll_interval: Duration::from_millis(200),
        vm_name: Some(VM.to_owned()),
        ..WatcherConfig::default()
    }
}

/// Awaits `future`, failing the test after [`PATIENCE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {PATIENCE:?} waiting for {what}"),
    }
}

/// Waits until the watcher's health satisfies `done`.
pub async fn health_until(
    running: &RunningWatcher,
    what: &str,
    done: impl FnMut(&WatcherHealth) -> bool,
) -> WatcherHealth {
    let mut health = running.health();
    within(what, health.wait_for(done))
        .await
        .expect("the watcher is running")
        .clone()
}

/// Asks for a poll and waits until the watcher has seen incarnation
/// `target`; the transitions of that document are then in every
/// subscriber's channel.
/// A watcher of `emulator` (as [`watcher_config`] has it) with the default
/// notice policy's signal, running and caught up with the emulator.
pub async fn watching(emulator: &RunningEmulator) -> (RunningWatcher, NoticeSignal) {
    let mut watcher = Watcher::new(client(&emulator.url()), watcher_config());
    let shutdown = watcher.notice_signal(NoticePolicy::default());
    let running = watcher.spawn();
    caught_up(&running, emulator.incarnation()).await;
    (running, shutdown)
}

pub async fn caught_up(running: &RunningWatcher, target: u64) {
    running.refresh();
    health_until(running, "the watcher to catch up", |h| {
        h.incarnation.is_some_and(|i| i >= target)
    })
    .await;
}

/// Everything already received.
pub fn drain(transitions: &mut broadcast::Receiver<Transition>) -> Vec<Transition> {
    let mut seen = Vec::new();
    while let Ok(t) = transitions.try_recv() {
        seen.push(t);
    }
    seen
}
