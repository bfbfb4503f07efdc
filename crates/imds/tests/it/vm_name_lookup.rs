//! A configured VM name against a server without instance metadata (like
//! Azure-Samples/scheduled-events-mock-server, whose `/metadata/instance`
//! is an HTML 404 page): the watcher says so once, in one bounded line,
//! asks again with backoff instead of at every poll, and checks the name
//! once instance metadata answers.
//!
//! Counts, not clocks: the lookups are compared with the polls that
//! happened, so a slow machine changes neither.
//!
//! It captures the log of a current-thread runtime through a subscriber
//! scoped to that thread, so it shares the crate's test binary.

use crate::common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use spot_worker_imds::{Watcher, WatcherConfig, metadata_retry_polls};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many instance metadata lookups `iterations` poll attempts make when
/// every lookup fails.
fn lookups_in(iterations: u64) -> u64 {
    let (mut lookups, mut polls_to_lookup) = (0, 0);
    for _ in 0..iterations {
        if polls_to_lookup == 0 {
            lookups += 1;
            polls_to_lookup = metadata_retry_polls(u32::try_from(lookups).unwrap());
        } else {
            polls_to_lookup -= 1;
        }
    }
    lookups
}

// Current-thread: the watcher's task runs on this thread, where the
// capturing subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn a_missing_instance_endpoint_is_reported_once_and_asked_with_backoff() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let emulator = emulator().await;
    emulator.set_instance_metadata_missing(true);
    let config = WatcherConfig {
        poll_interval: Duration::from_millis(250),
        vm_name: Some(VM.to_owned()),
        ..WatcherConfig::default()
    };
    let running = Watcher::new(client(&emulator.url()), config).spawn();
    const POLLS: u64 = 20;
    let health = health_until(&running, "20 polls", |h| h.polls >= POLLS).await;
    let stats = emulator.stats();
    let (lookups, polls) = (stats.instance_gets, stats.scheduledevents_gets);
    // The stats may be read between an attempt's lookup and its poll.
    assert!(
        lookups == lookups_in(polls) || lookups == lookups_in(polls + 1),
        "{lookups} lookups in {polls} polls"
    );
    assert!(lookups <= 6 && lookups * 3 < polls, "{lookups} in {polls}");
    assert_eq!(health.vm_name.as_deref(), Some(VM), "used as configured");
    assert_eq!(health.metadata_vm_name, None);
    assert!(
        health
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("404")),
        "{health:?}"
    );

    let lines = captured.lines();
    let warnings: Vec<_> = lines.iter().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "said once: {lines:#?}");
    let warning = warnings[0];
    assert!(
        warning.contains("instance metadata cannot be read") && warning.contains("404"),
        "{warning}"
    );
    // The HTML page is one line, bounded, inside the one log line.
    assert!(warning.contains("<h1>Not Found</h1>"), "{warning}");
    assert!(warning.len() < 700, "{} chars: {warning}", warning.len());
    assert!(
        !lines.iter().any(|l| l.trim_start().starts_with("<")),
        "no line of the page on its own: {lines:#?}"
    );

    // When instance metadata answers, the configured name is checked.
    emulator.set_instance_metadata_missing(false);
    let health = health_until(&running, "instance metadata", |h| {
        h.metadata_vm_name.is_some()
    })
    .await;
    assert_eq!(health.metadata_vm_name.as_deref(), Some(VM));
    assert_eq!(health.vm_name_mismatch(), None);
    let checked_at = emulator.stats().instance_gets;
    // Once: more polls ask no more.
    let after = health.polls + 4;
    health_until(&running, "four more polls", |h| h.polls >= after).await;
    assert_eq!(emulator.stats().instance_gets, checked_at);
    running.stop().await;
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("instance metadata answered")),
        "{lines:#?}"
    );
    assert_eq!(lines.iter().filter(|l| l.contains(" WARN ")).count(), 1);
}
