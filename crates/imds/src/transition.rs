//! Turning successive documents into the transitions an application acts on.
//!
//! IMDS only ever shows the current state; it never says "completed" or
//! "cancelled". Those are inferred from an event disappearing: gone after
//! `Started` means completed, gone while `Scheduled` means Azure cancelled it.

use std::time::SystemTime;

use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::model::{EventStatus, ScheduledEvent, ScheduledEvents};

/// What changed about one event between two documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransitionKind {
    /// A new event announced for the future.
    Scheduled,
    /// The event is under way: approved, its `NotBefore` passed, or (after a
    /// hardware failure) it appeared already started.
    Started,
    /// Still in the same status, but a field changed (a new `NotBefore`, more
    /// resources, a longer duration).
    Updated,
    /// Gone after it had started: the impact is over.
    Completed,
    /// Gone before it started: Azure called it off.
    Cancelled,
}

impl TransitionKind {
    /// Lower-case name, as printed by `spot-worker events watch`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Scheduled => "scheduled",
            TransitionKind::Started => "started",
            TransitionKind::Updated => "updated",
            TransitionKind::Completed => "completed",
            TransitionKind::Cancelled => "cancelled",
        }
    }
}

/// One observed change of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// What happened.
    pub kind: TransitionKind,
    /// The event as last seen (for `Completed` and `Cancelled`, as it was
    /// before it disappeared).
    pub event: ScheduledEvent,
    /// The event's status in the previous document; `None` when this is the
    /// first time it is seen (an event that appears already `Started` was
    /// never announced: a hardware failure).
    pub previous_status: Option<EventStatus>,
    /// Whether the event lists this VM in `Resources`.
    pub concerns_this_vm: bool,
    /// `DocumentIncarnation` of the document that showed the change.
    pub incarnation: u64,
    /// When the watcher received that document.
    pub observed_at: SystemTime,
}

/// Compares the previous events with a new document and lists the changes in
/// document order, disappearances last. `vm_name` is this VM's name; `None`
/// (not known) takes every event to concern this VM, the safe reading.
///
/// ```
/// use std::time::SystemTime;
/// use spot_worker_imds::{diff, ScheduledEvents, TransitionKind};
///
/// let scheduled: ScheduledEvents = serde_json::from_str(r#"{"DocumentIncarnation":2,"Events":[
///     {"EventId":"E1","EventType":"Preempt","EventStatus":"Scheduled","Resources":["vm_0"],
///      "NotBefore":"Mon, 19 Sep 2016 18:29:47 GMT"}]}"#).unwrap();
/// let gone: ScheduledEvents = serde_json::from_str(r#"{"DocumentIncarnation":3,"Events":[]}"#).unwrap();
///
/// let now = SystemTime::now();
/// let first = diff(&[], &scheduled, Some("vm_0"), now);
/// assert_eq!(first[0].kind, TransitionKind::Scheduled);
/// assert!(first[0].concerns_this_vm);
///
/// let second = diff(&scheduled.events, &gone, Some("vm_0"), now);
/// assert_eq!(second[0].kind, TransitionKind::Cancelled);
/// ```
pub fn diff(
    previous: &[ScheduledEvent],
    current: &ScheduledEvents,
    vm_name: Option<&str>,
    observed_at: SystemTime,
) -> Vec<Transition> {
    let transition = |kind, event: &ScheduledEvent, previous_status| Transition {
        kind,
        concerns_this_vm: vm_name.is_none_or(|name| event.concerns(name)),
        event: event.clone(),
        previous_status,
        incarnation: current.incarnation,
        observed_at,
    };
    let mut changes = Vec::new();
    for event in &current.events {
        match previous.iter().find(|p| p.id == event.id) {
            None => {
                let kind = match event.status {
                    EventStatus::Started => TransitionKind::Started,
                    // An unknown status is treated as pending: the safe reading.
                    _ => TransitionKind::Scheduled,
                };
                changes.push(transition(kind, event, None));
            }
            Some(before) if before.status != event.status => {
                let kind = match event.status {
                    EventStatus::Started => TransitionKind::Started,
                    _ => TransitionKind::Updated,
                };
                changes.push(transition(kind, event, Some(before.status.clone())));
            }
            Some(before) if before != event => {
                changes.push(transition(
                    TransitionKind::Updated,
                    event,
                    Some(before.status.clone()),
                ));
            }
            Some(_) => {}
        }
    }
    for before in previous {
        if current.event(&before.id).is_none() {
            let kind = match before.status {
                EventStatus::Scheduled => TransitionKind::Cancelled,
                _ => TransitionKind::Completed,
            };
            changes.push(transition(kind, before, Some(before.status.clone())));
        }
    }
    changes
}

