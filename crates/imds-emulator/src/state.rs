//! The emulated service's state and its transitions.
//!
//! Everything here is synchronous and takes the current wall-clock time as a
//! parameter: time-driven transitions (auto-start at `NotBefore`, removal
//! after completion) are applied lazily by [`State::advance`] before every
//! answer, which keeps the emulator free of background timers and makes its
//! behaviour deterministic.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::config::EmulatorConfig;
use crate::error::EmulatorError;
use crate::event::{self, EmulatedSource, EmulatedStatus, EventSpec, WireDocument, WireEvent};
use crate::fault::FaultQueue;
use crate::token::IssuedToken;

/// The first api-version that shows `Terminate` events.
const TERMINATE_SINCE: &str = "2019-01-01";
/// The first api-version with `EventSource` and `DurationInSeconds`.
const SOURCE_AND_DURATION_SINCE: &str = "2019-08-01";

/// Counters of the requests the IMDS endpoints received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// `GET /metadata/scheduledevents` requests that were not throttled.
    pub scheduledevents_gets: u64,
    /// `POST /metadata/scheduledevents` requests that were not throttled.
    pub posts: u64,
    /// `GET /metadata/instance` requests that were not throttled.
    pub instance_gets: u64,
    /// Requests answered 429 by the rate limit.
    pub throttled: u64,
    /// Requests answered 400.
    pub bad_requests: u64,
    /// Requests answered with an injected fault.
    pub faults_served: u64,
    /// `GET /metadata/identity/oauth2/token` requests (answered or refused).
    pub token_gets: u64,
}

/// One approved event id from a `StartRequests` POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedApproval {
    /// The event id as the client sent it.
    pub event_id: String,
    /// When the approval arrived.
    pub at: SystemTime,
    /// Whether it started the event (`false`: it had already started).
    pub changed: bool,
}

impl RecordedApproval {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "event_id": self.event_id,
            "at": httpdate::fmt_http_date(self.at),
            "at_unix_ms": self
                .at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            "changed": self.changed,
        })
    }
}

/// An event in the events array.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub id: String,
    pub event_type: String,
    pub resources: Vec<String>,
    pub status: EmulatedStatus,
    /// `None` once started (the wire shows "").
    pub not_before: Option<SystemTime>,
    pub started_at: Option<SystemTime>,
    pub description: String,
    pub source: EmulatedSource,
    pub duration_secs: i64,
    pub complete_after: Option<Duration>,
    /// When the event entered the array (for latency measurements).
    pub visible_at: Instant,
}

impl Event {
    fn completes_at(&self) -> Option<SystemTime> {
        self.started_at?.checked_add(self.complete_after?)
    }

    /// Older api-versions do not know about `Terminate` events.
    fn visible_to(&self, api_version: &str) -> bool {
        self.event_type != "Terminate" || api_version >= TERMINATE_SINCE
    }

    pub(crate) fn wire(&self, api_version: &str) -> WireEvent<'_> {
        let extended = api_version >= SOURCE_AND_DURATION_SINCE;
        WireEvent {
            event_id: &self.id,
            event_type: &self.event_type,
            resource_type: "VirtualMachine",
            resources: &self.resources,
            event_status: self.status,
            not_before: self
                .not_before
                .map(httpdate::fmt_http_date)
                .unwrap_or_default(),
            description: &self.description,
            event_source: extended.then_some(self.source),
            duration_in_seconds: extended.then_some(self.duration_secs),
        }
    }

    fn start(&mut self, at: SystemTime) {
        self.status = EmulatedStatus::Started;
        self.not_before = None;
        self.started_at = Some(at);
    }
}

/// The whole mutable state of one emulator.
#[derive(Debug)]
pub(crate) struct State {
    pub config: EmulatorConfig,
    pub vm_id: String,
    incarnation: u64,
    events: Vec<Event>,
    pub approvals: Vec<RecordedApproval>,
    pub stats: Stats,
    pub faults: FaultQueue,
    /// Tokens the identity endpoint issued, oldest first.
    pub tokens: Vec<IssuedToken>,
    /// Arrival times of the IMDS requests admitted in the last second.
    rate_window: VecDeque<Instant>,
    /// The first Scheduled Events GET has not been answered yet.
    pub first_get_pending: bool,
    /// Scenario keys to event ids.
    keys: HashMap<String, String>,
    /// `/metadata/instance` answers 404 with an HTML page, as a stand-in
    /// for IMDS that only serves Scheduled Events does.
    pub instance_missing: bool,
}

