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
//!
//! Several workers on one VM (two queues, two programs) share its events:
//! one that approves starts the event for all of them. So a worker approves
//! only once every other worker on the VM has drained (see
//! [`rendezvous`](crate::rendezvous)); until then it holds the approval,
//! not ready and taking nothing, at most until the event's deadline.

use std::time::Duration;

use spot_worker_imds::{ApprovalScope, EventStatus, Notice, RunningWatcher, ScheduledEvent};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::DrainSettings;
use crate::health::Readiness;
use crate::rendezvous::{MemberState, Peers, Rendezvous};
use crate::shutdown::{DrainTrigger, Triggers, Watchdog};

/// The next step after a drain for an event, from what is known now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterDrain {
    /// Approve the event under this scope, then exit.
    Approve(ApprovalScope),
    /// Approve it once the other workers on this VM have drained: the
    /// text says which are still busy (or why that is not known).
    Hold(String),
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
/// name if known, `peers` what the other workers on this VM say. Past the
/// notice's deadline (`now`) nobody's notice is left to protect: peers no
/// longer hold the approval.
pub(crate) fn after_drain(
    notice: Option<&Notice>,
    event: Option<&ScheduledEvent>,
    document_incarnation: Option<u64>,
    vm_name: Option<&str>,
    peers: &Peers,
    now: Instant,
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
    if let Err(refused) = scope.check(event) {
        return AfterDrain::Park(refused.to_string());
    }
    if now >= notice.deadline {
        return AfterDrain::Approve(scope);
    }
    match peers {
        Peers::Drained => AfterDrain::Approve(scope),
        Peers::Busy(busy) => AfterDrain::Hold(format!(
            "{} other worker(s) on this VM not drained yet: {}",
            busy.len(),
            busy.join("; ")
        )),
        Peers::Unknown(why) => AfterDrain::Hold(format!(
            "cannot tell whether the other workers on this VM have drained ({why})"
        )),
    }
}

/// How often a worker holding an approval looks at its peers again.
const PEER_POLL: Duration = Duration::from_millis(200);

/// After a drain for an event: approve it, or park until it starts or is
/// withdrawn (see [`after_drain`]), saying why in `readiness`; tells the
/// other workers on this VM (`rendezvous`) that this one has drained, and
/// that it works again if the notice is withdrawn. A signal or request
/// while parked exits at once. Parking, or holding the approval for
/// peers, disarms the drain's `watchdog`: the wait has no deadline of its
/// own.
pub(crate) async fn wait_after_drain(
    trigger: &DrainTrigger,
    triggers: &Triggers,
    watcher: Option<&RunningWatcher>,
    watchdog: &mut Option<Watchdog>,
    readiness: &watch::Sender<Readiness>,
    rendezvous: &Rendezvous,
    settings: &DrainSettings,
) -> Next {
    rendezvous.set_state(MemberState::Drained).await;
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
    let mut said = String::new();
    loop {
        let notice = signal.notice();
        let document = watcher.document().borrow().clone();
        let event = notice.as_ref().and_then(|n| {
            document
                .as_ref()
                .and_then(|d| d.event(&n.event_id).cloned())
        });
        let vm_name = watcher.health().borrow().vm_name.clone();
        let peers = rendezvous.view().await;
        let step = after_drain(
            notice.as_ref(),
            event.as_ref(),
            document.as_ref().map(|d| d.incarnation),
            vm_name.as_deref(),
            &peers,
            Instant::now(),
            settings,
        );
        let described = notice.as_ref().map_or_else(String::new, |n| {
            format!("{} event {}", n.event_type, n.event_id)
        });
        let mut holding = None;
        match (step, event) {
            (AfterDrain::Approve(scope), Some(event)) => {
                return Next::Exit {
                    approve: Some(Box::new(ToApprove { event, scope })),
                    parked,
                };
            }
            (AfterDrain::Resume, _) => {
                rendezvous.set_state(MemberState::Working).await;
                return Next::Resume;
            }
            (AfterDrain::Wait, _) => {}
            (AfterDrain::Park(why), _) => {
                let reason = format!(
                    "drained for {described}, not approved ({why}); waiting for it to start or be cancelled"
                );
                park(&reason, &mut said, watchdog, readiness);
                parked = true;
            }
            (AfterDrain::Hold(why), _) => {
                let reason = format!(
                    "drained for {described}; approving it once the other workers on this VM have \
                     drained, or at its deadline ({why})"
                );
                park(&reason, &mut said, watchdog, readiness);
                parked = true;
                holding = notice.as_ref().map(|n| n.deadline);
            }
            (AfterDrain::Exit | AfterDrain::Approve(_), _) => return exit(parked),
        }
        let look_again = async {
            match holding {
                // Peers are looked at again shortly, and the deadline ends
                // the wait for them.
                Some(deadline) => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + PEER_POLL)).await
                }
                None => std::future::pending().await,
            }
        };
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
            () = look_again => {}
        }
    }
}

