//! What a worker does once drained for a Scheduled Event: approve it and
//! exit, exit because it has started, wait for it, or take work again.
//!
//! Exiting after every drain would be wrong twice over. Approving an event
//! starts it for every VM in its `Resources`, so a shared event (a Reboot of
//! several scale-set VMs) is not approved by default. And a worker that exits
//! without the event starting is restarted by systemd (`Restart=always`,
//! `RestartSec=5s`), sees the same pending event, drains and exits again,
//! every 5 s for as long as the notice lasts (up to 15 minutes for a Reboot).
//! So a worker that does not approve parks instead: up, not ready, taking
//! nothing, until the event starts (then it exits as the VM goes down) or
//! disappears (then it takes work again).

use spot_worker_imds::{ApprovalScope, EventStatus, Notice, RunningWatcher, ScheduledEvent};
use tokio::sync::watch;

use crate::config::DrainSettings;
use crate::health::Readiness;
use crate::shutdown::{DrainTrigger, Triggers, Watchdog};

/// The next step after a drain for an event, from what is known now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterDrain {
    /// Approve the event under this scope, then exit.
    Approve(ApprovalScope),
    /// Exit: the impact has begun (or nothing more will be learnt).
    Exit,
    /// Stay up, not ready, taking nothing, until the notice changes; the
    /// text says why the event is not approved.
    Park(String),
    /// The notice was withdrawn (the event cancelled before it started):
    /// take work again.
    Resume,
    /// Nothing to decide yet: the notice names an event that the listed
    /// document predates (the watcher publishes a notice first and its
    /// document right after, in the same poll).
    Wait,
}

/// Decides the step after a drain. `notice` is the current notice, `event`
/// the triggering event as last listed by IMDS in the document of
/// `document_incarnation` (`None`: no document yet), `vm_name` this VM's
/// name if known.
pub(crate) fn after_drain(
    notice: Option<&Notice>,
    event: Option<&ScheduledEvent>,
    document_incarnation: Option<u64>,
    vm_name: Option<&str>,
    settings: &DrainSettings,
) -> AfterDrain {
    let Some(notice) = notice else {
        return AfterDrain::Exit;
    };
    if notice.withdrawn {
        return AfterDrain::Resume;
    }
    // Not listed in a document older than the notice: that document is
    // about to be replaced. A worker that drained in no time reads it first.
    if event.is_none() && document_incarnation.is_none_or(|d| d < notice.incarnation) {
        return AfterDrain::Wait;
    }
    // Started, or gone after it started (the notice is then not withdrawn):
    // the VM is going down; nothing is left to approve.
    let Some(event) = event.filter(|e| e.status != EventStatus::Started) else {
        return AfterDrain::Exit;
    };
    if notice.status == EventStatus::Started {
        return AfterDrain::Exit;
    }
    if !settings.approve_events {
        return AfterDrain::Park("approving events is off (SPOT_WORKER_APPROVE_EVENTS)".to_owned());
    }
    let Some(vm_name) = vm_name else {
        return AfterDrain::Park("this VM's name is not known".to_owned());
    };
    let scope = if settings.approve_shared_events {
        ApprovalScope::SharedWithThisVm(vm_name.to_owned())
    } else {
        ApprovalScope::ThisVm(vm_name.to_owned())
    };
    match scope.check(event) {
        Ok(()) => AfterDrain::Approve(scope),
        Err(refused) => AfterDrain::Park(refused.to_string()),
    }
}

