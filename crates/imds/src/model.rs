//! The Scheduled Events document, typed.
//!
//! Parsing is strict where a mistake would be dangerous and lenient where Azure
//! is known to evolve: a document without `DocumentIncarnation` or an event
//! without `EventId` is rejected (we could not track it), while an event type,
//! status or source we have never seen is kept as `Unknown(String)` and a
//! `NotBefore` we cannot parse is kept verbatim, so no event is ever dropped.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use time::format_description::BorrowedFormatItem;
use time::format_description::well_known::{Iso8601, Rfc2822, Rfc3339};
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime};

/// RFC 1123 as IMDS writes it: `Mon, 19 Sep 2016 18:29:47 GMT`.
const RFC_1123: &[BorrowedFormatItem<'static>] = format_description!(
    "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
);

/// The document returned by `GET /metadata/scheduledevents`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ScheduledEvents {
    /// Increases whenever the events array changes; equal incarnations carry
    /// equal events.
    #[serde(rename = "DocumentIncarnation", deserialize_with = "incarnation")]
    pub incarnation: u64,
    /// Every event that currently affects the VM's placement group or set.
    #[serde(rename = "Events", default)]
    pub events: Vec<ScheduledEvent>,
}

impl ScheduledEvents {
    /// The event with this id, if the document holds it. EventIds are GUIDs,
    /// so the lookup ignores case; use the returned event's `id` to talk back
    /// to IMDS in its own spelling.
    pub fn event(&self, id: &EventId) -> Option<&ScheduledEvent> {
        self.events
            .iter()
            .find(|e| e.id.as_str().eq_ignore_ascii_case(id.as_str()))
    }
}

/// One entry of the `Events` array.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ScheduledEvent {
    /// Globally unique; stays the same from `Scheduled` to `Started`.
    #[serde(rename = "EventId")]
    pub id: EventId,
    /// The impact this event will have.
    #[serde(rename = "EventType")]
    pub event_type: EventType,
    /// Where the event is in its life: `Scheduled`, then `Started`, then gone.
    #[serde(rename = "EventStatus")]
    pub status: EventStatus,
    /// Always `VirtualMachine` today.
    #[serde(rename = "ResourceType", default)]
    pub resource_type: String,
    /// Names of the VMs affected; events are broadcast to a whole availability
    /// set or placement group, so this is how a VM knows an event is its own.
    #[serde(rename = "Resources", default)]
    pub resources: Vec<String>,
    /// The instant after which the event may start; empty once started.
    #[serde(rename = "NotBefore", default)]
    pub not_before: NotBefore,
    /// Free text from Azure.
    #[serde(rename = "Description", default)]
    pub description: String,
    /// Who initiated it (absent before api-version 2019-08-01).
    #[serde(rename = "EventSource", default)]
    pub source: Option<EventSource>,
    /// Expected length of the interruption in seconds, `-1` when unknown
    /// (absent before api-version 2019-08-01).
    #[serde(rename = "DurationInSeconds", default)]
    pub duration_in_seconds: Option<i64>,
}

impl ScheduledEvent {
    /// The expected interruption, or `None` when Azure does not know (`-1`).
    pub fn duration(&self) -> Option<Duration> {
        self.duration_in_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
    }

    /// Whether `vm_name` is listed in `Resources`. Azure resource names are
    /// case-insensitive, so the comparison is too.
    pub fn concerns(&self, vm_name: &str) -> bool {
        self.resources
            .iter()
            .any(|r| r.eq_ignore_ascii_case(vm_name))
    }

    /// Whether `Resources` names `vm_name` and no other VM: approving such an
    /// event affects this VM alone.
    pub fn concerns_only(&self, vm_name: &str) -> bool {
        !self.resources.is_empty()
            && self
                .resources
                .iter()
                .all(|r| r.eq_ignore_ascii_case(vm_name))
    }
}

