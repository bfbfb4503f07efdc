//! The simulated fleet: workers doing long jobs, checkpointing under a
//! policy, interrupted by a trace. The adaptive policy is the real one:
//! each worker holds a [`CheckpointCadence`] (the type handlers ask), feeds
//! it the saves it measures, the interruptions it sees and when each
//! delivery starts and ends, and adds its counts (with the running
//! delivery's job time so far) to the fleet's every [`FLUSH_EVERY`] as the
//! ledger does (a sum), reading back the fleet's total.
//!
//! What each interruption does, as in the worker:
//!
//! - a usable notice: a handler that saves at the notice
//!   ([`Behaviour::SavesAtNotice`]) saves the progress made since the last
//!   save (one more save), and the worker counts the drain as saved; one
//!   that saves on its own schedule and dies on the signal
//!   ([`Behaviour::DiesOnSignal`], a program without a handler for it)
//!   loses the work since its last save, and the worker counts the drain as
//!   one that lost work, with that loss. Either way the worker adds its
//!   counts to the fleet's as it stops, and a fresh worker (nothing measured
//!   yet, the fleet's counts read) takes the job over;
//! - notice too late: the work since the last save is lost; counted and
//!   added likewise;
//! - no outcome (a crash): the work is lost, and so is what the crashed
//!   worker had not added yet; its successor finds the delivery without an
//!   outcome in the message's attempt record and counts it.
//!
//! Restarting (a new VM, the redelivery) takes the same time under every
//! policy and is left out; so is the time to write a job's final result.
//!
//! Jobs are all of one length ([`JobModel::Fixed`]) or of lengths drawn
//! log-uniformly from a range ([`JobModel::Mixed`]); the k-th job a worker
//! slot starts has the same length under every policy of a cell. Each
//! finished job's length (its work) is counted in the fleet's job lengths,
//! which [`Knows::Lengths`] spreads its saves by.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spot_worker::decisions::cadence::{
    CheckpointCadence, FLUSH_EVERY, Interruption, InterruptionCounts, IntervalSource, SaveCost,
    adaptive_interval,
};
use std::time::Duration;
use tokio::time::Instant;

use super::trace::{Cell, Event, cost_noise};

/// What the handler does with a usable notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// It saves its progress (`primes`, a program that saves on SIGTERM).
    SavesAtNotice,
    /// It saves on its own schedule only and dies on the stop signal (a
    /// training loop saving each epoch): the work since its last save is
    /// lost, the notice or not.
    DiesOnSignal,
}

/// How long jobs are.
#[derive(Clone, Copy, Debug)]
pub enum JobModel {
    /// All of this many seconds of work.
    Fixed(f64),
    /// Drawn log-uniformly between these many seconds of work.
    Mixed { shortest: f64, longest: f64 },
}

impl JobModel {
    /// One job's work, in seconds.
    fn draw(&self, rng: &mut StdRng) -> f64 {
        match *self {
            JobModel::Fixed(work) => work,
            JobModel::Mixed { shortest, longest } => {
                shortest * (longest / shortest).powf(rng.random::<f64>())
            }
        }
    }
}

/// What an adaptive policy knows of a job's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knows {
    /// Nothing: Daly's interval (`JobCheckpoint::is_due` before the fleet's
    /// job lengths were learned).
    Nothing,
    /// The job's own end: the interval spread over the rest of it
    /// (`is_due_before_end`, a program's progress file).
    End,
    /// The lengths of the jobs the fleet finished: the interval spread over
    /// the rest a job that has done this much is expected to need
    /// (`CheckpointCadence::interval_in_job`, what `is_due` does now).
    Lengths,
}

/// A checkpoint policy under test.
#[derive(Clone, Copy, Debug)]
pub enum Policy {
    /// Save every so many seconds of work.
    Fixed(f64),
    /// The adaptive interval, from this seed rate; `ignore_notice` counts
    /// every eviction as losing work (Daly without the notice); `knows`:
    /// what it knows of the job's end.
    Adaptive {
        seed: f64,
        ignore_notice: bool,
        knows: Knows,
        /// The fleet's counts start with a long history at the cell's
        /// true rates (nothing left to learn; separates learning from the
        /// model).
        history: bool,
    },
}

/// What a policy cost over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    /// Work kept, seconds.
    pub useful: f64,
    /// Time spent saving, seconds.
    pub checkpointing: f64,
    /// Work lost (and saves cut short) by interruptions, seconds.
    pub lost: f64,
    /// Checkpoint writes, drain saves included.
    pub writes: u64,
    /// Jobs finished.
    pub jobs: u64,
    /// The interval the first worker had at the end, seconds.
    pub last_interval: f64,
}