/// After a drain for an event: approve it, or park until it starts or is
/// withdrawn (see [`after_drain`]), saying why in `readiness`. A signal
/// or request while parked exits at once. Parking disarms the drain's
/// `watchdog`: it has no deadline.
pub(crate) async fn wait_after_drain(
    trigger: &DrainTrigger,
    triggers: &Triggers,
    watcher: Option<&RunningWatcher>,
    watchdog: &mut Option<Watchdog>,
    readiness: &watch::Sender<Readiness>,
    settings: &DrainSettings,
) -> Next {
    let exit = |parked| Next::Exit {
        approve: None,
        parked,
    };
    let (DrainTrigger::Event(_), Some(signal), Some(watcher)) =
        (trigger, triggers.event_signal(), watcher)
    else {
        return exit(false);
    };
    // Re-decided whenever the notice or the document changes: an event
    // that started and finished between two polls only leaves the
    // document, without a new notice.
    let mut notices = signal.clone();
    let mut documents = watcher.document();
    let mut parked = false;
    loop {
        let notice = signal.notice();
        let document = watcher.document().borrow().clone();
        let event = notice.as_ref().and_then(|n| {
            document
                .as_ref()
                .and_then(|d| d.event(&n.event_id).cloned())
        });
        let vm_name = watcher.health().borrow().vm_name.clone();
        let step = after_drain(
            notice.as_ref(),
            event.as_ref(),
            document.as_ref().map(|d| d.incarnation),
            vm_name.as_deref(),
            settings,
        );
        match (step, event) {
            (AfterDrain::Approve(scope), Some(event)) => {
                return Next::Exit {
                    approve: Some(Box::new(ToApprove { event, scope })),
                    parked,
                };
            }
            (AfterDrain::Resume, _) => return Next::Resume,
            (AfterDrain::Wait, _) => {}
            (AfterDrain::Park(why), _) => {
                let described = notice.as_ref().map_or_else(String::new, |n| {
                    format!("{} event {}", n.event_type, n.event_id)
                });
                let reason = format!(
                    "drained for {described}, not approved ({why}); waiting for it to start or be cancelled"
                );
                if !parked {
                    tracing::warn!("{reason}");
                    *watchdog = None;
                }
                readiness.send_modify(|r| r.shutting_down = Some(reason.clone()));
                parked = true;
            }
            (AfterDrain::Exit | AfterDrain::Approve(_), _) => return exit(parked),
        }
        tokio::select! {
            trigger = triggers.external() => {
                tracing::warn!(%trigger, "stopping while waiting for the event");
                return exit(parked);
            }
            changed = notices.changed() => if !changed {
                return exit(parked);
            },
            changed = documents.changed() => if changed.is_err() {
                return exit(parked);
            },
        }
    }
}

/// What the worker does once a drain is over.
pub(crate) enum Next {
    /// Take work again.
    Resume,
    /// Stop: approve this first, if anything.
    Exit {
        approve: Option<Box<ToApprove>>,
        /// Whether it waited for the event after the drain.
        parked: bool,
    },
}

/// The event to approve once the watcher has stopped, and under what scope.
pub(crate) struct ToApprove {
    pub(crate) event: ScheduledEvent,
    pub(crate) scope: ApprovalScope,
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_imds::{EventType, NotBefore};
    use std::time::SystemTime;
    use tokio::time::Instant;

    const VM: &str = "vmss_0";

    fn notice(status: EventStatus, withdrawn: bool) -> Notice {
        Notice {
            event_id: "E".into(),
            event_type: EventType::Reboot,
            status,
            not_before: None,
            deadline: Instant::now(),
            first_seen: SystemTime::now(),
            incarnation: 2,
            withdrawn,
        }
    }