impl Serialize for ScheduledEvent {
    /// Serializes in the wire format, `NotBefore` as RFC 1123.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("ScheduledEvent", 9)?;
        s.serialize_field("EventId", &self.id)?;
        s.serialize_field("EventType", &self.event_type)?;
        s.serialize_field("ResourceType", &self.resource_type)?;
        s.serialize_field("Resources", &self.resources)?;
        s.serialize_field("EventStatus", &self.status)?;
        s.serialize_field("NotBefore", &self.not_before)?;
        s.serialize_field("Description", &self.description)?;
        if let Some(source) = &self.source {
            s.serialize_field("EventSource", source)?;
        }
        if let Some(duration) = self.duration_in_seconds {
            s.serialize_field("DurationInSeconds", &duration)?;
        }
        s.end()
    }
}

/// An event's id, kept exactly as Azure sent it: approval must echo it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(transparent)]
pub struct EventId(pub String);

impl EventId {
    /// The id as sent by Azure.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for EventId {
    fn from(s: &str) -> Self {
        EventId(s.to_owned())
    }
}

/// Declares a string enum with a catch-all `Unknown(String)` variant, so a
/// value Azure adds later is carried through instead of failing the document.
macro_rules! open_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this version of spot-worker does not know.
            Unknown(String),
        }

        impl $name {
            /// The wire spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => stringify!($variant),)+
                    Self::Unknown(s) => s,
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::convert::Infallible;
            /// Case-insensitive; anything else becomes `Unknown`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $(if s.eq_ignore_ascii_case(stringify!($variant)) {
                    return Ok(Self::$variant);
                })+
                Ok(Self::Unknown(s.to_owned()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                Ok(s.parse().unwrap_or_else(|never| match never {}))
            }
        }
    };
}

open_enum!(
    /// The impact an event will have on the VM.
    EventType {
        /// The VM is paused for a few seconds (live migration, host update).
        Freeze,
        /// The VM is rebooted; memory is lost.
        Reboot,
        /// The VM moves to another host; temporary disks are lost.
        Redeploy,
        /// A Spot VM is evicted: deleted or deallocated.
        Preempt,
        /// A scale-set instance is deleted (scale-in, manual delete).
        Terminate,
    }
);

open_enum!(
    /// Where an event is in its life.
    EventStatus {
        /// Announced; will start after `NotBefore` or on approval.
        Scheduled,
        /// Under way. Azure never reports completion: the event just disappears.
        Started,
    }
);

open_enum!(
    /// Who initiated an event.
    EventSource {
        /// Azure itself: maintenance, eviction, hardware.
        Platform,
        /// The owner: a restart, redeploy or delete from the portal or API.
        User,
    }
);

impl EventType {
    /// The minimum notice Azure guarantees for this type (from the Scheduled
    /// Events documentation). Used when an event carries no usable `NotBefore`:
    /// the notice is counted from the moment the event was first seen.
    pub fn minimum_notice(&self) -> Duration {
        match self {
            EventType::Preempt => Duration::from_secs(30),
            EventType::Terminate => Duration::from_secs(5 * 60),
            EventType::Redeploy => Duration::from_secs(10 * 60),
            EventType::Freeze | EventType::Reboot => Duration::from_secs(15 * 60),
            // Unknown impact, unknown notice: assume the shortest there is.
            EventType::Unknown(_) => Duration::from_secs(30),
        }
    }
}

/// The `NotBefore` field.
///
/// Azure sends RFC 1123 (`Mon, 19 Sep 2016 18:29:47 GMT`) and an empty string
/// once the event has started; ISO 8601 / RFC 3339 is accepted as well. A value
/// that parses as neither is kept verbatim rather than failing the document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NotBefore {
    /// Empty: the event has started (or Azure gave no time).
    #[default]
    Unset,
    /// The instant after which the event may start.
    At(OffsetDateTime),
    /// Present but unparseable; the raw text is kept for diagnostics.
    Invalid(String),
}