impl State {
    pub(crate) fn new(config: EmulatorConfig) -> Self {
        Self {
            config,
            vm_id: uuid::Uuid::new_v4().to_string(),
            // The real service starts at 1 with no events.
            incarnation: 1,
            events: Vec::new(),
            approvals: Vec::new(),
            stats: Stats::default(),
            faults: FaultQueue::default(),
            tokens: Vec::new(),
            rate_window: VecDeque::new(),
            first_get_pending: true,
            keys: HashMap::new(),
            instance_missing: false,
        }
    }

    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Counts one change of the events array.
    fn changed(&mut self) {
        self.incarnation += 1;
    }

    fn position(&self, id: &str) -> Result<usize, EmulatorError> {
        // Event ids are UUIDs; clients may well change their case.
        self.events
            .iter()
            .position(|e| e.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| EmulatorError::UnknownEvent(id.to_owned()))
    }

    pub(crate) fn event(&self, id: &str) -> Option<&Event> {
        self.position(id).ok().map(|i| &self.events[i])
    }

    /// Applies every time-driven transition due at `now`, in time order per
    /// event: a scheduled event starts at its `NotBefore` and a started one
    /// is removed when its completion time has come.
    pub(crate) fn advance(&mut self, now: SystemTime) {
        let mut changes = 0;
        for event in &mut self.events {
            if let Some(not_before) = event.not_before
                && event.status == EmulatedStatus::Scheduled
                && now >= not_before
            {
                // It started at NotBefore, however late somebody looks.
                event.start(not_before);
                changes += 1;
            }
        }
        let before = self.events.len();
        self.events
            .retain(|e| e.completes_at().is_none_or(|at| now < at));
        changes += before - self.events.len();
        self.incarnation += changes as u64;
    }

    /// The next time at which [`advance`](Self::advance) would change
    /// something.
    pub(crate) fn next_deadline(&self) -> Option<SystemTime> {
        self.events
            .iter()
            .filter_map(|e| match e.status {
                EmulatedStatus::Scheduled => e.not_before,
                EmulatedStatus::Started => e.completes_at(),
            })
            .min()
    }

    pub(crate) fn schedule(
        &mut self,
        spec: &EventSpec,
        now: SystemTime,
    ) -> Result<&Event, EmulatorError> {
        spec.validate().map_err(EmulatorError::InvalidSpec)?;
        let id = spec.resolved_id();
        if self.event(&id).is_some() {
            return Err(EmulatorError::InvalidSpec(format!(
                "an event with id {id} is already listed"
            )));
        }
        let status = spec.status();
        let event = Event {
            id,
            event_type: spec.event_type().to_owned(),
            resources: spec.resolved_resources(&self.config.vm_name),
            status,
            not_before: (status == EmulatedStatus::Scheduled)
                .then(|| event::not_before(now, spec.resolved_notice())),
            started_at: (status == EmulatedStatus::Started).then_some(now),
            description: spec.resolved_description(),
            source: spec.source(),
            duration_secs: spec.resolved_duration_secs(),
            complete_after: spec.resolved_complete_after(),
            visible_at: Instant::now(),
        };
        self.events.push(event);
        self.changed();
        let index = self.events.len() - 1;
        Ok(&self.events[index])
    }

    /// Starts a scheduled event now; returns whether anything changed.
    pub(crate) fn start(&mut self, id: &str, now: SystemTime) -> Result<bool, EmulatorError> {
        let index = self.position(id)?;
        let event = &mut self.events[index];
        if event.status == EmulatedStatus::Started {
            return Ok(false);
        }
        event.start(now);
        self.changed();
        Ok(true)
    }

    /// Removes an event as finished, whatever its status.
    pub(crate) fn complete(&mut self, id: &str) -> Result<(), EmulatorError> {
        let index = self.position(id)?;
        self.events.remove(index);
        self.changed();
        Ok(())
    }

    /// Removes a scheduled event that will not happen after all.
    pub(crate) fn cancel(&mut self, id: &str) -> Result<(), EmulatorError> {
        let index = self.position(id)?;
        if self.events[index].status == EmulatedStatus::Started {
            return Err(EmulatorError::AlreadyStarted(self.events[index].id.clone()));
        }
        self.events.remove(index);
        self.changed();
        Ok(())
    }

    /// Handles the ids of a `StartRequests` POST made with `api_version`.
    ///
    /// All ids are checked before anything changes, so a request naming an
    /// unknown id changes nothing; the unknown id is returned.
    pub(crate) fn approve(
        &mut self,
        ids: &[String],
        api_version: &str,
        now: SystemTime,
    ) -> Result<(), String> {
        if let Some(unknown) = ids.iter().find(|id| {
            self.event(id)
                .is_none_or(|event| !event.visible_to(api_version))
        }) {
            return Err(unknown.clone());
        }
        for id in ids {
            // Checked above, so this cannot fail; stay total anyway.
            let changed = self.start(id, now).unwrap_or(false);
            self.approvals.push(RecordedApproval {
                event_id: id.clone(),
                at: now,
                changed,
            });
        }
        Ok(())
    }

