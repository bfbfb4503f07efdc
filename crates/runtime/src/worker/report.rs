//! What a run did, and how the worker stopped.

use std::time::Duration;

use spot_worker_consumer::ConsumerStats;

use crate::shutdown::{DrainTrigger, WATCHDOG_EXIT_CODE};

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// What the consumer did.
    pub stats: ConsumerStats,
    /// How the worker stopped.
    pub drain: DrainReport,
}

impl RunReport {
    /// The process's exit status after this run: 0 when the drain settled
    /// or released every message in time (an eviction is not a failure),
    /// [`WATCHDOG_EXIT_CODE`] when it overran its hard deadline.
    pub fn exit_code(&self) -> i32 {
        if self.drain.met_deadline {
            0
        } else {
            WATCHDOG_EXIT_CODE
        }
    }
}

/// How the worker stopped.
#[derive(Debug, Clone)]
pub struct DrainReport {
    /// What started it.
    pub trigger: DrainTrigger,
    /// From the notice to every message settled or released.
    pub notice_to_drained: Duration,
    /// Whether handlers were still running at the release instant and had
    /// to be dropped.
    pub released_running_handlers: bool,
    /// Whether the drain finished before the hard deadline.
    pub met_deadline: bool,
    /// Whether the triggering event was approved afterwards.
    pub approved_event: bool,
    /// How many times intake resumed because the notice of an earlier drain
    /// was withdrawn (the event cancelled before it started).
    pub resumed: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_released_in_time_is_a_clean_exit() {
        // (trigger, met the deadline, expected status)
        let table = [
            (DrainTrigger::Signal("SIGTERM"), true, 0),
            (DrainTrigger::Requested, true, 0),
            (DrainTrigger::Signal("SIGTERM"), false, WATCHDOG_EXIT_CODE),
        ];
        for (trigger, met_deadline, expected) in table {
            let report = RunReport {
                stats: ConsumerStats::default(),
                drain: DrainReport {
                    trigger: trigger.clone(),
                    notice_to_drained: Duration::from_secs(3),
                    released_running_handlers: true,
                    met_deadline,
                    approved_event: false,
                    resumed: 0,
                },
            };
            assert_eq!(report.exit_code(), expected, "{trigger} {met_deadline}");
        }
    }
}