impl Totals {
    /// These totals and `other`'s (another fleet's); the last interval is
    /// this one's.
    pub fn plus(&self, other: &Totals) -> Totals {
        Totals {
            useful: self.useful + other.useful,
            checkpointing: self.checkpointing + other.checkpointing,
            lost: self.lost + other.lost,
            writes: self.writes + other.writes,
            jobs: self.jobs + other.jobs,
            last_interval: self.last_interval,
        }
    }

    /// (saving + lost) / useful.
    pub fn overhead(&self) -> f64 {
        (self.checkpointing + self.lost) / self.useful
    }

    /// Checkpoint writes per finished job.
    pub fn writes_per_job(&self) -> f64 {
        self.writes as f64 / self.jobs.max(1) as f64
    }
}

/// A million job-hours of counts at `cell`'s rates and cost, for a
/// handler that behaves as `behaviour` says.
fn history_at(cell: &Cell, behaviour: Behaviour) -> InterruptionCounts {
    const HOURS: f64 = 1e6;
    let evictions = cell.evictions_per_hour * HOURS;
    let usable = (evictions * cell.usable_share).round() as u64;
    let (drained, unsaved) = match behaviour {
        Behaviour::SavesAtNotice => (usable, 0),
        Behaviour::DiesOnSignal => (0, usable),
    };
    InterruptionCounts {
        drained,
        unsaved,
        late: (evictions * (1.0 - cell.usable_share)).round() as u64,
        no_outcome: (cell.crashes_per_hour * HOURS).round() as u64,
        job_seconds: HOURS * 3600.0,
        saves: 1_000_000,
        save_seconds: 1e6 * cell.cost,
        ..InterruptionCounts::default()
    }
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Working { done: f64 },
    Saving { covered: f64, spent: f64 },
}

struct Worker {
    now: f64,
    phase: Phase,
    /// Work of the current job saved so far.
    banked: f64,
    /// The current job's work, seconds.
    job_work: f64,
    tau: f64,
    cadence: Option<CheckpointCadence>,
}

/// One run of `policy` over `traces`, for handlers that behave as
/// `behaviour` says, with jobs as `jobs` says.
pub struct Sim<'a> {
    cell: Cell,
    policy: Policy,
    behaviour: Behaviour,
    jobs: JobModel,
    fleet: InterruptionCounts,
    totals: Totals,
    rng: StdRng,
    /// Each worker slot's job lengths, in the order it starts them: the
    /// same for every policy.
    job_rngs: Vec<StdRng>,
    traces: &'a [Vec<Event>],
    /// The simulated clock's zero, for the cadence's job time.
    base: Instant,
}

impl<'a> Sim<'a> {
    pub fn new(
        cell: Cell,
        policy: Policy,
        behaviour: Behaviour,
        jobs: JobModel,
        traces: &'a [Vec<Event>],
        seed: u64,
    ) -> Self {
        Sim {
            cell,
            policy,
            behaviour,
            jobs,
            fleet: match policy {
                Policy::Adaptive { history: true, .. } => history_at(&cell, behaviour),
                _ => InterruptionCounts::default(),
            },
            totals: Totals::default(),
            rng: StdRng::seed_from_u64(seed),
            job_rngs: (0..traces.len() as u64)
                .map(|slot| StdRng::seed_from_u64(seed ^ 0x10b5 ^ slot.wrapping_mul(0x9e37_79b9)))
                .collect(),
            traces,
            base: Instant::now(),
        }
    }

    /// The next job's work for worker slot `slot`.
    fn next_job(&mut self, slot: usize) -> f64 {
        self.jobs.draw(&mut self.job_rngs[slot])
    }

    /// The simulated time `seconds` as an instant.
    fn at(&self, seconds: f64) -> Instant {
        self.base + Duration::from_secs_f64(seconds)
    }

    /// Runs every worker for `hours`.
    pub fn run(mut self, hours: f64) -> Totals {
        let end = hours * 3600.0;
        // A fixed interval learns nothing: one pass per worker.
        let epoch = match self.policy {
            Policy::Fixed(_) => end,
            Policy::Adaptive { .. } => FLUSH_EVERY.as_secs_f64(),
        };
        let mut workers: Vec<Worker> = (0..self.traces.len())
            .map(|slot| {
                let work = self.next_job(slot);
                self.fresh_worker(0.0, work, 0.0)
            })
            .collect();
        let traces = self.traces;
        let mut next_event = vec![0_usize; traces.len()];
        let mut from = 0.0;
        while from < end {
            let to = (from + epoch).min(end);
            for (index, worker) in workers.iter_mut().enumerate() {
                let trace = &traces[index];
                while let Some(event) = trace.get(next_event[index]).filter(|e| e.at < to) {
                    self.advance(index, worker, event.at - worker.now);
                    self.interrupt(worker, event.kind);
                    next_event[index] += 1;
                }
                self.advance(index, worker, to - worker.now);
                if let Some(cadence) = &worker.cadence {
                    // The running delivery's time so far is added too.
                    self.fleet = self.fleet.plus(&cadence.take_pending_at(self.at(to)));
                    cadence.set_fleet(self.fleet);
                }
                self.retune(worker);
            }
            from = to;
        }
        self.totals.last_interval = workers.first().map_or(0.0, |w| w.tau);
        self.totals
    }

