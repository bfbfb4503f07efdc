//! [`SaveClock`]: one delivery's clock, and the hook at the save call that
//! measures the time its job is blocked on saving a checkpoint. What the
//! readings mean, and how a job's deliveries add up, is in
//! [`goodput`](spot_worker_decisions::goodput).
//!
//! Every reading is an [`Instant`] difference on this machine: the clock
//! starts at the delivery's receive, the handler's start is marked, and
//! each save on the job's own key blocks as its [`Blocking`] says, at the
//! instants its [`SaveMeasurement`](super::measure::SaveMeasurement)
//! took: an awaited save from its call to its return (saves in flight at
//! once, two handles, count once, as the time at least one was in flight:
//! the job is blocked, not twice blocked), and the writing a save stores
//! for the time it took, once the save succeeded (so a version saved again
//! after a failed save is not counted twice).
//!
//! What a save keeps is the work up to when its data was written: for a
//! Rust handler, its call (the state it hands over is the state then); for
//! a program's checkpoint file, the version's modification time, which the
//! runner maps onto this clock and passes as the save's `written_at`. The
//! reading a save stamps is taken there, so the work after it is redone if
//! the delivery ends without finishing the job, whenever the runner
//! uploads the version ([`SaveClock::saved_since`] tells a save made after
//! the notice from one before it).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use spot_worker_decisions::goodput::{DeliveryTimes, Ledger, at_save};
use spot_worker_decisions::lanes::reported_share;
use tokio::time::Instant;

use super::measure::Blocking;

/// One delivery's clock, shared by the consumer and the checkpoint handles
/// on the job's own key.
#[derive(Debug)]
pub struct SaveClock {
    received_at: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// What the checkpoint this delivery resumed from carried.
    carried: Ledger,
    handler_started: Option<Instant>,
    /// When the handler stopped: readings stop there.
    handler_ended: Option<Instant>,
    /// Time with at least one save in flight, saves now in flight excluded.
    blocked: Duration,
    in_flight: u32,
    /// When the saves now in flight began to block.
    blocked_since: Option<Instant>,
    /// The reading the latest successful save stamped.
    last_saved: Option<DeliveryTimes>,
    /// When the data of the latest successful save was written (what it
    /// keeps the work up to).
    last_written: Option<Instant>,
    /// Saves attempted (each at least one write request).
    saves: u32,
    /// Whether the delivery runs on regular capacity (the regular lane).
    regular: bool,
    /// Whether saves stamp the job's reported progress (a job with a
    /// deadline: the lane rule reads it).
    stamps_progress: bool,
    /// The share of its work the job last reported done.
    progress: Option<f64>,
    /// The program's progress file as read for the next save (the command
    /// runner reads it as a save begins).
    file_at_save: Option<f64>,
    /// The share reported as of the latest successful save (or what the
    /// checkpoint this delivery resumed from carried).
    saved_progress: Option<f64>,
}

/// A save under way: the reading at its call, and the ledger it stamps.
#[derive(Clone, Copy, Debug)]
pub struct SaveStart {
    reading: DeliveryTimes,
    /// When the data it stores was written.
    written_at: Instant,
    blocking: Blocking,
    /// The job's ledger as of this save's call.
    pub ledger: Ledger,
    /// The progress this save stamps, if it stamps any.
    pub progress: Option<f64>,
}

