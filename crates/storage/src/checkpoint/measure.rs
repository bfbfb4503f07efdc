//! [`SaveMeasurement`]: the one measurement of each checkpoint save, taken
//! in one place on one clock, and handed to both that use it: the
//! delivery's [`SaveClock`] (the job's goodput ledger, where the time is
//! checkpointing rather than work) and the worker's
//! [`CheckpointCadence`] (the interval's C, and the requests and bytes
//! saves cost).
//!
//! What a save blocks depends on who waits for it ([`Blocking`]): a Rust
//! handler awaits [`JobCheckpoint::save`](crate::JobCheckpoint::save), so
//! its job is blocked from the call to the return; a program under
//! `spot-worker run` is blocked while it writes its checkpoint file, and
//! the runner's upload of that file runs beside it (money, not time),
//! except the last one, which its delivery waits for.

use std::sync::Arc;
use std::time::Duration;

use spot_worker_decisions::cadence::{CheckpointCadence, SaveCost};
use spot_worker_decisions::goodput::Ledger;
use tokio::time::Instant;

use super::save_clock::{SaveClock, SaveStart};

/// What one save blocks: the job's own writing of what is saved, before
/// the save's call, and whether the job (or its delivery) then waits for
/// the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// How long writing what this save stores blocked the job before the
    /// call (a program writing its checkpoint file), measured by the
    /// caller; zero when the save's call is all there is.
    pub written_before: Duration,
    /// Whether the job waits for the call (a handler awaiting it; the
    /// runner's last save, after its program ended): then the call's time
    /// is blocked time too. An upload that runs beside the job is not.
    pub awaited: bool,
}

impl Blocking {
    /// A save whose caller waits for it, and nothing more: a Rust handler's.
    pub const CALL: Blocking = Blocking {
        written_before: Duration::ZERO,
        awaited: true,
    };

    /// The time this save blocked the job, for a call that took `call`.
    pub fn blocked(&self, call: Duration) -> Duration {
        let awaited = if self.awaited { call } else { Duration::ZERO };
        self.written_before.saturating_add(awaited)
    }
}

/// One save being measured, from its call to its return.
pub(crate) struct SaveMeasurement {
    blocking: Blocking,
    started: Instant,
    requests_before: u64,
    bytes: u64,
    clock: Option<(Arc<SaveClock>, SaveStart)>,
}

impl SaveMeasurement {
    /// Starts measuring a save of `bytes` at its call, by a handle that
    /// sent `requests_before` requests so far, timed on the delivery's
    /// `clock` if it has one; the data it stores was written at
    /// `written_at` (`None`: at the call).
    pub(crate) fn start(
        blocking: Blocking,
        clock: Option<&Arc<SaveClock>>,
        requests_before: u64,
        bytes: u64,
        written_at: Option<Instant>,
    ) -> Self {
        let started = Instant::now();
        let clock = clock.map(|clock| {
            (
                Arc::clone(clock),
                clock.save_started(started, blocking, written_at),
            )
        });
        SaveMeasurement {
            blocking,
            started,
            requests_before,
            bytes,
            clock,
        }
    }

    /// The job's ledger as of this save's call, for its stamp; `None`
    /// without a clock.
    pub(crate) fn ledger(&self) -> Option<Ledger> {
        self.clock.as_ref().map(|(_, start)| start.ledger)
    }

    /// The progress this save stamps: a job with a deadline's, as it last
    /// reported it; `None` otherwise.
    pub(crate) fn progress(&self) -> Option<f64> {
        self.clock.as_ref().and_then(|(_, start)| start.progress)
    }

    /// Ends the measurement at the save's return, by a handle that has
    /// now sent `requests_now` requests: the clock stops blocking, and a
    /// save that succeeded is recorded in `cadence`. Returns the return's
    /// instant.
    pub(crate) fn finish(
        self,
        requests_now: u64,
        saved: bool,
        cadence: &CheckpointCadence,
    ) -> Instant {
        let ended = Instant::now();
        if let Some((clock, start)) = self.clock {
            clock.save_ended(start, ended, saved);
        }
        if saved {
            cadence.record_save(SaveCost {
                blocked: self
                    .blocking
                    .blocked(ended.saturating_duration_since(self.started)),
                requests: u32::try_from(requests_now.saturating_sub(self.requests_before))
                    .unwrap_or(u32::MAX),
                bytes: self.bytes,
            });
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_save_blocks() {
        let ms = Duration::from_millis;
        // (written before, awaited, the call took, blocked)
        let rows = [
            (0, true, 40, 40),
            (0, false, 40, 0),
            (300, false, 40, 300),
            (300, true, 40, 340),
        ];
        for (written, awaited, call, blocked) in rows {
            let blocking = Blocking {
                written_before: ms(written),
                awaited,
            };
            assert_eq!(blocking.blocked(ms(call)), ms(blocked), "{blocking:?}");
        }
        assert_eq!(Blocking::CALL.blocked(ms(7)), ms(7));
    }

    #[tokio::test(start_paused = true)]
    async fn one_measurement_feeds_the_ledger_and_the_interval_alike() {
        use spot_worker_decisions::cadence::IntervalSource;
        let cadence = CheckpointCadence::new(IntervalSource::Explicit(Duration::from_secs(60)));
        let clock = Arc::new(SaveClock::new(Instant::now()));
        clock.handler_started();
        tokio::time::advance(Duration::from_millis(1000)).await;
        // A program wrote its file for 300 ms; the upload beside it takes
        // 50 ms and two requests.
        let blocking = Blocking {
            written_before: Duration::from_millis(300),
            awaited: false,
        };
        let save = SaveMeasurement::start(blocking, Some(&clock), 5, 123, None);
        let stamped = save.ledger().unwrap();
        assert_eq!((stamped.useful_ms, stamped.checkpointing_ms), (700, 300));
        tokio::time::advance(Duration::from_millis(50)).await;
        save.finish(7, true, &cadence);
        let cost = cadence.view().cost;
        assert_eq!(cost.blocked_total, Duration::from_millis(300));
        assert_eq!((cost.saves, cost.requests, cost.bytes), (1, 2, 123));
        let now = clock.now();
        assert_eq!(
            (now.work, now.checkpointing),
            (Duration::from_millis(750), Duration::from_millis(300))
        );
        // A Rust handler's save: the call is the blocked time, in both.
        let save = SaveMeasurement::start(Blocking::CALL, Some(&clock), 7, 10, None);
        tokio::time::advance(Duration::from_millis(80)).await;
        save.finish(8, true, &cadence);
        let cost = cadence.view().cost;
        assert_eq!(cost.blocked_total, Duration::from_millis(380));
        assert_eq!(clock.now().checkpointing, Duration::from_millis(380));
        // A failed save is in the ledger's time (the job waited) but not a
        // measured cost.
        let save = SaveMeasurement::start(Blocking::CALL, Some(&clock), 8, 10, None);
        tokio::time::advance(Duration::from_millis(20)).await;
        save.finish(9, false, &cadence);
        assert_eq!(cadence.view().cost.saves, 2);
        assert_eq!(clock.now().checkpointing, Duration::from_millis(400));
    }
}