    /// A fresh worker taking over (or starting) a job of `job_work` with
    /// `banked` of it saved.
    fn fresh_worker(&mut self, now: f64, job_work: f64, banked: f64) -> Worker {
        let cadence = match self.policy {
            Policy::Fixed(_) => None,
            Policy::Adaptive { seed, .. } => {
                let cadence = CheckpointCadence::new(IntervalSource::Adaptive {
                    seed_evictions_per_hour: seed,
                });
                cadence.set_fleet(self.fleet);
                cadence.job_started(self.at(now));
                Some(cadence)
            }
        };
        let mut worker = Worker {
            now,
            phase: Phase::Working { done: 0.0 },
            banked,
            job_work,
            tau: 0.0,
            cadence,
        };
        self.retune(&mut worker);
        worker
    }

    /// Asks the policy for the interval now.
    fn retune(&self, worker: &mut Worker) {
        worker.tau = match (self.policy, &worker.cadence) {
            (Policy::Fixed(tau), _) => tau,
            (
                Policy::Adaptive {
                    ignore_notice: true,
                    ..
                },
                Some(cadence),
            ) => {
                let view = cadence.view();
                adaptive_interval(
                    view.cost.estimate(),
                    view.estimates.losing_per_hour_ignoring_the_notice(),
                )
                .as_secs_f64()
            }
            (
                Policy::Adaptive {
                    knows: Knows::End, ..
                },
                Some(cadence),
            ) => {
                // The work from the last save to the job's end.
                let left = worker.job_work - worker.banked;
                cadence
                    .interval_before_end(Duration::from_secs_f64(left.max(0.0)))
                    .as_secs_f64()
            }
            (
                Policy::Adaptive {
                    knows: Knows::Lengths,
                    ..
                },
                Some(cadence),
            ) => {
                // What the handle asks: the time since its last save and
                // the job's work so far.
                let since = match worker.phase {
                    Phase::Working { done } => done,
                    Phase::Saving { covered, .. } => covered,
                };
                cadence
                    .interval_in_job(
                        Duration::from_secs_f64(since),
                        Duration::from_secs_f64(worker.banked + since),
                    )
                    .as_secs_f64()
            }
            (Policy::Adaptive { .. }, Some(cadence)) => cadence.interval().as_secs_f64(),
            (Policy::Adaptive { .. }, None) => unreachable!("adaptive workers have a cadence"),
        };
    }

    fn record_save(&mut self, worker: &Worker) {
        if let Some(cadence) = &worker.cadence {
            let blocked = self.cell.cost * cost_noise(&mut self.rng);
            cadence.record_save(SaveCost {
                blocked: Duration::from_secs_f64(blocked),
                requests: 1,
                bytes: 100,
            });
        }
    }

    /// The delivery ends; with `next`, the worker starts the next job.
    fn end_delivery(&self, worker: &mut Worker, next: bool) {
        if let Some(cadence) = &worker.cadence {
            cadence.job_ended(self.at(worker.now));
            if next {
                cadence.job_started(self.at(worker.now));
            }
        }
    }