impl SaveClock {
    /// A clock started at the delivery's receive.
    pub fn new(received_at: Instant) -> Self {
        SaveClock {
            received_at,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets what the job's earlier deliveries left in the checkpoint.
    pub fn carry(&self, ledger: Ledger) {
        self.state().carried = ledger;
    }

    /// What the job's earlier deliveries left in the checkpoint.
    pub fn carried(&self) -> Ledger {
        self.state().carried
    }

    /// Counts this delivery's time as regular capacity's (the worker serves
    /// the regular lane).
    pub fn on_regular_capacity(&self) {
        self.state().regular = true;
    }

    /// Has saves stamp the progress the job reports ([`report_progress`]),
    /// starting from `carried` (what the checkpoint resumed from stamped).
    ///
    /// [`report_progress`]: SaveClock::report_progress
    pub fn track_progress(&self, carried: Option<f64>) {
        let mut state = self.state();
        state.stamps_progress = true;
        state.saved_progress = carried;
    }

    /// The share of its work the job says is done now (0 to 1).
    pub fn report_progress(&self, done: f64) {
        if done.is_finite() {
            self.state().progress = Some(done.clamp(0.0, 1.0));
        }
    }

    /// The program's progress file, read as a save of its checkpoint
    /// begins: the next save stamps it ([`job_progress`]'s first source).
    ///
    /// [`job_progress`]: spot_worker_decisions::lanes::job_progress
    pub fn progress_file_at_save(&self, done: f64) {
        self.state().file_at_save = Some(done);
    }

    /// The share of its work the job had reported done as of its latest
    /// successful save.
    pub fn saved_progress(&self) -> Option<f64> {
        self.state().saved_progress
    }

    /// The job's ledger as of its latest successful save (what the
    /// checkpoint keeps): the useful time the lane rule falls back on.
    pub fn saved_ledger(&self) -> Ledger {
        let state = self.state();
        match state.last_saved {
            Some(saved) => at_save(&state.carried, &saved),
            None => state.carried,
        }
    }

    /// Marks the handler's start: waiting ends, work begins.
    pub fn handler_started(&self) {
        let mut state = self.state();
        if state.handler_started.is_none() {
            state.handler_started = Some(Instant::now());
        }
    }

    /// Marks the handler's end (it returned, or was dropped): what follows
    /// is settling, no time of the job's.
    pub fn handler_ended(&self) {
        let mut state = self.state();
        if state.handler_started.is_some() && state.handler_ended.is_none() {
            state.handler_ended = Some(Instant::now());
        }
    }

    /// The delivery's times now, or at the handler's end once it ended.
    pub fn now(&self) -> DeliveryTimes {
        let state = self.state();
        let at = state.handler_ended.unwrap_or_else(Instant::now);
        self.reading(&state, at, Duration::ZERO)
    }

    /// The job's work so far: what the checkpoint this delivery resumed
    /// from kept of its earlier deliveries, and this delivery's work.
    pub fn job_work(&self) -> Duration {
        let carried = Duration::from_millis(self.carried().useful_ms);
        carried.saturating_add(self.now().work)
    }

    /// The reading the latest successful save stamped, if any.
    pub fn last_saved(&self) -> Option<DeliveryTimes> {
        self.state().last_saved
    }

    /// Whether the latest successful save stored data written at or after
    /// `notice` (a handler that saved after its cancellation, a program
    /// that wrote a new version after its stop signal): the drain saved at
    /// the notice. False without any save.
    pub fn saved_since(&self, notice: Instant) -> bool {
        self.state().last_written.is_some_and(|at| at >= notice)
    }

    /// The reading at `now`, with `written` more blocked time than
    /// committed (the writing of a save not yet known to succeed).
    fn reading(&self, state: &State, now: Instant, written: Duration) -> DeliveryTimes {
        let Some(started) = state.handler_started else {
            return DeliveryTimes {
                waiting: now.saturating_duration_since(self.received_at),
                regular: state.regular,
                ..DeliveryTimes::default()
            };
        };
        let checkpointing = state.blocked
            + written
            + state
                .blocked_since
                .map(|since| now.saturating_duration_since(since))
                .unwrap_or_default();
        DeliveryTimes {
            waiting: started.saturating_duration_since(self.received_at),
            work: now
                .saturating_duration_since(started)
                .saturating_sub(checkpointing),
            checkpointing,
            saves: state.saves,
            regular: state.regular,
        }
    }

    /// The hook at a save's call, `now`, of data written at `written_at`
    /// (`None`: at the call; never later than it): an awaited save starts
    /// blocking; says what ledger the save stamps: the job's time up to
    /// when its data was written (the writing it stores counted as
    /// checkpointing).
    pub fn save_started(
        &self,
        now: Instant,
        blocking: Blocking,
        written_at: Option<Instant>,
    ) -> SaveStart {
        let mut state = self.state();
        state.saves = state.saves.saturating_add(1);
        let written_at = written_at.map_or(now, |at| at.min(now));
        let reading = self.reading(&state, written_at, blocking.written_before);
        if blocking.awaited {
            state.in_flight += 1;
            if state.blocked_since.is_none() {
                state.blocked_since = Some(now);
            }
        }
        SaveStart {
            reading,
            written_at,
            blocking,
            ledger: at_save(&state.carried, &reading),
            progress: state
                .stamps_progress
                .then(|| stamped_share(&mut state))
                .flatten(),
        }
    }

    /// The hook at a save's return, `now`: an awaited save stops blocking;
    /// a save that succeeded adds the writing it stored, and becomes the
    /// latest one.
    pub fn save_ended(&self, start: SaveStart, now: Instant, saved: bool) {
        let mut state = self.state();
        if start.blocking.awaited {
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0
                && let Some(since) = state.blocked_since.take()
            {
                state.blocked += now.saturating_duration_since(since);
            }
        }
        if saved {
            state.blocked += start.blocking.written_before;
            state.last_saved = Some(start.reading);
            if start.progress.is_some() {
                state.saved_progress = start.progress;
            }
            state.last_written = Some(start.written_at);
        }
    }
}

/// The share a save stamps, by the one progress rule: the progress file
/// read for this save, else what the job reported last (else what its
/// checkpoint was stamped with). The file's reading then stands as the
/// job's report until a newer one.
fn stamped_share(state: &mut State) -> Option<f64> {
    let file = state.file_at_save.take();
    let share = reported_share(file, state.progress.or(state.saved_progress));
    if file.is_some() {
        state.progress = share;
    }
    share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_save_stamps_the_file_read_at_it_before_the_handlers_report() {
        let clock = SaveClock::new(Instant::now());
        clock.track_progress(Some(0.1));
        let stamp = |clock: &SaveClock| {
            let start = clock.save_started(Instant::now(), Blocking::CALL, None);
            let progress = start.progress;
            clock.save_ended(start, Instant::now(), true);
            progress
        };
        // Nothing reported yet: what the checkpoint resumed from carried.
        assert_eq!(stamp(&clock), Some(0.1));
        clock.report_progress(0.2);
        assert_eq!(stamp(&clock), Some(0.2));
        // The file read at the save wins over the handler's last report,
        clock.report_progress(0.3);
        clock.progress_file_at_save(0.375);
        assert_eq!(stamp(&clock), Some(0.375));
        // and stands as the job's report until a newer one.
        assert_eq!(stamp(&clock), Some(0.375));
        assert_eq!(clock.saved_progress(), Some(0.375));
        clock.report_progress(0.5);
        assert_eq!(stamp(&clock), Some(0.5));
    }

    #[tokio::test(start_paused = true)]
    async fn saves_block_once_and_the_latest_success_is_kept() {
        let clock = SaveClock::new(Instant::now());
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(clock.now().waiting, Duration::from_millis(30));
        clock.handler_started();
        tokio::time::advance(Duration::from_millis(100)).await;
        let first = clock.save_started(Instant::now(), Blocking::CALL, None);
        assert_eq!(first.ledger.useful_ms, 100);
        assert_eq!(first.ledger.waiting_ms, 30);
        tokio::time::advance(Duration::from_millis(10)).await;
        // A second save in flight at the same time blocks no more.
        let second = clock.save_started(Instant::now(), Blocking::CALL, None);
        tokio::time::advance(Duration::from_millis(10)).await;
        clock.save_ended(first, Instant::now(), true);
        clock.save_ended(second, Instant::now(), false);
        tokio::time::advance(Duration::from_millis(50)).await;
        clock.handler_ended();
        tokio::time::advance(Duration::from_millis(500)).await;
        let now = clock.now();
        assert_eq!(
            (now.waiting, now.work, now.checkpointing),
            (
                Duration::from_millis(30),
                Duration::from_millis(150),
                Duration::from_millis(20)
            )
        );
        // The failed second save is not the latest saved.
        assert_eq!(clock.last_saved().unwrap().work, Duration::from_millis(100));
        assert_eq!(now.saves, 2);
    }

    /// A program's version saved 2.5 s after it was written keeps the
    /// work up to its writing, not up to the upload: the 2.5 s after it
    /// are lost if the delivery ends here; and it was saved before the
    /// notice that came 2 s after it was written.
    #[tokio::test(start_paused = true)]
    async fn a_save_keeps_the_work_up_to_when_its_data_was_written() {
        let clock = SaveClock::new(Instant::now());
        clock.handler_started();
        tokio::time::advance(Duration::from_millis(4000)).await;
        let written_at = Instant::now();
        // The file took 100 ms to write, before its modification time.
        let blocking = Blocking {
            written_before: Duration::from_millis(100),
            awaited: false,
        };
        tokio::time::advance(Duration::from_millis(2000)).await;
        let notice = Instant::now();
        tokio::time::advance(Duration::from_millis(500)).await;
        let save = clock.save_started(Instant::now(), blocking, Some(written_at));
        assert_eq!(
            (save.ledger.useful_ms, save.ledger.checkpointing_ms),
            (3900, 100)
        );
        clock.save_ended(save, Instant::now(), true);
        assert!(!clock.saved_since(notice));
        clock.handler_ended();
        let tail = spot_worker_decisions::goodput::tail(&clock.now(), clock.last_saved().as_ref());
        assert_eq!((tail.redone_ms, tail.checkpointing_ms), (2500, 0));
        // A version written after the notice, or a handler's save after
        // it: saved at the notice. A time after the call is the call's.
        let clock = SaveClock::new(Instant::now());
        clock.handler_started();
        assert!(!clock.saved_since(notice), "nothing saved");
        tokio::time::advance(Duration::from_millis(300)).await;
        let later = Instant::now() + Duration::from_secs(60);
        let save = clock.save_started(Instant::now(), Blocking::CALL, Some(later));
        assert_eq!(save.ledger.useful_ms, 300);
        clock.save_ended(save, Instant::now(), true);
        assert!(clock.saved_since(notice));
        // A failed save changes nothing.
        let clock = SaveClock::new(Instant::now());
        clock.handler_started();
        let save = clock.save_started(Instant::now(), Blocking::CALL, None);
        clock.save_ended(save, Instant::now(), false);
        assert!(!clock.saved_since(notice));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_saved_beside_the_job_counts_once_it_is_saved() {
        let clock = SaveClock::new(Instant::now());
        clock.handler_started();
        tokio::time::advance(Duration::from_millis(1000)).await;
        let written = Blocking {
            written_before: Duration::from_millis(200),
            awaited: false,
        };
        // Its upload fails: the stamp it carried counted the write, the
        // clock does not keep it.
        let failed = clock.save_started(Instant::now(), written, None);
        assert_eq!(failed.ledger.checkpointing_ms, 200);
        tokio::time::advance(Duration::from_millis(30)).await;
        clock.save_ended(failed, Instant::now(), false);
        assert_eq!(clock.now().checkpointing, Duration::ZERO);
        // The same version saved again: counted once, and the uploads
        // themselves (beside the job) are work.
        let again = clock.save_started(Instant::now(), written, None);
        tokio::time::advance(Duration::from_millis(30)).await;
        clock.save_ended(again, Instant::now(), true);
        let now = clock.now();
        assert_eq!(
            (now.work, now.checkpointing, now.saves),
            (Duration::from_millis(860), Duration::from_millis(200), 2)
        );
        assert_eq!(
            clock.last_saved().unwrap().checkpointing,
            Duration::from_millis(200)
        );
    }
}
