//! When to receive: how many free slots the next receive waits for, and for
//! how long at most. Every receive is a storage transaction, so with a
//! backlog of short jobs the consumer fills its batch instead of asking
//! again the moment one slot frees; with no backlog it asks at once, so an
//! idle worker picks up a released message without delay, and once slots
//! stop freeing one after the other (long jobs) it asks with what it has.
//! Either way it never asks for more messages than it has free slots: a
//! message taken ahead of a free slot would be hidden from idle peers for
//! nothing.

use std::time::Duration;

/// What the previous receive returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LastReceive {
    /// Nothing yet, nothing, or an error: the queue may be idle.
    Empty,
    /// Fewer messages than asked for: the backlog is gone.
    Partial,
    /// As many as asked for: there is probably more waiting.
    Full,
}

impl LastReceive {
    /// Classifies a receive that asked for `asked` and got `got` messages.
    pub(crate) fn of(asked: usize, got: usize) -> Self {
        match got {
            0 => LastReceive::Empty,
            got if got < asked => LastReceive::Partial,
            _ => LastReceive::Full,
        }
    }
}

/// A pause this long with no slot freeing means the jobs in flight are not
/// short ones finishing one after the other: waiting longer for a full
/// batch would only leave the free slots idle.
pub(crate) const FILL_GAP: Duration = Duration::from_millis(100);

/// How many free slots to gather before receiving, the longest wait for
/// them after the first one is free, and the longest pause between two
/// slots freeing before the consumer receives with what it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotWait {
    pub(crate) slots: usize,
    pub(crate) at_most: Duration,
    pub(crate) gap: Duration,
}

/// The wait before the next receive. `batch` is the most one receive can
/// use (the batch size, capped by the concurrency), `fill_wait` the
/// configured bound. Only after a full receive is a full batch worth
/// waiting for: jobs are then finishing one after the other, and the wait
/// ends as soon as the batch is complete.
pub(crate) fn slot_wait(last: LastReceive, batch: usize, fill_wait: Duration) -> SlotWait {
    match last {
        LastReceive::Full => SlotWait {
            slots: batch.max(1),
            at_most: fill_wait,
            gap: FILL_GAP.min(fill_wait),
        },
        LastReceive::Empty | LastReceive::Partial => SlotWait {
            slots: 1,
            at_most: Duration::ZERO,
            gap: Duration::ZERO,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILL: Duration = Duration::from_secs(1);

    #[test]
    fn a_receive_is_classified_by_what_it_returned() {
        for (asked, got, last) in [
            (32, 0, LastReceive::Empty),
            (32, 5, LastReceive::Partial),
            (32, 32, LastReceive::Full),
            (1, 1, LastReceive::Full),
            (16, 20, LastReceive::Full),
        ] {
            assert_eq!(
                LastReceive::of(asked, got),
                last,
                "{asked} asked, {got} got"
            );
        }
    }

    #[test]
    fn only_a_backlog_waits_for_a_full_batch_and_never_longer_than_the_bound() {
        let at_once = SlotWait {
            slots: 1,
            at_most: Duration::ZERO,
            gap: Duration::ZERO,
        };
        for (last, batch, expected) in [
            // Idle or draining the last few: receive with what is free now.
            (LastReceive::Empty, 32, at_once),
            (LastReceive::Partial, 32, at_once),
            // Backlog: gather a full batch, bounded.
            (
                LastReceive::Full,
                32,
                SlotWait {
                    slots: 32,
                    at_most: FILL,
                    gap: FILL_GAP,
                },
            ),
            (
                LastReceive::Full,
                1,
                SlotWait {
                    slots: 1,
                    at_most: FILL,
                    gap: FILL_GAP,
                },
            ),
        ] {
            assert_eq!(
                slot_wait(last, batch, FILL),
                expected,
                "{last:?}, batch {batch}"
            );
        }
    }

    #[test]
    fn the_gap_never_outlasts_the_whole_wait() {
        for (fill_wait, gap) in [
            (Duration::from_secs(1), FILL_GAP),
            (Duration::from_millis(30), Duration::from_millis(30)),
            (Duration::ZERO, Duration::ZERO),
        ] {
            assert_eq!(
                slot_wait(LastReceive::Full, 32, fill_wait).gap,
                gap,
                "{fill_wait:?}"
            );
        }
    }
}