    fn event(status: EventStatus, resources: &[&str]) -> ScheduledEvent {
        ScheduledEvent {
            id: "E".into(),
            event_type: EventType::Reboot,
            status,
            resource_type: "VirtualMachine".into(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            not_before: NotBefore::Unset,
            description: String::new(),
            source: None,
            duration_in_seconds: None,
        }
    }

    #[test]
    fn only_an_event_of_this_vm_alone_is_approved_the_rest_waits() {
        use EventStatus::{Scheduled, Started};
        let defaults = crate::WorkerConfig::default().drain;
        let shared_ok = DrainSettings {
            approve_shared_events: true,
            ..defaults.clone()
        };
        let no_approvals = DrainSettings {
            approve_events: false,
            ..defaults.clone()
        };
        let this = || AfterDrain::Approve(ApprovalScope::ThisVm(VM.into()));
        let parks = |r: &AfterDrain| matches!(r, AfterDrain::Park(_));
        // (case, notice, event, vm name, settings, expected)
        type Row<'a> = (
            &'a str,
            Option<Notice>,
            Option<ScheduledEvent>,
            Option<&'a str>,
            &'a DrainSettings,
            Option<AfterDrain>,
        );
        let table: Vec<Row> = vec![
            (
                "no notice",
                None,
                None,
                Some(VM),
                &defaults,
                Some(AfterDrain::Exit),
            ),
            (
                "this VM alone",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &[VM])),
                Some(VM),
                &defaults,
                Some(this()),
            ),
            (
                "this VM alone, other case",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &["VMSS_0"])),
                Some(VM),
                &defaults,
                Some(this()),
            ),
            (
                "shared",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &[VM, "vmss_1"])),
                Some(VM),
                &defaults,
                None,
            ),
            (
                "shared, opted in",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &[VM, "vmss_1"])),
                Some(VM),
                &shared_ok,
                Some(AfterDrain::Approve(ApprovalScope::SharedWithThisVm(
                    VM.into(),
                ))),
            ),
            (
                "approvals off",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &[VM])),
                Some(VM),
                &no_approvals,
                None,
            ),
            (
                "name unknown",
                Some(notice(Scheduled, false)),
                Some(event(Scheduled, &[VM])),
                None,
                &defaults,
                None,
            ),
            (
                "started",
                Some(notice(Started, false)),
                Some(event(Started, &[VM, "vmss_1"])),
                Some(VM),
                &defaults,
                Some(AfterDrain::Exit),
            ),
            (
                "started, document first",
                Some(notice(Scheduled, false)),
                Some(event(Started, &[VM])),
                Some(VM),
                &defaults,
                Some(AfterDrain::Exit),
            ),
            (
                "gone after it started",
                Some(notice(Started, false)),
                None,
                Some(VM),
                &defaults,
                Some(AfterDrain::Exit),
            ),
            (
                "cancelled",
                Some(notice(Scheduled, true)),
                None,
                Some(VM),
                &defaults,
                Some(AfterDrain::Resume),
            ),
        ];
        for (case, notice, event, vm_name, settings, expected) in table {
            // The document is as new as the notice (incarnation 2).
            let got = after_drain(notice.as_ref(), event.as_ref(), Some(2), vm_name, settings);
            match expected {
                Some(expected) => assert_eq!(got, expected, "{case}"),
                None => assert!(parks(&got), "{case}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_notice_newer_than_the_document_waits_for_the_document() {
        use EventStatus::Scheduled;
        let settings = crate::WorkerConfig::default().drain;
        let pending = notice(Scheduled, false);
        // (case, listed event, document incarnation, expected)
        let table = [
            ("no document yet", None, None, AfterDrain::Wait),
            ("an older document", None, Some(1), AfterDrain::Wait),
            (
                "gone from a document as new",
                None,
                Some(2),
                AfterDrain::Exit,
            ),
            (
                "gone from a newer document",
                None,
                Some(3),
                AfterDrain::Exit,
            ),
            (
                "listed",
                Some(event(Scheduled, &[VM])),
                Some(2),
                AfterDrain::Approve(ApprovalScope::ThisVm(VM.into())),
            ),
        ];
        for (case, listed, incarnation, expected) in table {
            let got = after_drain(
                Some(&pending),
                listed.as_ref(),
                incarnation,
                Some(VM),
                &settings,
            );
            assert_eq!(got, expected, "{case}");
        }
        // A withdrawn notice resumes whatever the document says.
        let withdrawn = notice(Scheduled, true);
        let got = after_drain(Some(&withdrawn), None, Some(1), Some(VM), &settings);
        assert_eq!(got, AfterDrain::Resume);
    }
}
