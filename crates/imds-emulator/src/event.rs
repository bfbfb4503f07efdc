//! Events: the specification used to schedule one, the per-type defaults
//! that make them look like the real service's, and the wire format.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// `EventStatus` of an event in the events array.
///
/// There is no "Completed": the real service removes finished events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EmulatedStatus {
    /// Announced; starts when approved or when `NotBefore` passes.
    #[serde(alias = "scheduled")]
    Scheduled,
    /// In progress; `NotBefore` is empty.
    #[serde(alias = "started")]
    Started,
}

/// `EventSource`: who initiated the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EmulatedSource {
    /// Azure (maintenance, evictions, failures).
    #[serde(alias = "platform")]
    Platform,
    /// The VM's owner (restart or redeploy from the portal, CLI or API).
    #[serde(alias = "user")]
    User,
}

/// When a started event is removed from the events array on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// Per event type, see [`EventSpec::complete_after`].
    Default,
    After(Duration),
    Never,
}

/// What to schedule: a cheap builder whose unset fields take realistic
/// per-type defaults when the event is scheduled.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_imds_emulator::EventSpec;
///
/// let spec = EventSpec::new("Reboot")
///     .resources(["spotvmss_0", "spotvmss_1"])
///     .notice(Duration::from_secs(60))
///     .source_user();
/// assert_eq!(spec.event_type(), "Reboot");
/// assert_eq!(spec.resolved_notice(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EventSpec {
    event_type: String,
    id: Option<String>,
    resources: Option<Vec<String>>,
    notice: Option<Duration>,
    status: EmulatedStatus,
    source: EmulatedSource,
    duration_secs: Option<i64>,
    description: Option<String>,
    completion: Completion,
}

impl EventSpec {
    /// An event of any `EventType`; unknown types get 15 minutes notice.
    pub fn new(event_type: impl Into<String>) -> Self {
        Self {
            event_type: event_type.into(),
            id: None,
            resources: None,
            notice: None,
            status: EmulatedStatus::Scheduled,
            source: EmulatedSource::Platform,
            duration_secs: None,
            description: None,
            completion: Completion::Default,
        }
    }

    /// A Spot eviction: `Preempt`, 30 s notice.
    pub fn preempt() -> Self {
        Self::new("Preempt")
    }

    /// A scale-in of a scale set with terminate notifications: `Terminate`,
    /// 5 minutes notice (configurable 5 to 15 minutes in the real service).
    pub fn terminate() -> Self {
        Self::new("Terminate")
    }

    /// A memory-preserving live migration: `Freeze`, 15 minutes notice,
    /// `DurationInSeconds` 5.
    pub fn freeze() -> Self {
        Self::new("Freeze")
    }

    /// A restart: `Reboot`, 15 minutes notice.
    pub fn reboot() -> Self {
        Self::new("Reboot")
    }

    /// A move to another host: `Redeploy`, 10 minutes notice.
    pub fn redeploy() -> Self {
        Self::new("Redeploy")
    }

    /// The VMs the event affects (default: the emulated VM only).
    pub fn resources<I, S>(mut self, resources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.resources = Some(resources.into_iter().map(Into::into).collect());
        self
    }

    /// The `EventId` (default: a fresh upper-case UUID). Azure lists one
    /// event that affects several VMs under the same id on each of them, so
    /// a test emulating such an event on several emulators sets it.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Time from scheduling to `NotBefore` (rounded up to whole seconds).
    pub fn notice(mut self, notice: Duration) -> Self {
        self.notice = Some(notice);
        self
    }

    /// Appear directly as `Started` with an empty `NotBefore`, like the
    /// events created after a host hardware failure.
    pub fn started(mut self) -> Self {
        self.status = EmulatedStatus::Started;
        self
    }

    /// Initiated by the user (`EventSource: "User"`).
    pub fn source_user(mut self) -> Self {
        self.source = EmulatedSource::User;
        self
    }

    /// `DurationInSeconds` (default 5 for `Freeze`, -1 = unknown otherwise).
    pub fn duration_secs(mut self, secs: i64) -> Self {
        self.duration_secs = Some(secs);
        self
    }

