//! Goodput: where a job's time went, across all its deliveries and VMs.
//!
//! A job's time is the time its deliveries held it (from each receive to
//! the end of its handler), split four ways:
//!
//! - **useful**: handler time, not blocked on a checkpoint save, whose
//!   progress survived (it was saved, or the job finished with it);
//! - **redone**: handler time whose progress was lost, because its
//!   delivery ended (failed, was fenced out, was released) after its last
//!   saved checkpoint: the next delivery computes that progress again;
//! - **checkpointing**: time the handler was blocked in a checkpoint save;
//! - **waiting**: time a delivery held the job before its handler started
//!   (the consumer's reads of the checkpoint, the result marker and the
//!   attempt record). Time the message spent in the queue between
//!   deliveries (a retry's backoff, a lease running out) is no job time.
//!
//! Every figure is a duration measured on one machine's monotonic clock
//! and added up as milliseconds; no timestamp from one VM is ever
//! subtracted from one of another.
//!
//! The ledger travels with the job: each checkpoint save stamps the
//! ledger as it stands (the job's earlier deliveries, plus this one up to
//! the save) into the write's stamp ([`stamp_with`]), so a delivery that
//! is killed keeps what it saved; what a delivery did after its last save
//! (its [`tail`]) is added to the message's attempt record when it ends
//! alive without finishing. The delivery that finishes the job adds its own
//! time to both ([`finished`]).
//!
//! Each delivery runs in one lane (docs/deadlines.md): on a Spot VM, or on
//! regular capacity. [`Ledger::regular_ms`] is the part of the job's time,
//! all four kinds together, that its deliveries on regular capacity held
//! it; the rest was on Spot ([`Ledger::spot_ms`]). A job that never ran on
//! regular capacity has none, and its ledger reads and stamps exactly as
//! before lanes existed.
//!
//! What it cannot see: a delivery cut without a word (a VM lost or killed
//! without notice, a lost lease) loses its tail, so its redone work goes
//! unmeasured; it is at most what that delivery did since its last save
//! (one checkpoint interval), and the ledger counts such deliveries in
//! [`Ledger::unaccounted`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod stamp;

pub use stamp::{split_stamp, stamp_progress, stamp_with, stamp_with_progress};

/// A job's time by kind, in milliseconds, and how many deliveries it
/// covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Handler time whose progress survived.
    #[serde(default)]
    pub useful_ms: u64,
    /// Handler time whose progress was lost and computed again.
    #[serde(default)]
    pub redone_ms: u64,
    /// Time blocked on checkpoint saves.
    #[serde(default)]
    pub checkpointing_ms: u64,
    /// Time a delivery held the job before its handler started.
    #[serde(default)]
    pub waiting_ms: u64,
    /// Deliveries whose time is in this ledger (in whole or up to their
    /// last save).
    #[serde(default)]
    pub deliveries: u32,
    /// Checkpoint saves attempted (each at least one blob write), for the
    /// job's storage cost.
    #[serde(default)]
    pub saves: u32,
    /// Deliveries of the finished job that left nothing in it: cut before
    /// their first save. Set by [`finished`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unaccounted: u32,
    /// Of all the time above (every kind), the milliseconds its deliveries
    /// on regular (not Spot) capacity held the job; see
    /// [`Ledger::spot_ms`] for the rest.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub regular_ms: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_ms(n: &u64) -> bool {
    *n == 0
}

/// The four kinds of time, in the order reports list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeKind {
    /// See [`Ledger::useful_ms`].
    Useful,
    /// See [`Ledger::redone_ms`].
    Redone,
    /// See [`Ledger::checkpointing_ms`].
    Checkpointing,
    /// See [`Ledger::waiting_ms`].
    Waiting,
}

impl TimeKind {
    /// Every kind.
    pub const ALL: [TimeKind; 4] = [
        TimeKind::Useful,
        TimeKind::Redone,
        TimeKind::Checkpointing,
        TimeKind::Waiting,
    ];