    /// Runs `worker` (of slot `slot`) for `d` seconds without interruption.
    fn advance(&mut self, slot: usize, worker: &mut Worker, mut d: f64) {
        let cost = self.cell.cost;
        while d > 0.0 {
            let tau = worker.tau;
            match worker.phase {
                Phase::Saving { covered, spent } => {
                    let left = cost - spent;
                    if d < left {
                        worker.phase = Phase::Saving {
                            covered,
                            spent: spent + d,
                        };
                        worker.now += d;
                        return;
                    }
                    d -= left;
                    worker.now += left;
                    self.totals.useful += covered;
                    self.totals.checkpointing += cost;
                    self.totals.writes += 1;
                    worker.banked += covered;
                    worker.phase = Phase::Working { done: 0.0 };
                    self.record_save(worker);
                    self.retune(worker);
                }
                Phase::Working { done } => {
                    let remaining = worker.job_work - worker.banked;
                    // (within a microsecond: an interval spread over the
                    // job divides it exactly, but for rounding)
                    if remaining <= tau.max(done) + 1e-6 {
                        // The job ends before another save.
                        let to_end = remaining - done;
                        if d < to_end {
                            worker.phase = Phase::Working { done: done + d };
                            worker.now += d;
                            return;
                        }
                        d -= to_end;
                        worker.now += to_end;
                        self.totals.useful += remaining;
                        self.totals.jobs += 1;
                        if let Some(cadence) = &worker.cadence {
                            // Its completion record's useful time.
                            cadence.note_job_length(Duration::from_secs_f64(worker.job_work));
                        }
                        worker.banked = 0.0;
                        worker.job_work = self.next_job(slot);
                        worker.phase = Phase::Working { done: 0.0 };
                        self.end_delivery(worker, true);
                        // The next job asks for its interval.
                        self.retune(worker);
                        continue;
                    }
                    let cycle = tau + cost;
                    if done == 0.0 && d >= cycle {
                        // Whole cycles at once: save k ends when remaining − kτ > τ.
                        // An adaptive policy is asked again after every save,
                        // as a handler or the runner asks it: its answer can
                        // change with the save (a worker's first measures the
                        // cost), so its cycles run one at a time.
                        let allowed = ((remaining - 1e-6) / tau).ceil() - 1.0;
                        let cycles = match self.policy {
                            Policy::Fixed(_) => (d / cycle).floor().min(allowed).max(1.0),
                            Policy::Adaptive { .. } => 1.0,
                        };
                        d -= cycles * cycle;
                        worker.now += cycles * cycle;
                        self.totals.useful += cycles * tau;
                        self.totals.checkpointing += cycles * cost;
                        self.totals.writes += cycles as u64;
                        worker.banked += cycles * tau;
                        for _ in 0..(cycles as u64).min(3) {
                            self.record_save(worker);
                        }
                        self.retune(worker);
                        continue;
                    }
                    let to_save = (tau - done).max(0.0);
                    if d < to_save {
                        worker.phase = Phase::Working { done: done + d };
                        worker.now += d;
                        return;
                    }
                    d -= to_save;
                    worker.now += to_save;
                    worker.phase = Phase::Saving {
                        covered: done + to_save,
                        spent: 0.0,
                    };
                }
            }
        }
    }

    /// An interruption of `kind` hits `worker` now.
    fn interrupt(&mut self, worker: &mut Worker, kind: Interruption) {
        let at_risk = match worker.phase {
            Phase::Working { done } => (done, 0.0),
            Phase::Saving { covered, spent } => (covered, spent),
        };
        // A usable notice saves only for a handler that saves at it; for
        // one that dies on the signal it is a drain that lost its work.
        let kind = match (kind, self.behaviour) {
            (Interruption::Drained, Behaviour::DiesOnSignal) => Interruption::Unsaved,
            (kind, _) => kind,
        };
        match kind {
            Interruption::Drained => {
                if at_risk.0 > 0.0 {
                    // The drain's save: what was done is kept.
                    self.totals.useful += at_risk.0;
                    self.totals.checkpointing += self.cell.cost;
                    self.totals.writes += 1;
                    worker.banked += at_risk.0;
                    self.record_save(worker);
                }
            }
            Interruption::Unsaved | Interruption::Late | Interruption::NoOutcome => {
                self.totals.lost += at_risk.0 + at_risk.1;
            }
        }
        let now = worker.now;
        let (banked, job_work) = (worker.banked, worker.job_work);
        match kind {
            Interruption::Drained | Interruption::Unsaved | Interruption::Late => {
                self.end_delivery(worker, false);
                if let Some(cadence) = &worker.cadence {
                    match kind {
                        // The worker measures what it lost: its tail.
                        Interruption::Drained => cadence.note(kind),
                        _ => cadence.note_loss(kind, Duration::from_secs_f64(at_risk.0)),
                    }
                    self.fleet = self.fleet.plus(&cadence.take_pending_at(self.at(now)));
                }
                // The successor resumes the job from what was saved.
                *worker = self.fresh_worker(now, job_work, banked);
            }
            Interruption::NoOutcome => {
                // What the crashed worker had not added (its job time since
                // its last addition, its counts) is gone; its successor
                // counts the delivery without an outcome.
                *worker = self.fresh_worker(now, job_work, banked);
                if let Some(cadence) = &worker.cadence {
                    cadence.note(Interruption::NoOutcome);
                }
            }
        }
        self.retune(worker);
    }
}
