//! Scripted scenarios: a pure data description of an event flow (modelled
//! on what real VMs receive), the built-in scenarios, and the player that
//! performs one in real time.

use std::time::Duration;

use crate::config::EmulatorConfig;
use crate::event::{EmulatedStatus, EventSpec};

/// A named, scripted flow of events.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Short name, e.g. `spot-eviction`.
    pub name: String,
    /// What the scenario rehearses.
    pub description: String,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

/// One step of a [`Scenario`].
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Delay after the previous step (scaled by the playing speed).
    pub after: Duration,
    /// What to do.
    pub action: Action,
}

/// What a [`Step`] does. `key` names an event scheduled by an earlier step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Schedule an event and remember its id under `key`.
    Schedule {
        /// Name for later steps.
        key: String,
        /// The event.
        spec: EventSpec,
    },
    /// Start the event now, as an approval would.
    Start {
        /// The event.
        key: String,
    },
    /// Wait until the event has started by itself (at `NotBefore`) or was
    /// approved by a client. Applied synchronously, it starts the event.
    AwaitStart {
        /// The event.
        key: String,
    },
    /// Remove the event as finished.
    Complete {
        /// The event.
        key: String,
    },
    /// Wait until the event was removed after its completion time.
    /// Applied synchronously, it removes the event.
    AwaitCompletion {
        /// The event.
        key: String,
    },
    /// Remove a scheduled event that will not happen after all.
    Cancel {
        /// The event.
        key: String,
    },
}

impl Step {
    /// A step `after` the previous one.
    pub fn new(after: Duration, action: Action) -> Self {
        Self { after, action }
    }

    /// A step right after the previous one.
    pub fn now(action: Action) -> Self {
        Self::new(Duration::ZERO, action)
    }
}

impl Action {
    /// [`Action::Schedule`].
    pub fn schedule(key: impl Into<String>, spec: EventSpec) -> Self {
        Self::Schedule {
            key: key.into(),
            spec,
        }
    }

    /// [`Action::Start`].
    pub fn start(key: impl Into<String>) -> Self {
        Self::Start { key: key.into() }
    }

    /// [`Action::Complete`].
    pub fn complete(key: impl Into<String>) -> Self {
        Self::Complete { key: key.into() }
    }

    /// [`Action::AwaitStart`].
    pub fn await_start(key: impl Into<String>) -> Self {
        Self::AwaitStart { key: key.into() }
    }

    /// [`Action::AwaitCompletion`].
    pub fn await_completion(key: impl Into<String>) -> Self {
        Self::AwaitCompletion { key: key.into() }
    }

    /// [`Action::Cancel`].
    pub fn cancel(key: impl Into<String>) -> Self {
        Self::Cancel { key: key.into() }
    }

    fn to_json(&self) -> serde_json::Value {
        let (name, key) = match self {
            Action::Schedule { key, spec } => {
                return serde_json::json!({"action": "schedule", "key": key, "event": spec.to_json()});
            }
            Action::Start { key } => ("start", key),
            Action::AwaitStart { key } => ("await_start", key),
            Action::Complete { key } => ("complete", key),
            Action::AwaitCompletion { key } => ("await_completion", key),
            Action::Cancel { key } => ("cancel", key),
        };
        serde_json::json!({"action": name, "key": key})
    }
}