/// Waits, not ready, saying why: in the log when the reason changes, in
/// `/readyz` always; the drain's watchdog is disarmed.
fn park(
    reason: &str,
    said: &mut String,
    watchdog: &mut Option<Watchdog>,
    readiness: &watch::Sender<Readiness>,
) {
    if said != reason {
        tracing::warn!("{reason}");
        reason.clone_into(said);
    }
    *watchdog = None;
    readiness.send_if_modified(|r| {
        let changed = r.shutting_down.as_deref() != Some(reason);
        r.shutting_down = Some(reason.to_owned());
        changed
    });
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
            deadline: Instant::now() + Duration::from_secs(30),
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
            let got = after_drain(
                notice.as_ref(),
                event.as_ref(),
                Some(2),
                vm_name,
                &Peers::Drained,
                Instant::now(),
                settings,
            );
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
                &Peers::Drained,
                Instant::now(),
                &settings,
            );
            assert_eq!(got, expected, "{case}");
        }
        // A withdrawn notice resumes whatever the document says.
        let withdrawn = notice(Scheduled, true);
        let got = after_drain(
            Some(&withdrawn),
            None,
            Some(1),
            Some(VM),
            &Peers::Drained,
            Instant::now(),
            &settings,
        );
        assert_eq!(got, AfterDrain::Resume);
    }

    #[test]
    fn an_approval_waits_for_every_worker_on_the_vm_until_the_deadline() {
        use EventStatus::Scheduled;
        let defaults = crate::WorkerConfig::default().drain;
        let shared_ok = DrainSettings {
            approve_shared_events: true,
            ..defaults.clone()
        };
        let pending = notice(Scheduled, false);
        let deadline = pending.deadline;
        let before = deadline - Duration::from_secs(20);
        let busy = Peers::Busy(vec!["pid 7, queue b".into()]);
        let unknown = Peers::Unknown("no directory".into());
        let this = AfterDrain::Approve(ApprovalScope::ThisVm(VM.into()));
        let holds =
            |r: &AfterDrain, text: &str| matches!(r, AfterDrain::Hold(why) if why.contains(text));
        // (case, resources, peers, now, settings, expected: Ok(step) or Err(text of a hold))
        type Row<'a> = (
            &'a str,
            &'a [&'a str],
            &'a Peers,
            Instant,
            &'a DrainSettings,
            Result<AfterDrain, &'a str>,
        );
        let table: Vec<Row> = vec![
            (
                "alone",
                &[VM],
                &Peers::Drained,
                before,
                &defaults,
                Ok(this.clone()),
            ),
            (
                "a peer busy",
                &[VM],
                &busy,
                before,
                &defaults,
                Err("pid 7, queue b"),
            ),
            (
                "peers unknown",
                &[VM],
                &unknown,
                before,
                &defaults,
                Err("no directory"),
            ),
            (
                "a peer busy at the deadline",
                &[VM],
                &busy,
                deadline,
                &defaults,
                Ok(this.clone()),
            ),
            (
                "peers unknown past the deadline",
                &[VM],
                &unknown,
                deadline + Duration::from_secs(1),
                &defaults,
                Ok(this.clone()),
            ),
            // Scope rules come first: a shared event is not held but parked.
            (
                "shared, a peer busy",
                &[VM, "vmss_1"],
                &busy,
                before,
                &defaults,
                Err(""),
            ),
            (
                "shared, opted in, a peer busy",
                &[VM, "vmss_1"],
                &busy,
                before,
                &shared_ok,
                Err("pid 7"),
            ),
        ];
        for (case, resources, peers, now, settings, expected) in table {
            let got = after_drain(
                Some(&pending),
                Some(&event(Scheduled, resources)),
                Some(2),
                Some(VM),
                peers,
                now,
                settings,
            );
            match expected {
                Ok(step) => assert_eq!(got, step, "{case}"),
                Err("") => assert!(matches!(got, AfterDrain::Park(_)), "{case}: {got:?}"),
                Err(text) => assert!(holds(&got, text), "{case}: {got:?}"),
            }
        }
    }
}