    /// The name metrics and reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeKind::Useful => "useful",
            TimeKind::Redone => "redone",
            TimeKind::Checkpointing => "checkpointing",
            TimeKind::Waiting => "waiting",
        }
    }
}

impl Ledger {
    /// The milliseconds of `kind`.
    pub fn ms(&self, kind: TimeKind) -> u64 {
        match kind {
            TimeKind::Useful => self.useful_ms,
            TimeKind::Redone => self.redone_ms,
            TimeKind::Checkpointing => self.checkpointing_ms,
            TimeKind::Waiting => self.waiting_ms,
        }
    }

    /// The seconds of `kind`.
    pub fn seconds(&self, kind: TimeKind) -> f64 {
        self.ms(kind) as f64 / 1000.0
    }

    /// All four kinds, in milliseconds.
    pub fn total_ms(&self) -> u64 {
        TimeKind::ALL
            .iter()
            .fold(0u64, |sum, kind| sum.saturating_add(self.ms(*kind)))
    }

    /// The milliseconds of all four kinds spent on Spot capacity: the
    /// total less [`Ledger::regular_ms`].
    pub fn spot_ms(&self) -> u64 {
        self.total_ms().saturating_sub(self.regular_ms)
    }

    /// Useful time over all time; `None` for a ledger with no time.
    pub fn goodput(&self) -> Option<f64> {
        let total = self.total_ms();
        (total > 0).then(|| self.useful_ms as f64 / total as f64)
    }

    /// This ledger and `other` together.
    pub fn plus(&self, other: &Ledger) -> Ledger {
        Ledger {
            useful_ms: self.useful_ms.saturating_add(other.useful_ms),
            redone_ms: self.redone_ms.saturating_add(other.redone_ms),
            checkpointing_ms: self.checkpointing_ms.saturating_add(other.checkpointing_ms),
            waiting_ms: self.waiting_ms.saturating_add(other.waiting_ms),
            deliveries: self.deliveries.saturating_add(other.deliveries),
            saves: self.saves.saturating_add(other.saves),
            unaccounted: self.unaccounted.saturating_add(other.unaccounted),
            regular_ms: self.regular_ms.saturating_add(other.regular_ms),
        }
    }

    /// This ledger, one delivery's part of a job, with all its time
    /// counted as regular capacity's when the delivery ran there.
    fn in_lane(mut self, regular: bool) -> Ledger {
        self.regular_ms = if regular { self.total_ms() } else { 0 };
        self
    }
}

