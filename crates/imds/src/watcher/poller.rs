//! The polling loop behind a running [`Watcher`](super::Watcher): fetch,
//! diff, tell, repeat until stopped; name this VM from instance metadata;
//! report failures through [`WatcherHealth`] and retry after a jittered
//! delay never longer than the poll interval.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::ImdsClient;
use crate::error::ImdsError;
use crate::model::{EventId, ScheduledEvent, ScheduledEvents};
use crate::policy::NoticeTrigger;
use crate::retry::{metadata_retry_polls, retry_delay};
use crate::transition::{Transition, diff};

use super::{WatcherConfig, WatcherHealth};

/// The state of the polling loop.
pub(super) struct Poller {
    pub(super) client: Arc<ImdsClient>,
    pub(super) config: WatcherConfig,
    pub(super) triggers: Vec<NoticeTrigger>,
    pub(super) transitions: broadcast::Sender<Transition>,
    pub(super) health: watch::Sender<WatcherHealth>,
    pub(super) document: watch::Sender<Option<Arc<ScheduledEvents>>>,
    pub(super) refresh: Arc<Notify>,
    pub(super) stop: CancellationToken,
    /// Events without `Resources` already warned about.
    pub(super) unaddressed_reported: HashSet<EventId>,
}

impl Poller {
    pub(super) async fn run(mut self) {
        let mut vm_name = self.config.vm_name.clone();
        let mut identified = false;
        let mut previous: Option<Arc<ScheduledEvents>> = None;
        let mut failures = 0u32;
        // Failed instance metadata lookups in a row, and the poll attempts
        // left before the next one.
        let mut lookup_failures = 0u32;
        let mut polls_to_lookup = 0u32;
        loop {
            let started = Instant::now();
            // Polling starts at once, name or not: the first call is the one
            // that enables Scheduled Events, and an eviction must not wait
            // for instance metadata to recover.
            if !identified && polls_to_lookup == 0 {
                match self.until_stopped(self.client.vm_name()).await {
                    None => return,
                    Some(Ok(name)) => {
                        identified = true;
                        if lookup_failures > 0 {
                            tracing::info!(
                                failed_lookups = lookup_failures,
                                "instance metadata answered"
                            );
                        }
                        vm_name = Some(self.identified(name, vm_name.take()));
                    }
                    Some(Err(error)) => {
                        lookup_failures = lookup_failures.saturating_add(1);
                        polls_to_lookup = metadata_retry_polls(lookup_failures);
                        self.report_lookup_failure(
                            &error,
                            lookup_failures,
                            polls_to_lookup,
                            vm_name.as_deref(),
                        );
                    }
                }
            } else {
                polls_to_lookup = polls_to_lookup.saturating_sub(1);
            }
            let next = match self.until_stopped(self.client.scheduled_events()).await {
                None => return,
                Some(Ok(document)) => {
                    failures = 0;
                    previous = Some(self.accept(document, previous, vm_name.as_deref()));
                    started + self.config.poll_interval
                }
                Some(Err(error)) => {
                    failures = failures.saturating_add(1);
                    let delay = retry_delay(self.config.poll_interval, rand::rng().random());
                    self.report_failure("Scheduled Events", &error, failures, delay);
                    Instant::now() + delay
                }
            };
            if !self.wait_until(next).await {
                return;
            }
        }
    }