    /// `Description` (default: a realistic text for the type and source).
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Remove the event this long after it started.
    ///
    /// Default: `Freeze` after its `DurationInSeconds`, `Reboot` and
    /// `Redeploy` after 10 s; `Preempt`, `Terminate` and unknown types never,
    /// because the VM is gone (or it is up to the caller).
    pub fn complete_after(mut self, after: Duration) -> Self {
        self.completion = Completion::After(after);
        self
    }

    /// Never remove the event on its own once started.
    pub fn never_complete(mut self) -> Self {
        self.completion = Completion::Never;
        self
    }

    /// The `EventType`.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The notice this event gets: the one set or the type's minimum notice.
    pub fn resolved_notice(&self) -> Duration {
        self.notice
            .unwrap_or_else(|| default_notice(&self.event_type))
    }

    pub(crate) fn status(&self) -> EmulatedStatus {
        self.status
    }

    pub(crate) fn resolved_duration_secs(&self) -> i64 {
        self.duration_secs
            .unwrap_or(match self.event_type.as_str() {
                "Freeze" => 5,
                _ => -1,
            })
    }

    /// How long after starting the event is removed, `None` for never.
    pub(crate) fn resolved_complete_after(&self) -> Option<Duration> {
        match self.completion {
            Completion::After(after) => Some(after),
            Completion::Never => None,
            Completion::Default => match self.event_type.as_str() {
                // A freeze is over once the VM is resumed.
                "Freeze" => Some(Duration::from_secs(
                    u64::try_from(self.resolved_duration_secs())
                        .ok()
                        .filter(|secs| *secs > 0)
                        .unwrap_or(5),
                )),
                "Reboot" | "Redeploy" => Some(Duration::from_secs(10)),
                _ => None,
            },
        }
    }

    pub(crate) fn resolved_description(&self) -> String {
        if let Some(description) = &self.description {
            return description.clone();
        }
        let user = self.source == EmulatedSource::User;
        match (self.event_type.as_str(), user) {
            ("Preempt", _) => "Virtual machine is being evicted from the Spot pool.",
            ("Terminate", _) => "Virtual machine is being deleted from the scale set.",
            ("Freeze", _) => {
                "Virtual machine is being paused because of a memory-preserving Live Migration operation."
            }
            ("Reboot", true) => {
                "Virtual machine is going to be restarted as requested by authorized user."
            }
            ("Reboot", false) => "Virtual machine is going to be restarted for planned maintenance.",
            ("Redeploy", true) => {
                "Virtual machine is going to be redeployed as requested by authorized user."
            }
            ("Redeploy", false) => {
                "Virtual machine is going to be moved to another host for planned maintenance."
            }
            _ => "Virtual machine is affected by a platform maintenance operation.",
        }
        .to_owned()
    }

    pub(crate) fn resolved_id(&self) -> String {
        self.id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string().to_uppercase())
    }

    pub(crate) fn resolved_resources(&self, vm_name: &str) -> Vec<String> {
        self.resources
            .clone()
            .unwrap_or_else(|| vec![vm_name.to_owned()])
    }

    pub(crate) fn source(&self) -> EmulatedSource {
        self.source
    }

    /// Checks what the real service guarantees for every event.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.event_type.trim().is_empty() {
            return Err("event_type must not be empty".to_owned());
        }
        if self.id.as_ref().is_some_and(|id| id.trim().is_empty()) {
            return Err("event_id must not be empty".to_owned());
        }
        if let Some(resources) = &self.resources {
            if resources.is_empty() {
                return Err("resources must name at least one VM".to_owned());
            }
            if resources.iter().any(|r| r.trim().is_empty()) {
                return Err("resource names must not be empty".to_owned());
            }
        }
        if self.resolved_notice() > MAX_TIMING
            || self
                .resolved_complete_after()
                .is_some_and(|d| d > MAX_TIMING)
        {
            return Err("notice and completion times must be at most a year".to_owned());
        }
        if self.resolved_duration_secs() < -1 {
            return Err("duration_secs must be -1 (unknown) or at least 0".to_owned());
        }
        Ok(())
    }

    /// This spec with every timing divided by `speed` (> 0), so that a
    /// scenario played faster keeps its shape. Defaults are resolved first so
    /// that they get scaled too.
    pub(crate) fn scaled(&self, speed: f64) -> Self {
        let mut scaled = self.clone();
        scaled.notice = Some(scale(self.resolved_notice(), speed));
        scaled.completion = match self.resolved_complete_after() {
            Some(after) => Completion::After(scale(after, speed)),
            None => Completion::Never,
        };
        scaled
    }

    /// A JSON summary for listings (durations in seconds).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "event_type": self.event_type,
            "event_id": self.id,
            "resources": self.resources,
            "notice_secs": self.resolved_notice().as_secs_f64(),
            "status": self.status,
            "source": self.source,
            "duration_secs": self.resolved_duration_secs(),
            "description": self.resolved_description(),
            "complete_after_secs": self.resolved_complete_after().map(|d| d.as_secs_f64()),
        })
    }
}

