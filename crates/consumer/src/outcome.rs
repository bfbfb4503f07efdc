//! [`DeliveryOutcome`]: what became of a delivery, as the consumer counts it, and
//! the [`SettlementObserver`] that hears of each one as it is counted, so
//! telemetry reports exactly what [`ConsumerStats`](super::ConsumerStats)
//! counts instead of guessing from a handler's return value.

use std::sync::Arc;

use super::Consumer;
use super::stats::bump;

/// What the consumer did with one delivery; each is counted in one field of
/// [`ConsumerStats`](super::ConsumerStats) at the moment the storage call
/// that carried it out succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryOutcome {
    /// Handled successfully and deleted.
    Succeeded,
    /// Deleted without running the handler: the job's checkpoint was
    /// completed.
    SkippedCompleted,
    /// The handler failed; the failure is recorded and the message retried
    /// after a backoff.
    Retried,
    /// Moved to the poison queue.
    Poisoned {
        /// The handler failed (too often, or permanently), as opposed to a
        /// body that does not decode or the crash-loop guard.
        handler_failed: bool,
    },
    /// Made visible again at once, uncounted: the worker is draining (a
    /// Spot eviction) or the queue returned more than was asked for.
    Released,
    /// Fenced out by another holder of the job; checked again later,
    /// uncounted.
    WaitedForPeer,
    /// The checkpoint store could not be reached; tried again later,
    /// uncounted.
    WaitedForStore,
    /// Another consumer took the message; nothing was written.
    LeaseLost,
    /// Handed to the other lane (a job with a deadline: sent to the other
    /// lane's queue, then deleted here), uncounted.
    Moved,
    /// Deleted unrun: an older copy of a job moved between lanes.
    Superseded,
    /// Deleted unrun: a probe for Spot capacity (`spot-worker-probe/1`),
    /// on a worker with lanes.
    ProbeTaken,
}

impl DeliveryOutcome {
    /// Whether the consumer counts this as a handler failure (towards the
    /// poison queue): a retry, or poison after the handler failed. An
    /// eviction, a wait or a lost lease never is.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            DeliveryOutcome::Retried
                | DeliveryOutcome::Poisoned {
                    handler_failed: true
                }
        )
    }
}

/// Told of every [`DeliveryOutcome`] as it is counted, inside the delivery's span
/// (see [`Consumer::with_message_span`]); the runtime's telemetry is one.
/// It runs on the consumer's tasks: keep it quick and non-blocking.
pub type SettlementObserver = Arc<dyn Fn(DeliveryOutcome) + Send + Sync>;

impl Consumer {
    /// Counts `outcome` in the statistics and tells the observer.
    pub(super) fn settled(&self, outcome: DeliveryOutcome) {
        let counters = &self.counters;
        bump(match outcome {
            DeliveryOutcome::Succeeded => &counters.succeeded,
            DeliveryOutcome::SkippedCompleted => &counters.skipped_completed,
            DeliveryOutcome::Retried => &counters.retried,
            DeliveryOutcome::Poisoned { .. } => &counters.poisoned,
            DeliveryOutcome::Released => &counters.released,
            DeliveryOutcome::WaitedForPeer => &counters.waited_for_peer,
            DeliveryOutcome::WaitedForStore => &counters.waited_for_store,
            DeliveryOutcome::LeaseLost => &counters.leases_lost,
            DeliveryOutcome::Moved => &counters.moved,
            DeliveryOutcome::Superseded => &counters.superseded,
            DeliveryOutcome::ProbeTaken => &counters.probes_taken,
        });
        if let Some(observer) = &self.observer {
            observer(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_handler_failures_are_failures() {
        let table = [
            (DeliveryOutcome::Succeeded, false),
            (DeliveryOutcome::SkippedCompleted, false),
            (DeliveryOutcome::Retried, true),
            (
                DeliveryOutcome::Poisoned {
                    handler_failed: true,
                },
                true,
            ),
            (
                DeliveryOutcome::Poisoned {
                    handler_failed: false,
                },
                false,
            ),
            (DeliveryOutcome::Released, false),
            (DeliveryOutcome::WaitedForPeer, false),
            (DeliveryOutcome::WaitedForStore, false),
            (DeliveryOutcome::LeaseLost, false),
            (DeliveryOutcome::Moved, false),
            (DeliveryOutcome::Superseded, false),
            (DeliveryOutcome::ProbeTaken, false),
        ];
        for (outcome, failure) in table {
            assert_eq!(outcome.is_failure(), failure, "{outcome:?}");
        }
    }
}
