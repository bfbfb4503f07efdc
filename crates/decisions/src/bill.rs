//! The fleet's bill (issue 39, item 3): what the VMs (or pods) were paid
//! for, split into starting, busy, idle and draining time.
//!
//! Each worker keeps its own [`Tally`], told the moments its life changes
//! (ready, a handler taken or finished, the drain's start, exit), and
//! writes a [`LifetimeRecord`] of it now and then into a record of its own:
//! one per worker, so a thousand workers never write to one document.
//! The figures in a record only grow; the reader sums the records it
//! finds, lane by lane, with [`fleet_bill`].
//!
//! A worker that dies without writing its exit leaves a record that says
//! up to when it was seen: its time counts up to that moment, it is
//! counted as lost once it has been silent for two write periods, and the
//! time it may have run unseen is bounded by one write period each (it
//! would have written again had it lived longer and its store answered).
//!
//! Time is milliseconds since the Unix epoch, given in: this module reads
//! no clock.
//!
//! ```
//! use spot_worker_decisions::bill::{Tally, fleet_bill};
//! use spot_worker_decisions::lanes::Lane;
//!
//! let mut tally = Tally::started(0);
//! tally.ready(60_000); // a minute of warmup
//! tally.took(60_000);
//! tally.finished(660_000); // ten minutes busy
//! tally.draining(720_000); // one idle, then a notice
//! tally.exited(750_000);
//! let record = tally.record("vm-1", "jobs", Lane::Spot, 750_000);
//! let bill = fleet_bill(&[record], 750_000, 300_000);
//! assert_eq!(bill.spot.time.busy_s, 600.0);
//! assert_eq!(bill.spot.time.paid_s(), 750.0);
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::lanes::Lane;

/// How often a serving worker rewrites its record (12 writes an hour): a
/// worker silent for two of these is lost, and the time it may have run
/// unseen is at most one.
pub const WRITE_EVERY: Duration = Duration::from_secs(300);

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// From start to the end of warmup (the gate opening).
    #[default]
    Starting,
    /// Taking work: busy while a handler runs, idle otherwise.
    Serving,
    /// From a stop signal or notice to exit (parked after a drain
    /// included).
    Draining,
    /// Exited: nothing more is paid.
    Exited,
}

/// Seconds of a worker's (or a fleet's) paid time, by what it was doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PaidTime {
    /// From start to ready (warmup).
    pub starting_s: f64,
    /// Ready, with at least one handler running.
    pub busy_s: f64,
    /// Ready, with no handler running.
    pub idle_s: f64,
    /// From the stop signal or notice to exit.
    pub draining_s: f64,
}

impl PaidTime {
    /// All of it: what the VM (or pod) was paid for.
    pub fn paid_s(&self) -> f64 {
        self.starting_s + self.busy_s + self.idle_s + self.draining_s
    }

    /// The sum of two.
    pub fn plus(&self, other: &PaidTime) -> PaidTime {
        PaidTime {
            starting_s: self.starting_s + other.starting_s,
            busy_s: self.busy_s + other.busy_s,
            idle_s: self.idle_s + other.idle_s,
            draining_s: self.draining_s + other.draining_s,
        }
    }
}

/// One worker's lifetime as it last wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LifetimeRecord {
    /// Which worker (unique per process: host, process and start).
    pub worker: String,
    /// The queue it consumed.
    pub queue: String,
    /// The lane it served: what its VM was paid at.
    pub lane: Lane,
    /// When it started, ms since the Unix epoch.
    pub started_ms: u64,
    /// When its warmup ended, if it did.
    pub ready_ms: Option<u64>,
    /// When its (last) drain began, if one did.
    pub draining_ms: Option<u64>,
    /// When it exited, if it wrote so.
    pub exited_ms: Option<u64>,
    /// When it wrote this record: its time counts up to here.
    pub seen_ms: u64,
    /// Where it was then.
    pub phase: Phase,
    /// Its time from start to `seen_ms`.
    pub time: PaidTime,
    /// The VM's size (`compute.vmSize` of instance metadata:
    /// `Standard_D4s_v5`); `None` off Azure, or from a worker that did not
    /// know it (an older version, metadata not answering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_size: Option<String>,
    /// The VM's price class (`compute.priority`: `Spot`, `Regular` or
    /// `Low`); `None` as for `vm_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// A worker's own account of its life: told each change with the time it
/// happened, it adds the time since the last change to the phase it was
/// in. Changes told out of order (a time before the last) add nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    phase: Phase,
    running: u32,
    since_ms: u64,
    started_ms: u64,
    ready_ms: Option<u64>,
    draining_ms: Option<u64>,
    exited_ms: Option<u64>,
    time: PaidTime,
}