    /// Runs `call` unless the watcher is stopped first (then `None`), so that
    /// stopping never waits for a slow request.
    async fn until_stopped<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            () = self.stop.cancelled() => None,
            result = call => Some(result),
        }
    }

    /// Records the name instance metadata gave; returns the name to match
    /// events with: the configured one if any (a mismatch is reported, for
    /// the application to refuse), else this one.
    fn identified(&self, metadata: String, configured: Option<String>) -> String {
        let name = match configured {
            Some(configured) if !configured.eq_ignore_ascii_case(&metadata) => {
                tracing::error!(
                    configured = %configured,
                    instance_metadata = %metadata,
                    "the configured VM name is not the one instance metadata gives"
                );
                configured
            }
            Some(configured) => configured,
            None => {
                tracing::info!(vm_name = %metadata, "identified this VM from instance metadata");
                metadata.clone()
            }
        };
        self.health.send_modify(|h| {
            h.vm_name = Some(name.clone());
            h.metadata_vm_name = Some(metadata);
        });
        name
    }

    /// Records a document and hands its transitions to the triggers first
    /// (the latency-critical path), then to subscribers, and publishes the
    /// document and health last: whoever sees the new incarnation in
    /// [`WatcherHealth`] can rely on its transitions having been sent.
    fn accept(
        &mut self,
        document: ScheduledEvents,
        previous: Option<Arc<ScheduledEvents>>,
        vm_name: Option<&str>,
    ) -> Arc<ScheduledEvents> {
        let incarnation = document.incarnation;
        let document = match previous {
            // Nothing changed. The events are compared too, not just the
            // incarnation: a restarted IMDS (or emulator) may count again.
            Some(previous) if *previous == document => previous,
            previous => {
                for event in newly_unaddressed(&document, &mut self.unaddressed_reported) {
                    tracing::warn!(
                        event_id = %event.id,
                        event_type = %event.event_type,
                        event_status = %event.status,
                        "scheduled event lists no Resources: Azure names the affected VMs there, \
                         so it concerns no VM we can identify; not draining for it, never approving it"
                    );
                }
                let before: &[ScheduledEvent] = previous.as_deref().map_or(&[], |d| &d.events);
                let now = Instant::now();
                let changes = diff(before, &document, vm_name, SystemTime::now());
                if vm_name.is_none() && !changes.is_empty() {
                    tracing::warn!(
                        "this VM's name is not known yet; treating every event as concerning it"
                    );
                }
                for transition in &changes {
                    for trigger in &mut self.triggers {
                        trigger.observe(transition, now);
                    }
                }
                for transition in changes {
                    log_transition(&transition);
                    // No subscribers is fine: the triggers already saw it.
                    let _ = self.transitions.send(transition);
                }
                let document = Arc::new(document);
                self.document.send_replace(Some(document.clone()));
                document
            }
        };
        self.health.send_modify(|h| {
            h.last_success = Some(Instant::now());
            h.incarnation = Some(incarnation);
            h.polls += 1;
            h.consecutive_failures = 0;
        });
        document
    }

    /// Records a failed instance metadata lookup in the health and says so
    /// once (the first failure in a row, at warn; the rest at debug): a
    /// server without `/metadata/instance` must not fill the log.
    fn report_lookup_failure(
        &self,
        error: &ImdsError,
        failures: u32,
        retry_after_polls: u32,
        configured: Option<&str>,
    ) {
        let error = error.chain();
        if failures == 1 {
            match configured {
                Some(vm_name) => tracing::warn!(
                    %error,
                    %vm_name,
                    retry_after_polls,
                    "instance metadata cannot be read, so the configured VM name is not checked \
                     against it yet; using it as configured and trying again with backoff \
                     (not logged again until it answers)"
                ),
                None => tracing::warn!(
                    %error,
                    retry_after_polls,
                    "instance metadata cannot be read, so this VM's name is not known: every \
                     event is taken to concern this VM; trying again with backoff (not logged \
                     again until it answers)"
                ),
            }
        } else {
            tracing::debug!(%error, failures, retry_after_polls, "instance metadata still cannot be read");
        }
        self.health.send_modify(|h| {
            h.consecutive_failures = h.consecutive_failures.max(1);
            h.failures += 1;
            h.last_error = Some(format!("instance metadata: {error}"));
        });
    }

    fn report_failure(&self, what: &str, error: &ImdsError, failures: u32, retry_in: Duration) {
        let error = error.chain();
        tracing::warn!(
            %error,
            consecutive_failures = failures,
            retry_in_ms = retry_in.as_millis() as u64,
            "reading {what} from IMDS failed; retrying"
        );
        self.health.send_modify(|h| {
            h.consecutive_failures = h.consecutive_failures.max(failures);
            h.failures += 1;
            h.last_error = Some(format!("{what}: {error}"));
        });
    }

    /// Sleeps until `at`, or less if a refresh is asked for. `false` when the
    /// watcher was stopped.
    async fn wait_until(&self, at: Instant) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep_until(at) => true,
            () = self.refresh.notified() => true,
        }
    }
}

/// The events of `document` whose `Resources` is empty and that were not
/// reported yet (remembered in `reported`), so each is logged once.
///
/// Scheduled Events are broadcast to every VM of an availability set or
/// placement group, and `Resources` is how a VM learns which of them are
/// affected. An event naming none affects no VM we can identify: it never
/// drains this worker nor is it approved, but an operator should know.
fn newly_unaddressed<'a>(
    document: &'a ScheduledEvents,
    reported: &mut HashSet<EventId>,
) -> Vec<&'a ScheduledEvent> {
    document
        .events
        .iter()
        .filter(|event| event.resources.is_empty() && reported.insert(event.id.clone()))
        .collect()
}

fn log_transition(t: &Transition) {
    tracing::info!(
        transition = t.kind.as_str(),
        event_id = %t.event.id,
        event_type = %t.event.event_type,
        event_status = %t.event.status,
        concerns_this_vm = t.concerns_this_vm,
        incarnation = t.incarnation,
        "scheduled event"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_without_resources_is_reported_once() {
        let document = |events: &[(&str, &[&str])]| -> ScheduledEvents {
            let events: Vec<serde_json::Value> = events
                .iter()
                .map(|(id, resources)| {
                    serde_json::json!({"EventId": id, "EventType": "Reboot",
                        "EventStatus": "Scheduled", "Resources": resources})
                })
                .collect();
            serde_json::from_value(serde_json::json!({"DocumentIncarnation": 1, "Events": events}))
                .unwrap()
        };
        let mut reported = HashSet::new();
        let ids = |events: Vec<&ScheduledEvent>| -> Vec<String> {
            events.iter().map(|e| e.id.as_str().to_owned()).collect()
        };
        // (document, reported now)
        let table: [(ScheduledEvents, &[&str]); 4] = [
            (document(&[("A", &[]), ("B", &["vm_0"])]), &["A"]),
            (document(&[("A", &[]), ("B", &["vm_0"])]), &[]),
            (document(&[("A", &[]), ("C", &[])]), &["C"]),
            (document(&[("B", &[])]), &["B"]),
        ];
        for (document, expected) in table {
            assert_eq!(ids(newly_unaddressed(&document, &mut reported)), expected);
        }
    }
}