impl NotBefore {
    /// Parses the wire text.
    ///
    /// ```
    /// use spot_worker_imds::NotBefore;
    /// use time::macros::datetime;
    ///
    /// assert_eq!(
    ///     NotBefore::parse("Mon, 19 Sep 2016 18:29:47 GMT"),
    ///     NotBefore::At(datetime!(2016-09-19 18:29:47 UTC)),
    /// );
    /// assert_eq!(
    ///     NotBefore::parse("2016-09-19T18:29:47Z"),
    ///     NotBefore::At(datetime!(2016-09-19 18:29:47 UTC)),
    /// );
    /// // Without an offset, UTC is meant (IMDS times are UTC).
    /// assert_eq!(
    ///     NotBefore::parse("2016-09-19T18:29:47"),
    ///     NotBefore::At(datetime!(2016-09-19 18:29:47 UTC)),
    /// );
    /// assert_eq!(NotBefore::parse(""), NotBefore::Unset);
    /// assert!(matches!(NotBefore::parse("soon"), NotBefore::Invalid(_)));
    /// ```
    pub fn parse(text: &str) -> NotBefore {
        let text = text.trim();
        if text.is_empty() {
            return NotBefore::Unset;
        }
        let parsed = PrimitiveDateTime::parse(text, RFC_1123)
            .ok()
            .map(PrimitiveDateTime::assume_utc)
            .or_else(|| OffsetDateTime::parse(text, &Rfc2822).ok())
            .or_else(|| OffsetDateTime::parse(text, &Rfc3339).ok())
            .or_else(|| OffsetDateTime::parse(text, &Iso8601::DEFAULT).ok())
            .or_else(|| {
                PrimitiveDateTime::parse(text, &Iso8601::DEFAULT)
                    .ok()
                    .map(PrimitiveDateTime::assume_utc)
            });
        match parsed {
            Some(at) => NotBefore::At(at.to_offset(time::UtcOffset::UTC)),
            None => NotBefore::Invalid(text.to_owned()),
        }
    }

    /// The instant, when there is one.
    pub fn instant(&self) -> Option<OffsetDateTime> {
        match self {
            NotBefore::At(at) => Some(*at),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for NotBefore {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        Ok(text.as_deref().map_or(NotBefore::Unset, NotBefore::parse))
    }
}

impl Serialize for NotBefore {
    /// Back to the wire format: RFC 1123, or empty.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            NotBefore::Unset => serializer.serialize_str(""),
            NotBefore::At(at) => match at.format(RFC_1123) {
                Ok(text) => serializer.serialize_str(&text),
                // Only a year beyond four digits fails; say it some way.
                Err(_) => serializer.serialize_str(&at.to_string()),
            },
            NotBefore::Invalid(raw) => serializer.serialize_str(raw),
        }
    }
}