impl Tally {
    /// A worker that started at `now_ms`.
    pub fn started(now_ms: u64) -> Self {
        Tally {
            phase: Phase::Starting,
            running: 0,
            since_ms: now_ms,
            started_ms: now_ms,
            ready_ms: None,
            draining_ms: None,
            exited_ms: None,
            time: PaidTime::default(),
        }
    }

    /// The same worker, its starting time counted from `lead_ms` before
    /// its start (its VM's boot: the time before the process ran was paid
    /// too); `started_ms` stays the process's start.
    pub fn booted_before(mut self, lead_ms: u64) -> Self {
        if self.phase == Phase::Starting && self.time == PaidTime::default() {
            self.since_ms = self.since_ms.saturating_sub(lead_ms);
        }
        self
    }

    /// Adds the time since the last change to the current phase.
    fn accrue(&mut self, now_ms: u64) {
        let seconds = now_ms.saturating_sub(self.since_ms) as f64 / 1000.0;
        self.since_ms = self.since_ms.max(now_ms);
        let bucket = match self.phase {
            Phase::Starting => &mut self.time.starting_s,
            Phase::Serving if self.running > 0 => &mut self.time.busy_s,
            Phase::Serving => &mut self.time.idle_s,
            Phase::Draining => &mut self.time.draining_s,
            Phase::Exited => return,
        };
        *bucket += seconds;
    }

    fn enter(&mut self, phase: Phase, now_ms: u64) {
        self.accrue(now_ms);
        self.phase = phase;
    }

    /// The warmup ended (or a withdrawn notice let the worker take work
    /// again): it serves from now.
    pub fn ready(&mut self, now_ms: u64) {
        if self.phase == Phase::Exited {
            return;
        }
        self.ready_ms.get_or_insert(now_ms);
        self.enter(Phase::Serving, now_ms);
    }

    /// A handler started.
    pub fn took(&mut self, now_ms: u64) {
        self.accrue(now_ms);
        self.running = self.running.saturating_add(1);
    }

    /// A handler returned.
    pub fn finished(&mut self, now_ms: u64) {
        self.accrue(now_ms);
        self.running = self.running.saturating_sub(1);
    }

    /// A stop signal or notice: the drain begins.
    pub fn draining(&mut self, now_ms: u64) {
        if matches!(self.phase, Phase::Draining | Phase::Exited) {
            return;
        }
        self.draining_ms = Some(now_ms);
        self.enter(Phase::Draining, now_ms);
    }

    /// The worker exits: its time ends here.
    pub fn exited(&mut self, now_ms: u64) {
        if self.phase == Phase::Exited {
            return;
        }
        self.exited_ms = Some(now_ms);
        self.enter(Phase::Exited, now_ms);
    }

    /// Handlers running now.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Where the worker is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Its time up to `now_ms`, without changing anything.
    pub fn time_at(&self, now_ms: u64) -> PaidTime {
        let mut copy = self.clone();
        copy.accrue(now_ms);
        copy.time
    }

    /// What the worker writes at `now_ms`: its time up to then.
    pub fn record(&mut self, worker: &str, queue: &str, lane: Lane, now_ms: u64) -> LifetimeRecord {
        self.accrue(now_ms);
        LifetimeRecord {
            worker: worker.to_owned(),
            queue: queue.to_owned(),
            lane,
            started_ms: self.started_ms,
            ready_ms: self.ready_ms,
            draining_ms: self.draining_ms,
            exited_ms: self.exited_ms,
            seen_ms: self.exited_ms.unwrap_or(self.since_ms),
            phase: self.phase,
            time: self.time,
            vm_size: None,
            priority: None,
        }
    }
}

/// One lane's part of the bill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaneBill {
    /// Workers with a record.
    pub workers: usize,
    /// Of them, those that wrote their exit.
    pub exited: usize,
    /// Those not exited and seen within two write periods.
    pub running: usize,
    /// Those not exited and silent longer: gone without a word (a VM
    /// deleted, a crash) or cut off from the store.
    pub lost: usize,
    /// Time recorded, up to each worker's last record.
    pub time: PaidTime,
    /// At most this much more was paid unseen: one write period for each
    /// lost worker (it would have written again had it lived on).
    pub unseen_at_most_s: f64,
}

/// The fleet's bill, by lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetBill {
    /// Spot VMs (or pods).
    pub spot: LaneBill,
    /// Regular-priority VMs (or pods).
    pub regular: LaneBill,
}

