//! When to receive: how many free slots the next receive waits for, and for
//! how long at most. Every receive is a storage transaction, so with a
//! backlog the consumer fills its batch instead of asking again the moment
//! one slot frees; with no backlog it asks at once, so an idle worker picks
//! up a released message without delay. Either way it never asks for more
//! messages than it has free slots: a message taken ahead of a free slot
//! would be hidden from idle peers for nothing.

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

/// How many free slots to gather before receiving, and the longest wait
/// for them after the first one is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotWait {
    pub(crate) slots: usize,
    pub(crate) at_most: Duration,
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
        },
        LastReceive::Empty | LastReceive::Partial => SlotWait {
            slots: 1,
            at_most: Duration::ZERO,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILL: Duration = Duration::from_millis(250);

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
                },
            ),
            (
                LastReceive::Full,
                1,
                SlotWait {
                    slots: 1,
                    at_most: FILL,
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
}