    /// Back to an empty events array; the incarnation never goes back.
    pub(crate) fn reset(&mut self) {
        if !self.events.is_empty() {
            self.events.clear();
            self.changed();
        }
        self.approvals.clear();
        self.stats = Stats::default();
        self.faults.clear();
        self.instance_missing = false;
        self.tokens.clear();
        self.rate_window.clear();
        self.keys.clear();
    }

    /// Whether the rate limit admits one more IMDS request arriving `now`.
    pub(crate) fn admit(&mut self, now: Instant) -> bool {
        let Some(limit) = self.config.rate_limit_per_sec else {
            return true;
        };
        while self
            .rate_window
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.rate_window.pop_front();
        }
        if self.rate_window.len() >= limit as usize {
            self.stats.throttled += 1;
            return false;
        }
        self.rate_window.push_back(now);
        true
    }

    /// The events as a client with `api_version` sees them.
    pub(crate) fn wire_events(&self, api_version: &str) -> Vec<WireEvent<'_>> {
        self.events
            .iter()
            .filter(|e| e.visible_to(api_version))
            .map(|e| e.wire(api_version))
            .collect()
    }

    /// The Scheduled Events document for `api_version`, serialized.
    pub(crate) fn document_string(&self, api_version: &str) -> String {
        let document = WireDocument {
            document_incarnation: self.incarnation,
            events: self.wire_events(api_version),
        };
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string(&document).unwrap_or_default()
    }

    pub(crate) fn bind_key(&mut self, key: &str, id: String) {
        self.keys.insert(key.to_owned(), id);
    }

    pub(crate) fn id_for_key(&self, key: &str) -> Result<String, EmulatorError> {
        self.keys
            .get(key)
            .cloned()
            .ok_or_else(|| EmulatorError::UnknownKey(key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn lifecycle_counts_every_change_once() {
        let mut state = State::new(EmulatorConfig::default());
        assert_eq!(state.incarnation(), 1);
        let id = state
            .schedule(
                &EventSpec::freeze().notice(Duration::from_secs(10)),
                at(1000),
            )
            .map(|e| e.id.clone())
            .expect("valid spec");
        assert_eq!(state.incarnation(), 2);
        state.advance(at(1009));
        assert_eq!(state.incarnation(), 2);
        state.advance(at(1010));
        assert_eq!(state.incarnation(), 3);
        assert_eq!(
            state.event(&id).map(|e| e.status),
            Some(EmulatedStatus::Started)
        );
        // Freeze completes DurationInSeconds (5) after its start.
        assert_eq!(state.next_deadline(), Some(at(1015)));
        state.advance(at(1015));
        assert_eq!(state.incarnation(), 4);
        assert!(state.event(&id).is_none());
    }

    #[test]
    fn late_look_sees_start_and_completion_as_two_changes() {
        let mut state = State::new(EmulatorConfig::default());
        state
            .schedule(&EventSpec::reboot().notice(Duration::from_secs(1)), at(0))
            .expect("valid spec");
        state.advance(at(3600));
        assert_eq!(state.incarnation(), 4);
        assert_eq!(state.next_deadline(), None);
    }

    #[test]
    fn approval_of_unknown_id_changes_nothing() {
        let mut state = State::new(EmulatorConfig::default());
        let id = state
            .schedule(&EventSpec::preempt(), at(0))
            .map(|e| e.id.clone())
            .expect("valid spec");
        let err = state.approve(&[id.clone(), "nope".to_owned()], "2020-07-01", at(1));
        assert_eq!(err, Err("nope".to_owned()));
        assert_eq!(state.incarnation(), 2);
        assert!(state.approvals.is_empty());
        assert_eq!(
            state.approve(&[id.to_lowercase()], "2020-07-01", at(1)),
            Ok(())
        );
        assert_eq!(state.incarnation(), 3);
        assert_eq!(state.approvals.len(), 1);
        assert!(state.approvals[0].changed);
    }

    #[test]
    fn rate_limit_is_a_sliding_window() {
        let mut state = State::new(EmulatorConfig::default());
        let t0 = Instant::now();
        for i in 0..5 {
            assert!(state.admit(t0 + Duration::from_millis(i * 100)));
        }
        assert!(!state.admit(t0 + Duration::from_millis(900)));
        assert!(state.admit(t0 + Duration::from_millis(1000)));
        assert_eq!(state.stats.throttled, 1);
    }
}