impl Serialize for Transition {
    /// One flat object with snake_case keys, `not_before` as RFC 3339 or null:
    /// the line format of `spot-worker events watch --json`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = &self.event;
        let not_before = event
            .not_before
            .instant()
            .and_then(|at| at.format(&Rfc3339).ok());
        let observed_at = OffsetDateTime::from(self.observed_at).format(&Rfc3339).ok();
        let mut s = serializer.serialize_struct("Transition", 13)?;
        s.serialize_field("transition", self.kind.as_str())?;
        s.serialize_field("event_id", &event.id)?;
        s.serialize_field("event_type", &event.event_type)?;
        s.serialize_field("event_status", &event.status)?;
        s.serialize_field("previous_status", &self.previous_status)?;
        s.serialize_field("resources", &event.resources)?;
        s.serialize_field("not_before", &not_before)?;
        s.serialize_field("event_source", &event.source)?;
        s.serialize_field("duration_in_seconds", &event.duration_in_seconds)?;
        s.serialize_field("description", &event.description)?;
        s.serialize_field("concerns_this_vm", &self.concerns_this_vm)?;
        s.serialize_field("incarnation", &self.incarnation)?;
        s.serialize_field("observed_at", &observed_at)?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventType, NotBefore};

    fn event(id: &str, status: EventStatus, resources: &[&str]) -> ScheduledEvent {
        ScheduledEvent {
            id: id.into(),
            event_type: EventType::Reboot,
            status,
            resource_type: "VirtualMachine".into(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            not_before: NotBefore::Unset,
            description: String::new(),
            source: None,
            duration_in_seconds: Some(-1),
        }
    }

    fn doc(incarnation: u64, events: Vec<ScheduledEvent>) -> ScheduledEvents {
        ScheduledEvents {
            incarnation,
            events,
        }
    }

    fn kinds(changes: &[Transition]) -> Vec<(TransitionKind, &str)> {
        changes
            .iter()
            .map(|t| (t.kind, t.event.id.as_str()))
            .collect()
    }

    #[test]
    fn follows_an_event_through_its_life() {
        let now = SystemTime::now();
        let scheduled = doc(2, vec![event("a", EventStatus::Scheduled, &["vm"])]);
        let started = doc(3, vec![event("a", EventStatus::Started, &["vm"])]);
        let gone = doc(4, vec![]);

        let changes = diff(&[], &scheduled, Some("vm"), now);
        assert_eq!(kinds(&changes), [(TransitionKind::Scheduled, "a")]);
        assert_eq!(changes[0].previous_status, None);

        let changes = diff(&scheduled.events, &started, Some("vm"), now);
        assert_eq!(kinds(&changes), [(TransitionKind::Started, "a")]);
        assert_eq!(changes[0].previous_status, Some(EventStatus::Scheduled));
        assert_eq!(changes[0].incarnation, 3);

        let changes = diff(&started.events, &gone, Some("vm"), now);
        assert_eq!(kinds(&changes), [(TransitionKind::Completed, "a")]);
        assert!(diff(&gone.events, &gone, Some("vm"), now).is_empty());
    }

    #[test]
    fn tells_cancelled_from_completed_and_sees_unannounced_starts() {
        let now = SystemTime::now();
        let before = doc(
            5,
            vec![
                event("pending", EventStatus::Scheduled, &["vm"]),
                event("running", EventStatus::Started, &["vm"]),
            ],
        );
        let after = doc(6, vec![event("failure", EventStatus::Started, &["vm"])]);
        let changes = diff(&before.events, &after, Some("vm"), now);
        assert_eq!(
            kinds(&changes),
            [
                (TransitionKind::Started, "failure"),
                (TransitionKind::Cancelled, "pending"),
                (TransitionKind::Completed, "running"),
            ]
        );
        assert_eq!(changes[0].previous_status, None);
    }

    #[test]
    fn reports_field_changes_and_who_is_concerned() {
        let now = SystemTime::now();
        let before = doc(1, vec![event("a", EventStatus::Scheduled, &["other"])]);
        let after = doc(
            2,
            vec![event("a", EventStatus::Scheduled, &["other", "VM"])],
        );
        let changes = diff(&before.events, &after, Some("vm"), now);
        assert_eq!(kinds(&changes), [(TransitionKind::Updated, "a")]);
        assert!(changes[0].concerns_this_vm);
        assert!(!diff(&[], &before, Some("vm"), now)[0].concerns_this_vm);
    }

    #[test]
    fn serializes_as_one_flat_json_object() {
        let mut e = event("a", EventStatus::Scheduled, &["vm"]);
        e.not_before = NotBefore::parse("Mon, 19 Sep 2016 18:29:47 GMT");
        let t = &diff(&[], &doc(9, vec![e]), Some("vm"), SystemTime::UNIX_EPOCH)[0];
        let json = serde_json::to_value(t).unwrap();
        assert_eq!(json["transition"], "scheduled");
        assert_eq!(json["event_id"], "a");
        assert_eq!(json["event_type"], "Reboot");
        assert_eq!(json["event_status"], "Scheduled");
        assert_eq!(json["resources"], serde_json::json!(["vm"]));
        assert_eq!(json["not_before"], "2016-09-19T18:29:47Z");
        assert_eq!(json["concerns_this_vm"], true);
        assert_eq!(json["incarnation"], 9);
        assert_eq!(json["observed_at"], "1970-01-01T00:00:00Z");
    }
}
