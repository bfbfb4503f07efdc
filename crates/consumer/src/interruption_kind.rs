//! Which kind of interruption an earlier delivery of a message was, as far
//! as its attempt record shows, decided once for each delivery (pure
//! functions with table tests; `no_outcome` and `finish` act on them).
//!
//! What can be seen of a delivery after the fact is what it wrote to the
//! record, in this order:
//!
//! 1. its **release note** (`releases`), written as the wind-down begins,
//!    within a second of the notice being seen, the handler still running;
//! 2. its **settling** (`released_settled`), written with its tail after
//!    the release: the worker knew then whether its handler had returned
//!    having saved after the notice (saved at the notice), returned without
//!    (drained without a save after it) or was dropped at the release
//!    (notice too late), and counts that kind itself, with what it lost,
//!    only once this write has succeeded.
//!
//! A worker killed between the two (a notice seen already `Started`, the
//! VM gone seconds later) leaves a note nobody settled: a notice was seen,
//! so it was an eviction, and the worker did not live to release the
//! message, so the notice came too late for it. The next delivery counts
//! it as a **late notice**. A worker killed before its note leaves nothing
//! that tells it from a crash: **no outcome**. Each is counted once: the
//! record keeps how many of each were counted (`unsettled_counted`,
//! `no_outcome_counted`), and a settling that finds its note already
//! counted that way (the next delivery read the record before the settling
//! landed) counts nothing more.

use spot_worker_storage::attempts::Attempts;

/// Earlier deliveries not counted yet, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Uncounted {
    /// Noted releases that no worker settled: late notices.
    pub(crate) late: u32,
    /// Deliveries with no recorded outcome at all.
    pub(crate) no_outcome: u32,
}

impl Uncounted {
    /// Whether there is nothing to count.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Uncounted::default()
    }
}

/// Of the `earlier` deliveries (this one's dequeue count less one) that
/// `record` describes, those to count now, by kind:
///
/// - late notices: releases noted, less those settled by their worker,
///   less those counted as late before;
/// - no outcome: deliveries without a note, a failure or a wait
///   ([`Attempts::unexplained`]), less those counted before.
pub(crate) fn uncounted(record: &Attempts, earlier: u32) -> Uncounted {
    Uncounted {
        late: unsettled(record).saturating_sub(record.unsettled_counted),
        no_outcome: record
            .unexplained(earlier)
            .saturating_sub(record.no_outcome_counted),
    }
}

/// Noted releases no worker settled.
fn unsettled(record: &Attempts) -> u32 {
    record.releases.saturating_sub(record.released_settled)
}

/// Whether a worker settling its release (its note written before) may
/// still count the release itself, as `record` (read as it settles)
/// stands: some noted release is neither settled nor counted as late by
/// a later delivery. If not, its note was counted already (or never
/// written): it counts nothing, so nothing is counted twice.
pub(crate) fn own_release_uncounted(record: &Attempts) -> bool {
    unsettled(record) > record.unsettled_counted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        releases: u32,
        released_settled: u32,
        unsettled_counted: u32,
        failures: u32,
        no_outcome_counted: u32,
    ) -> Attempts {
        Attempts {
            releases,
            released_settled,
            unsettled_counted,
            failures,
            no_outcome_counted,
            ..Attempts::default()
        }
    }

    #[test]
    fn each_earlier_delivery_is_counted_once_by_the_kind_its_record_shows() {
        // (record: releases, settled, late counted, failures, no outcome
        // counted; earlier deliveries; late, no outcome to count)
        let rows = [
            // A first delivery: nothing before it.
            (record(0, 0, 0, 0, 0), 0, 0, 0),
            // A crash before any note: no outcome.
            (record(0, 0, 0, 0, 0), 1, 0, 1),
            // A release settled by its worker, which counted it itself.
            (record(1, 1, 0, 0, 0), 1, 0, 0),
            // A note, then the worker was killed: a late notice.
            (record(1, 0, 0, 0, 0), 1, 1, 0),
            // ... counted by an earlier redelivery already.
            (record(1, 0, 1, 0, 0), 2, 0, 1),
            // A failure explains its delivery and is no interruption.
            (record(0, 0, 0, 1, 0), 1, 0, 0),
            // Two settled, one killed after its note, two crashes (one
            // counted before).
            (record(3, 2, 0, 0, 1), 5, 1, 1),
            // More settled than noted (a record from before settlings were
            // kept cannot say this; an odd one): nothing late, never negative.
            (record(1, 3, 0, 0, 0), 1, 0, 0),
            (record(u32::MAX, 0, 0, 0, 0), u32::MAX, u32::MAX, 0),
        ];
        for (record, earlier, late, no_outcome) in rows {
            assert_eq!(
                uncounted(&record, earlier),
                Uncounted { late, no_outcome },
                "{record:?}, {earlier} earlier"
            );
        }
    }

    #[test]
    fn a_settling_counts_its_release_only_if_nobody_counted_it() {
        // (releases, settled, late counted, the settling worker counts)
        let rows = [
            // Its note is there, unsettled, uncounted.
            (1, 0, 0, true),
            // The next delivery read the record first and counted it late.
            (1, 0, 1, false),
            // Its note was never written (the release came first, or the
            // write failed): it stays a delivery without an outcome.
            (0, 0, 0, false),
            (2, 1, 0, true),
            (2, 1, 1, false),
        ];
        for (releases, settled, late_counted, counts) in rows {
            assert_eq!(
                own_release_uncounted(&record(releases, settled, late_counted, 0, 0)),
                counts,
                "releases {releases}, settled {settled}, counted late {late_counted}"
            );
        }
    }
}