/// One delivery's clock readings, all measured from its receive on its
/// own machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryTimes {
    /// From the receive to the handler's start (or to now, if it has not
    /// started).
    pub waiting: Duration,
    /// Handler time not blocked on a save.
    pub work: Duration,
    /// Handler time blocked on saves.
    pub checkpointing: Duration,
    /// Saves attempted.
    pub saves: u32,
    /// Whether the delivery ran on regular capacity (the regular lane),
    /// not on a Spot VM.
    pub regular: bool,
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The ledger a save stamps: `carried` (the job's earlier deliveries, as
/// the checkpoint this delivery resumed from said) plus this delivery up
/// to the save's start (`so_far`), all of whose work the save keeps.
pub fn at_save(carried: &Ledger, so_far: &DeliveryTimes) -> Ledger {
    carried.plus(
        &Ledger {
            useful_ms: ms(so_far.work),
            checkpointing_ms: ms(so_far.checkpointing),
            waiting_ms: ms(so_far.waiting),
            deliveries: 1,
            saves: so_far.saves,
            ..Ledger::default()
        }
        .in_lane(so_far.regular),
    )
}

/// What a delivery that ends without finishing the job adds after its
/// last successful save: its work since then is redone, and the rest of
/// its saving and waiting is counted. `saved` is the reading the last
/// save stamped, `None` if no save succeeded (then all of the delivery is
/// in its tail, and it counts as a delivery here).
pub fn tail(total: &DeliveryTimes, saved: Option<&DeliveryTimes>) -> Ledger {
    let since =
        |now: Duration, then: Option<Duration>| ms(now.saturating_sub(then.unwrap_or_default()));
    Ledger {
        useful_ms: 0,
        redone_ms: since(total.work, saved.map(|s| s.work)),
        checkpointing_ms: since(total.checkpointing, saved.map(|s| s.checkpointing)),
        waiting_ms: since(total.waiting, saved.map(|s| s.waiting)),
        deliveries: u32::from(saved.is_none()),
        saves: total
            .saves
            .saturating_sub(saved.map(|s| s.saves).unwrap_or_default()),
        unaccounted: 0,
        regular_ms: 0,
    }
    .in_lane(total.regular)
}

/// The finished job's ledger: what the checkpoint the finishing delivery
/// resumed from carried, the tails its earlier deliveries recorded, and
/// the finishing delivery's whole time (its work is all useful). Of the
/// `dequeue_count` deliveries (`0` when the queue did not say), those in
/// neither are [`Ledger::unaccounted`].
pub fn finished(
    carried: &Ledger,
    tails: &Ledger,
    last: &DeliveryTimes,
    dequeue_count: u32,
) -> Ledger {
    let mut ledger = carried.plus(tails).plus(
        &Ledger {
            useful_ms: ms(last.work),
            checkpointing_ms: ms(last.checkpointing),
            waiting_ms: ms(last.waiting),
            deliveries: 1,
            saves: last.saves,
            ..Ledger::default()
        }
        .in_lane(last.regular),
    );
    ledger.unaccounted = dequeue_count.saturating_sub(ledger.deliveries);
    ledger
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(waiting: u64, work: u64, checkpointing: u64) -> DeliveryTimes {
        DeliveryTimes {
            waiting: Duration::from_millis(waiting),
            work: Duration::from_millis(work),
            checkpointing: Duration::from_millis(checkpointing),
            saves: 0,
            regular: false,
        }
    }

    /// A ledger of these milliseconds and deliveries (also for `stamp`'s tests).
    pub(super) fn ledger(u: u64, r: u64, c: u64, w: u64, d: u32) -> Ledger {
        Ledger {
            useful_ms: u,
            redone_ms: r,
            checkpointing_ms: c,
            waiting_ms: w,
            deliveries: d,
            saves: 0,
            unaccounted: 0,
            regular_ms: 0,
        }
    }

    #[test]
    fn a_tail_is_what_came_after_the_last_save() {
        // (total, last save's reading, tail)
        let rows = [
            // Saved right before the end: nothing redone.
            (
                times(5, 100, 10),
                Some(times(5, 100, 8)),
                ledger(0, 0, 2, 0, 0),
            ),
            // 40 ms of work after the save are lost.
            (
                times(5, 140, 12),
                Some(times(5, 100, 10)),
                ledger(0, 40, 2, 0, 0),
            ),
            // No save at all: all of it, and it counts as a delivery.
            (times(7, 300, 0), None, ledger(0, 300, 0, 7, 1)),
            // A reading later than the total (cannot happen) gives zero,
            // never a wrap-around.
            (
                times(5, 10, 1),
                Some(times(9, 50, 3)),
                ledger(0, 0, 0, 0, 0),
            ),
        ];
        for (total, saved, expected) in rows {
            assert_eq!(
                tail(&total, saved.as_ref()),
                expected,
                "{total:?} {saved:?}"
            );
        }
    }

    #[test]
    fn a_job_evicted_twice_adds_up_across_deliveries() {
        // Delivery 1: waits 10, saves at work 1000 (checkpointing 50 so far),
        // then fails at work 1300 (checkpointing 80): 300 redone.
        let first_save = times(10, 1000, 50);
        let carried_1 = at_save(&Ledger::default(), &first_save);
        assert_eq!(carried_1, ledger(1000, 0, 50, 10, 1));
        let tails = tail(&times(10, 1300, 80), Some(&first_save));
        assert_eq!(tails, ledger(0, 300, 30, 0, 0));
        // Delivery 2 resumes from carried_1, saves at work 500, is killed:
        // its stamp carries it, its tail is lost.
        let carried_2 = at_save(&carried_1, &times(20, 500, 40));
        assert_eq!(carried_2, ledger(1500, 0, 90, 30, 2));
        // Delivery 3 (dequeue count 3) finishes.
        let done = finished(&carried_2, &tails, &times(15, 2000, 60), 3);
        assert_eq!(done, ledger(3500, 300, 180, 45, 3));
        assert_eq!(done.total_ms(), 4025);
        let goodput = done.goodput().unwrap();
        assert!((goodput - 3500.0 / 4025.0).abs() < 1e-12, "{goodput}");
    }

    #[test]
    fn deliveries_that_left_nothing_are_unaccounted() {
        // (carried deliveries, tail deliveries, dequeue count, unaccounted)
        let rows = [
            (0, 0, 1, 0),
            (0, 0, 3, 2),
            (1, 1, 3, 0),
            (2, 0, 5, 2),
            // The queue did not report a count.
            (0, 0, 0, 0),
            // More accounted than delivered (a duplicate's stamps).
            (4, 0, 2, 0),
        ];
        for (carried, tails, dequeue_count, expected) in rows {
            let done = finished(
                &ledger(0, 0, 0, 0, carried),
                &ledger(0, 0, 0, 0, tails),
                &times(0, 1, 0),
                dequeue_count,
            );
            assert_eq!(
                done.unaccounted, expected,
                "{carried} {tails} {dequeue_count}"
            );
        }
    }

    #[test]
    fn time_on_regular_capacity_is_counted_per_delivery() {
        let on = |regular, t: DeliveryTimes| DeliveryTimes { regular, ..t };
        // Delivery 1 on Spot saves at work 1000, is evicted at 1300.
        let saved = times(10, 1000, 50);
        let carried = at_save(&Ledger::default(), &saved);
        assert_eq!((carried.regular_ms, carried.spot_ms()), (0, 1060));
        let tails = tail(&times(10, 1300, 80), Some(&saved));
        assert_eq!(tails.regular_ms, 0);
        // Delivery 2, on regular capacity, saves at work 500 and finishes
        // at 900: all of its 20 + 900 + 40 ms are regular.
        let carried = at_save(&carried, &on(true, times(20, 500, 40)));
        assert_eq!(carried.regular_ms, 560);
        let done = finished(&carried, &tails, &on(true, times(20, 900, 40)), 2);
        assert_eq!(done.regular_ms, 560 + 960);
        assert_eq!(done.spot_ms() + done.regular_ms, done.total_ms());
        // A delivery's tail on regular capacity is regular too.
        let regular_tail = tail(&on(true, times(5, 100, 0)), None);
        assert_eq!(regular_tail.regular_ms, 105);
        // Without any regular time the ledger serializes as before.
        let text = serde_json::to_string(&done.plus(&Ledger::default())).unwrap();
        assert!(text.contains("regular_ms"), "{text}");
        let spot_only = serde_json::to_string(&tails).unwrap();
        assert!(!spot_only.contains("regular_ms"), "{spot_only}");
    }

    #[test]
    fn goodput_is_useful_over_total() {
        assert_eq!(Ledger::default().goodput(), None);
        assert_eq!(ledger(0, 5, 0, 0, 1).goodput(), Some(0.0));
        assert_eq!(ledger(3, 0, 0, 1, 1).goodput(), Some(0.75));
        let huge = ledger(u64::MAX, u64::MAX, 1, 1, u32::MAX);
        assert_eq!(huge.total_ms(), u64::MAX);
        assert_eq!(huge.plus(&huge).deliveries, u32::MAX);
    }
}
