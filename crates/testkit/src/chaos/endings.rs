//! What each VM's ending requires of its drains: a VM the harness
//! Preempted, stopped or saw rebooted must have drained for that trigger
//! and exited 0; a killed one need not have drained; no short Freeze may
//! drain a worker.

use super::fleet::{Ending, VmRecord};

/// What one VM's log says of its drains.
#[derive(Default)]
pub(super) struct Drains {
    /// What triggered each drain.
    pub(super) triggers: Vec<String>,
    /// Each drain's notice-to-drained time, in ms.
    pub(super) times: Vec<u64>,
}

/// The drain that ended a VM, for the figures.
#[derive(Debug, PartialEq)]
pub(super) enum LastDrain {
    AfterPreempt(u64),
    AfterStop(u64),
}

/// A short Freeze must never drain a worker.
pub(super) fn freeze_drains(triggers: &[String]) -> Vec<String> {
    triggers
        .iter()
        .filter(|trigger| trigger.contains("Freeze"))
        .map(|trigger| format!("drained on a short Freeze ({trigger})"))
        .collect()
}

/// What a VM's ending requires of its drains: a VM the harness Preempted,
/// stopped (SIGTERM) or saw rebooted by a shared Reboot must have drained
/// for that trigger and exited 0; a killed one need not have drained; any
/// other ending is a failure. Returns the failures and the drain that ended
/// the VM, for the figures.
pub(super) fn judge_ending(vm: &VmRecord, drains: &Drains) -> (Vec<String>, Option<LastDrain>) {
    let mut failures = Vec::new();
    let ending = match &vm.ending {
        Some(ending @ (Ending::Preempted | Ending::Stopped | Ending::Rebooted)) => ending,
        Some(Ending::Killed) => return (failures, None),
        Some(Ending::Unexpected(why)) => return (vec![why.clone()], None),
        None => return (vec!["still running at the end".to_owned()], None),
    };
    let expected_trigger = match ending {
        Ending::Preempted => "Preempt",
        Ending::Rebooted => "Reboot",
        _ => "SIGTERM",
    };
    if !vm.exit_ok {
        failures.push(format!(
            "exit status {} after {expected_trigger}",
            vm.exit.as_deref().unwrap_or("unknown"),
        ));
    }
    let triggers = &drains.triggers;
    if !triggers.iter().any(|t| t.contains(expected_trigger)) {
        // "shutdown requested" after a Preempt means the worker saw the
        // event's token cancelled but not its notice, and so planned by the
        // drain budget instead of NotBefore and did not approve the event.
        failures.push(format!(
            "no drain triggered by {expected_trigger} (triggers: {triggers:?})"
        ));
    }
    // The last drain ended the process (an earlier one was for a shared
    // Reboot that was cancelled).
    let last = match drains.times.last() {
        Some(ms) if *ending == Ending::Preempted => Some(LastDrain::AfterPreempt(*ms)),
        Some(_) if *ending == Ending::Rebooted => None,
        Some(ms) => Some(LastDrain::AfterStop(*ms)),
        None => {
            failures.push("no \"drained\" log line".to_owned());
            None
        }
    };
    (failures, last)
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A VM record as its supervisor leaves it.
    pub(in crate::chaos) fn vm(ending: Option<Ending>, exit_ok: bool) -> VmRecord {
        VmRecord {
            name: "chaos_0".to_owned(),
            regular: false,
            command: false,
            log: PathBuf::new(),
            ending,
            exit: Some(
                if exit_ok {
                    "exit status: 0"
                } else {
                    "signal: 9"
                }
                .to_owned(),
            ),
            exit_ok,
            ended_at: None,
        }
    }

    fn drains(triggers: &[&str], times: &[u64]) -> Drains {
        Drains {
            triggers: triggers.iter().map(|t| (*t).to_owned()).collect(),
            times: times.to_vec(),
        }
    }

    type Row = (
        Option<Ending>,
        bool,
        Drains,
        Vec<&'static str>,
        Option<LastDrain>,
    );

    #[test]
    fn each_ending_requires_its_own_drain() {
        let preempt = drains(&["Preempt event 1"], &[40]);
        // (ending, exit 0, drains logged, failures, the drain in the figures)
        let table: [Row; 9] = [
            (
                Some(Ending::Preempted),
                true,
                preempt,
                vec![],
                Some(LastDrain::AfterPreempt(40)),
            ),
            (
                Some(Ending::Stopped),
                true,
                drains(&["SIGTERM"], &[10, 30]),
                vec![],
                Some(LastDrain::AfterStop(30)),
            ),
            // A shared Reboot's drain is in no figure.
            (
                Some(Ending::Rebooted),
                true,
                drains(&["Reboot event 2"], &[20]),
                vec![],
                None,
            ),
            (
                Some(Ending::Preempted),
                false,
                drains(&["shutdown requested"], &[]),
                vec![
                    "exit status signal: 9 after Preempt",
                    "no drain triggered by Preempt (triggers: [\"shutdown requested\"])",
                    "no \"drained\" log line",
                ],
                None,
            ),
            (
                Some(Ending::Stopped),
                true,
                drains(&["Reboot event 2"], &[5]),
                vec!["no drain triggered by SIGTERM (triggers: [\"Reboot event 2\"])"],
                Some(LastDrain::AfterStop(5)),
            ),
            (Some(Ending::Killed), false, drains(&[], &[]), vec![], None),
            (
                Some(Ending::Killed),
                false,
                drains(&["SIGTERM"], &[1]),
                vec![],
                None,
            ),
            (
                Some(Ending::Unexpected("exited by itself".to_owned())),
                true,
                drains(&[], &[]),
                vec!["exited by itself"],
                None,
            ),
            (
                None,
                false,
                drains(&[], &[]),
                vec!["still running at the end"],
                None,
            ),
        ];
        for (ending, exit_ok, drains, failures, last) in table {
            let what = format!("{ending:?}");
            assert_eq!(
                judge_ending(&vm(ending, exit_ok), &drains),
                (failures.iter().map(|f| (*f).to_owned()).collect(), last),
                "{what}"
            );
        }
    }

    #[test]
    fn only_freeze_drains_fail() {
        let triggers = ["Preempt event a", "Freeze event b", "SIGTERM"].map(str::to_owned);
        assert_eq!(
            freeze_drains(&triggers),
            ["drained on a short Freeze (Freeze event b)"]
        );
        assert!(freeze_drains(&[]).is_empty());
    }
}