/// The longest notice or completion time accepted, far beyond the real
/// service's (a few days) and far from overflowing clock arithmetic.
const MAX_TIMING: Duration = Duration::from_secs(366 * 24 * 3600);

/// `duration` divided by `speed`, saturating instead of panicking.
pub(crate) fn scale(duration: Duration, speed: f64) -> Duration {
    Duration::try_from_secs_f64(duration.as_secs_f64() / speed).unwrap_or(Duration::MAX)
}

/// The minimum notice of the real service per `EventType`.
pub(crate) fn default_notice(event_type: &str) -> Duration {
    Duration::from_secs(match event_type {
        "Preempt" => 30,
        "Terminate" => 300,
        "Redeploy" => 600,
        // Freeze, Reboot and anything unknown.
        _ => 900,
    })
}

/// `NotBefore` for an event scheduled at `now` with `notice`: the wire format
/// has one-second resolution, so round up, never promising an earlier start.
pub(crate) fn not_before(now: SystemTime, notice: Duration) -> SystemTime {
    // Notices are validated to be at most a year, so this cannot saturate
    // in practice; stay total anyway.
    let at = now.checked_add(notice).unwrap_or(now);
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) if since.subsec_nanos() > 0 => {
            SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs() + 1)
        }
        _ => at,
    }
}

/// One event of a Scheduled Events document, fields in the real order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct WireEvent<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub resource_type: &'static str,
    pub resources: &'a [String],
    pub event_status: EmulatedStatus,
    pub not_before: String,
    pub description: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_source: Option<EmulatedSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_in_seconds: Option<i64>,
}

/// A Scheduled Events document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct WireDocument<'a> {
    pub document_incarnation: u64,
    pub events: Vec<WireEvent<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_before_rounds_up_to_whole_seconds() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_250);
        assert_eq!(
            not_before(base, Duration::from_secs(30)),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_031)
        );
        let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            not_before(whole, Duration::from_secs(30)),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_030)
        );
    }

    #[test]
    fn defaults_per_type() {
        assert_eq!(
            EventSpec::preempt().resolved_notice(),
            Duration::from_secs(30)
        );
        assert_eq!(
            EventSpec::terminate().resolved_notice(),
            Duration::from_secs(300)
        );
        assert_eq!(EventSpec::freeze().resolved_duration_secs(), 5);
        assert_eq!(
            EventSpec::freeze().resolved_complete_after(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(EventSpec::preempt().resolved_complete_after(), None);
        assert_eq!(
            EventSpec::new("Whatever").resolved_notice(),
            Duration::from_secs(900)
        );
        assert!(EventSpec::new(" ").validate().is_err());
        assert!(
            EventSpec::preempt()
                .resources(Vec::<String>::new())
                .validate()
                .is_err()
        );
    }

    #[test]
    fn scaling_divides_all_timings() {
        let spec = EventSpec::freeze().scaled(10.0);
        assert_eq!(spec.resolved_notice(), Duration::from_secs(90));
        assert_eq!(
            spec.resolved_complete_after(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(spec.resolved_duration_secs(), 5);
    }
}