impl FleetBill {
    /// The lane's part.
    pub fn lane(&self, lane: Lane) -> &LaneBill {
        match lane {
            Lane::Spot => &self.spot,
            Lane::Regular => &self.regular,
        }
    }
}

/// Sums the workers' `records` at `now_ms` into the bill, lane by lane,
/// for workers that write every `period_ms`: a worker is running while
/// its last record is at most two periods old, lost after.
pub fn fleet_bill(records: &[LifetimeRecord], now_ms: u64, period_ms: u64) -> FleetBill {
    let mut bill = FleetBill::default();
    for record in records {
        let lane = match record.lane {
            Lane::Spot => &mut bill.spot,
            Lane::Regular => &mut bill.regular,
        };
        lane.workers += 1;
        lane.time = lane.time.plus(&record.time);
        if record.exited_ms.is_some() || record.phase == Phase::Exited {
            lane.exited += 1;
        } else if now_ms.saturating_sub(record.seen_ms) <= period_ms.saturating_mul(2) {
            lane.running += 1;
        } else {
            lane.lost += 1;
            lane.unseen_at_most_s += period_ms as f64 / 1000.0;
        }
    }
    bill
}

mod by_vm_size;
pub use by_vm_size::{UNKNOWN_VM_SIZE, VmSizeBill, bill_by_vm_size};

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    /// What a worker is told, at a time in seconds.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Ready(u64),
        Took(u64),
        Finished(u64),
        Draining(u64),
        Exited(u64),
    }

    fn tally(steps: &[Step]) -> Tally {
        let mut tally = Tally::started(0);
        for step in steps {
            match *step {
                Step::Ready(t) => tally.ready(t * S),
                Step::Took(t) => tally.took(t * S),
                Step::Finished(t) => tally.finished(t * S),
                Step::Draining(t) => tally.draining(t * S),
                Step::Exited(t) => tally.exited(t * S),
            }
        }
        tally
    }

    #[test]
    fn each_second_goes_to_the_phase_it_was_spent_in() {
        use Step::*;
        // (what happened, seen at, starting, busy, idle, draining)
        let table: [(&[Step], u64, [f64; 4]); 8] = [
            (&[], 30, [30.0, 0.0, 0.0, 0.0]),
            (&[Ready(10)], 30, [10.0, 0.0, 20.0, 0.0]),
            (
                &[Ready(10), Took(20), Finished(50)],
                60,
                [10.0, 30.0, 20.0, 0.0],
            ),
            // Two handlers overlapping: busy while either runs.
            (
                &[Ready(0), Took(10), Took(20), Finished(30), Finished(40)],
                50,
                [0.0, 30.0, 20.0, 0.0],
            ),
            // A notice mid-job: the rest is draining, not busy.
            (
                &[Ready(0), Took(10), Draining(40), Finished(55), Exited(70)],
                100,
                [0.0, 30.0, 10.0, 30.0],
            ),
            // A withdrawn notice: serving again after it.
            (
                &[Ready(5), Draining(15), Ready(25), Took(25), Finished(35)],
                35,
                [5.0, 10.0, 10.0, 10.0],
            ),
            // Stopped before the gate opened.
            (&[Draining(20), Exited(21)], 99, [20.0, 0.0, 0.0, 1.0]),
            // A change told out of order adds nothing negative.
            (
                &[Ready(10), Took(5), Finished(12)],
                12,
                [10.0, 2.0, 0.0, 0.0],
            ),
        ];
        for (steps, seen, [starting, busy, idle, draining]) in table {
            let mut tally = tally(steps);
            let record = tally.record("w", "jobs", Lane::Spot, seen * S);
            let expected = PaidTime {
                starting_s: starting,
                busy_s: busy,
                idle_s: idle,
                draining_s: draining,
            };
            assert_eq!(record.time, expected, "{steps:?}");
            let ends = record.exited_ms.map_or(seen, |ms| ms / S);
            assert_eq!(record.time.paid_s(), ends as f64, "{steps:?}");
        }
    }

    #[test]
    fn a_record_says_when_it_was_seen_and_time_at_changes_nothing() {
        let mut tally = tally(&[Step::Ready(60), Step::Took(60)]);
        assert_eq!(tally.time_at(90 * S).busy_s, 30.0);
        assert_eq!(tally.time_at(90 * S).busy_s, 30.0);
        let record = tally.record("w", "jobs", Lane::Regular, 90 * S);
        assert_eq!((record.seen_ms, record.phase), (90 * S, Phase::Serving));
        assert_eq!((record.ready_ms, record.exited_ms), (Some(60 * S), None));
        // Exited: written later, it still ends at the exit.
        tally.exited(100 * S);
        let last = tally.record("w", "jobs", Lane::Regular, 500 * S);
        assert_eq!((last.seen_ms, last.time.paid_s()), (100 * S, 100.0));
        let json = serde_json::to_string(&last).unwrap();
        let back: LifetimeRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, last);
    }

    fn record(lane: Lane, busy_s: f64, seen_s: u64, exited: bool) -> LifetimeRecord {
        LifetimeRecord {
            worker: format!("w{seen_s}"),
            queue: "jobs".into(),
            lane,
            started_ms: 0,
            ready_ms: Some(0),
            draining_ms: None,
            exited_ms: exited.then_some(seen_s * S),
            seen_ms: seen_s * S,
            phase: if exited {
                Phase::Exited
            } else {
                Phase::Serving
            },
            time: PaidTime {
                busy_s,
                idle_s: seen_s as f64 - busy_s,
                ..PaidTime::default()
            },
            vm_size: None,
            priority: None,
        }
    }

    #[test]
    fn a_boot_before_the_start_is_starting_time_once() {
        // (lead s, ready at s, starting s)
        for (lead, ready, starting) in [(0, 10, 10.0), (90, 10, 100.0), (90, 0, 90.0)] {
            let mut tally = Tally::started(1000 * S).booted_before(lead * S);
            tally.ready((1000 + ready) * S);
            let record = tally.record("w", "jobs", Lane::Spot, (1000 + ready) * S);
            assert_eq!(record.time.starting_s, starting, "{lead} {ready}");
            assert_eq!(record.started_ms, 1000 * S);
        }
        // Told once the worker is ready: too late, nothing changes.
        let mut tally = Tally::started(0);
        tally.ready(5 * S);
        let record = tally
            .booted_before(60 * S)
            .record("w", "jobs", Lane::Spot, 5 * S);
        assert_eq!(record.time.starting_s, 5.0);
    }

    #[test]
    fn the_bill_sums_the_lanes_apart_and_bounds_the_lost_workers() {
        let period = 300 * S;
        // (records, now s, spot: workers/exited/running/lost, busy, idle, unseen)
        type Expected = ([usize; 4], f64, f64, f64);
        let table: [(Vec<LifetimeRecord>, u64, Expected); 5] = [
            (vec![], 1000, ([0, 0, 0, 0], 0.0, 0.0, 0.0)),
            (
                vec![record(Lane::Spot, 100.0, 600, true)],
                10_000,
                ([1, 1, 0, 0], 100.0, 500.0, 0.0),
            ),
            // Seen 600 s ago: within two periods, running.
            (
                vec![record(Lane::Spot, 100.0, 600, false)],
                1200,
                ([1, 0, 1, 0], 100.0, 500.0, 0.0),
            ),
            // Never wrote its exit and silent for longer: lost, its time
            // counted up to its last record, one period unseen at most.
            (
                vec![record(Lane::Spot, 100.0, 600, false)],
                1201,
                ([1, 0, 0, 1], 100.0, 500.0, 300.0),
            ),
            (
                vec![
                    record(Lane::Spot, 100.0, 600, true),
                    record(Lane::Regular, 50.0, 100, true),
                    record(Lane::Spot, 0.0, 200, false),
                    record(Lane::Spot, 30.0, 900, false),
                ],
                1000,
                ([3, 1, 1, 1], 130.0, 1570.0, 300.0),
            ),
        ];
        for (records, now, ([workers, exited, running, lost], busy, idle, unseen)) in table {
            let bill = fleet_bill(&records, now * S, period);
            let spot = bill.lane(Lane::Spot);
            assert_eq!(
                (spot.workers, spot.exited, spot.running, spot.lost),
                (workers, exited, running, lost),
                "{records:?} at {now}"
            );
            assert_eq!((spot.time.busy_s, spot.time.idle_s), (busy, idle));
            assert_eq!(spot.unseen_at_most_s, unseen);
        }
        let mixed = fleet_bill(
            &[
                record(Lane::Spot, 1.0, 10, true),
                record(Lane::Regular, 50.0, 100, true),
            ],
            100 * S,
            period,
        );
        assert_eq!(mixed.regular.workers, 1);
        assert_eq!(mixed.regular.time.paid_s(), 100.0);
        assert_eq!(mixed.spot.time.paid_s(), 10.0);
    }
}