impl Scenario {
    /// The names of the built-in scenarios.
    pub const BUILTIN: &'static [&'static str] = &[
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

    /// The built-in scenario `name` for the VM described by `config`.
    ///
    /// ```
    /// use spot_worker_imds_emulator::{EmulatorConfig, Scenario};
    ///
    /// let config = EmulatorConfig::default();
    /// for name in Scenario::BUILTIN {
    ///     assert_eq!(Scenario::builtin(name, &config).map(|s| s.name), Some(name.to_string()));
    /// }
    /// assert!(Scenario::builtin("no-such-scenario", &config).is_none());
    /// ```
    pub fn builtin(name: &str, config: &EmulatorConfig) -> Option<Self> {
        let me = config.vm_name.as_str();
        let peer = config.peer_vm_name();
        let (description, steps): (String, Vec<Step>) = match name {
            "spot-eviction" => (
                "Spot eviction of this VM: Preempt with 30 s notice; it starts at NotBefore \
                 (or when approved) and never completes, because the VM is deleted."
                    .into(),
                followed("evict", EventSpec::preempt().resources([me]), Until::Start),
            ),
            "scale-in-terminate" => (
                "Scale-in of a scale set with terminate notifications: Terminate with 5 min \
                 notice (configurable 5 to 15 min); the VM is deleted when it starts."
                    .into(),
                followed(
                    "terminate",
                    EventSpec::terminate().resources([me]),
                    Until::Start,
                ),
            ),
            "live-migration-freeze" => (
                "Memory-preserving live migration: Freeze with 15 min notice and \
                 DurationInSeconds 5; Scheduled, then Started, then removed after 5 s."
                    .into(),
                followed(
                    "freeze",
                    EventSpec::freeze().resources([me]),
                    Until::Completion,
                ),
            ),
            "user-reboot" => (
                "The owner restarts the VM: Reboot from EmulatedSource User with 15 min notice \
                 (usually approved at once); removed 10 s after it started."
                    .into(),
                followed(
                    "reboot",
                    EventSpec::reboot().resources([me]).source_user(),
                    Until::Completion,
                ),
            ),
            "redeploy" => (
                "The owner redeploys the VM to another host: Redeploy from EmulatedSource User \
                 with 10 min notice; removed 10 s after it started."
                    .into(),
                followed(
                    "redeploy",
                    EventSpec::redeploy().resources([me]).source_user(),
                    Until::Completion,
                ),
            ),
            "cancelled-maintenance" => (
                "Planned maintenance judged too risky: a platform Reboot is scheduled with \
                 15 min notice and removed 20 s later while still Scheduled."
                    .into(),
                vec![
                    Step::now(Action::schedule(
                        "reboot",
                        EventSpec::reboot().resources([me]),
                    )),
                    Step::new(Duration::from_secs(20), Action::cancel("reboot")),
                ],
            ),
            "hardware-failure" => (
                "Host hardware failure: a Reboot appears directly as Started (empty \
                 NotBefore) and is removed 10 s later when the VM has recovered."
                    .into(),
                vec![
                    Step::now(Action::schedule(
                        "reboot",
                        EventSpec::reboot().resources([me]).started().description(
                            "Virtual machine is being restarted because the host \
                                 experienced a hardware failure.",
                        ),
                    )),
                    Step::now(Action::await_completion("reboot")),
                ],
            ),
            "two-vms-one-event" => (
                format!(
                    "Live migration of a host shared with another VM: one Freeze whose \
                     Resources are {me} and {peer}; an approval by either lets it proceed."
                ),
                followed(
                    "freeze",
                    EventSpec::freeze().resources([me, peer.as_str()]),
                    Until::Completion,
                ),
            ),
            "other-vm-preempt" => (
                format!(
                    "Eviction of another VM in the placement group: a Preempt for {peer} only, \
                     which this VM sees but must not act on."
                ),
                followed(
                    "evict",
                    EventSpec::preempt().resources([peer.as_str()]),
                    Until::Start,
                ),
            ),
            _ => return None,
        };
        Some(Self {
            name: name.to_owned(),
            description,
            steps,
        })
    }

    /// All built-in scenarios for the VM described by `config`.
    pub fn builtins(config: &EmulatorConfig) -> Vec<Self> {
        Self::BUILTIN
            .iter()
            .filter_map(|name| Self::builtin(name, config))
            .collect()
    }

    /// This scenario with every scheduled (not already started) event given
    /// `notice`, e.g. a 10 minute termination delay for `scale-in-terminate`.
    pub fn with_notice(mut self, notice: Duration) -> Self {
        for step in &mut self.steps {
            if let Action::Schedule { spec, .. } = &mut step.action
                && spec.status() == EmulatedStatus::Scheduled
            {
                *spec = spec.clone().notice(notice);
            }
        }
        self
    }

    /// The scenario as the control API lists it (durations in seconds).
    pub fn to_json(&self) -> serde_json::Value {
        let steps: Vec<_> = self
            .steps
            .iter()
            .map(|step| {
                let mut json = step.action.to_json();
                json["after_secs"] = step.after.as_secs_f64().into();
                json
            })
            .collect();
        serde_json::json!({
            "name": self.name,
            "description": self.description,
            "steps": steps,
        })
    }
}

/// How far a built-in scenario follows its event.
#[derive(Clone, Copy)]
enum Until {
    /// Until it has started.
    Start,
    /// Until it has started and completed.
    Completion,
}

/// The steps of the event `key`, scheduled at once as `spec` and followed
/// [`until`](Until) it has started or completed.
fn followed(key: &str, spec: EventSpec, until: Until) -> Vec<Step> {
    let mut steps = vec![
        Step::now(Action::schedule(key, spec)),
        Step::now(Action::await_start(key)),
    ];
    if matches!(until, Until::Completion) {
        steps.push(Step::now(Action::await_completion(key)));
    }
    steps
}