/// `DocumentIncarnation` is an integer; early documentation shows it as a
/// string, so a numeric string is accepted too. Anything else is refused as
/// "expected a non-negative integer", whatever its type (an untagged enum
/// would say only that no variant matched, naming a private type).
fn incarnation<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Incarnation;
    impl de::Visitor<'_> for Incarnation {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a non-negative integer (DocumentIncarnation)")
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
            s.trim()
                .parse()
                .map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self))
        }
    }
    deserializer.deserialize_any(Incarnation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    /// The live-migration example from the Scheduled Events documentation.
    const DOCS_EXAMPLE: &str = r#"{
        "DocumentIncarnation":  2,
        "Events":  [{
            "EventId":  "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
            "EventStatus":  "Scheduled",
            "EventType":  "Freeze",
            "ResourceType":  "VirtualMachine",
            "Resources":  ["WestNO_0", "WestNO_1"],
            "NotBefore":  "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description":  "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
            "EventSource":  "Platform",
            "DurationInSeconds":  5
        }]
    }"#;

    #[test]
    fn parses_the_documented_example() {
        let doc: ScheduledEvents = serde_json::from_str(DOCS_EXAMPLE).unwrap();
        assert_eq!(doc.incarnation, 2);
        let event = &doc.events[0];
        assert_eq!(event.id.as_str(), "C7061BAC-AFDC-4513-B24B-AA5F13A16123");
        assert_eq!(event.event_type, EventType::Freeze);
        assert_eq!(event.status, EventStatus::Scheduled);
        assert_eq!(event.resources, ["WestNO_0", "WestNO_1"]);
        assert_eq!(
            event.not_before,
            NotBefore::At(datetime!(2022-04-11 22:26:58 UTC))
        );
        assert_eq!(event.source, Some(EventSource::Platform));
        assert_eq!(event.duration(), Some(Duration::from_secs(5)));
        assert!(event.concerns("westno_1"));
        assert!(!event.concerns("WestNO_2"));
    }

    #[test]
    fn round_trips_through_the_wire_format() {
        let doc: ScheduledEvents = serde_json::from_str(DOCS_EXAMPLE).unwrap();
        let text = serde_json::to_string(&doc).unwrap();
        assert!(text.contains(r#""NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT""#));
        let again: ScheduledEvents = serde_json::from_str(&text).unwrap();
        assert_eq!(doc, again);
    }

    #[test]
    fn keeps_values_azure_may_add_later() {
        let doc: ScheduledEvents = serde_json::from_str(
            r#"{"DocumentIncarnation":"7","Events":[{"EventId":"a","EventType":"Hibernate",
                "EventStatus":"Paused","EventSource":"Robot","NotBefore":"whenever",
                "DurationInSeconds":-1,"Extra":{"x":1}}]}"#,
        )
        .unwrap();
        let event = &doc.events[0];
        assert_eq!(doc.incarnation, 7);
        assert_eq!(event.event_type, EventType::Unknown("Hibernate".into()));
        assert_eq!(event.status, EventStatus::Unknown("Paused".into()));
        assert_eq!(event.source, Some(EventSource::Unknown("Robot".into())));
        assert_eq!(event.not_before, NotBefore::Invalid("whenever".into()));
        assert_eq!(event.duration(), None);
        assert!(event.resources.is_empty());
    }

    #[test]
    fn started_events_have_an_empty_not_before() {
        let doc: ScheduledEvents = serde_json::from_str(
            r#"{"DocumentIncarnation":3,"Events":[{"EventId":"a","EventType":"Reboot",
                "EventStatus":"Started","NotBefore":""}]}"#,
        )
        .unwrap();
        assert_eq!(doc.events[0].not_before, NotBefore::Unset);
    }

    #[test]
    fn rejects_documents_it_could_not_track() {
        for bad in [
            r#"{"Events":[]}"#,
            r#"{"DocumentIncarnation":-1,"Events":[]}"#,
            r#"{"DocumentIncarnation":"x","Events":[]}"#,
            r#"{"DocumentIncarnation":1,"Events":[{"EventType":"Preempt","EventStatus":"Scheduled"}]}"#,
            r#"{"DocumentIncarnation":1,"Events":{}}"#,
        ] {
            assert!(
                serde_json::from_str::<ScheduledEvents>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn any_parsed_time_serializes_without_panicking() {
        for text in [
            "1969-12-31T00:00:00Z",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            let event = format!(
                r#"{{"EventId":"a","EventType":"Reboot","EventStatus":"Scheduled","NotBefore":"{text}"}}"#
            );
            let event: ScheduledEvent = serde_json::from_str(&event).unwrap();
            assert!(event.not_before.instant().is_some(), "{text}");
            let json = serde_json::to_value(&event).unwrap();
            assert!(
                json["NotBefore"].as_str().unwrap().ends_with(" GMT"),
                "{json}"
            );
        }
    }

    #[test]
    fn finds_events_whatever_the_case_of_their_id() {
        let doc: ScheduledEvents = serde_json::from_str(DOCS_EXAMPLE).unwrap();
        let found = doc
            .event(&"c7061bac-afdc-4513-b24b-aa5f13a16123".into())
            .unwrap();
        assert_eq!(found.id.as_str(), "C7061BAC-AFDC-4513-B24B-AA5F13A16123");
    }

    #[test]
    fn parses_types_case_insensitively() {
        assert_eq!("preempt".parse::<EventType>().unwrap(), EventType::Preempt);
        assert_eq!(
            "TERMINATE".parse::<EventType>().unwrap(),
            EventType::Terminate
        );
        assert_eq!(EventType::Preempt.minimum_notice(), Duration::from_secs(30));
    }
}
