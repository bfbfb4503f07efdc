//! [`CheckpointCost`]: what checkpoint saves cost, measured as they happen.
//!
//! Two different costs: the time a save blocks the job (a Rust handler
//! awaiting `JobCheckpoint::save` in `spot-worker-storage`; a program
//! under `spot-worker run` writing its checkpoint file), which is what the
//! checkpoint interval trades against the work an interruption loses; and
//! the requests and bytes a save sends to storage, which cost money but no
//! job time when the upload runs beside the job (the runner's uploads).
//! [`SaveCost`] carries both for one save, as its one measurement (the
//! checkpoint handle's, in `spot-worker-storage`) found them; [`CheckpointCost`] keeps the totals and a
//! recent estimate of the blocking time; [`CostMeter`] shares one between
//! the tasks that save.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How much one new measurement moves the recent estimate: an
/// exponentially weighted mean whose weight halves about every 2.4 saves,
/// so a store that became slower is followed within a few saves while one
/// slow save does not swing the interval.
const RECENT_WEIGHT: f64 = 0.25;

/// What one save cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveCost {
    /// The time the job was blocked by the save.
    pub blocked: Duration,
    /// Requests sent to storage for it.
    pub requests: u32,
    /// Bytes written.
    pub bytes: u64,
}

/// The cost of the saves measured so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CheckpointCost {
    /// Saves measured.
    pub saves: u64,
    /// Their total blocking time.
    pub blocked_total: Duration,
    /// Their requests.
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The recent blocking time per save, in seconds (see
    /// [`CheckpointCost::estimate`]).
    recent_seconds: Option<f64>,
}

impl CheckpointCost {
    /// Adds one save's cost.
    pub fn record(&mut self, save: SaveCost) {
        self.saves = self.saves.saturating_add(1);
        self.blocked_total = self.blocked_total.saturating_add(save.blocked);
        self.requests = self.requests.saturating_add(u64::from(save.requests));
        self.bytes = self.bytes.saturating_add(save.bytes);
        let seconds = save.blocked.as_secs_f64();
        self.recent_seconds = Some(match self.recent_seconds {
            None => seconds,
            Some(recent) => recent + RECENT_WEIGHT * (seconds - recent),
        });
    }

    /// The time one save blocks the job now: an exponentially weighted
    /// mean of the measured saves, recent ones weighing most; `None` before
    /// the first.
    pub fn estimate(&self) -> Option<Duration> {
        self.recent_seconds.map(Duration::from_secs_f64)
    }

    /// The mean blocking time of all saves measured; `None` before the first.
    pub fn mean_blocked(&self) -> Option<Duration> {
        u32::try_from(self.saves.max(1))
            .ok()
            .filter(|_| self.saves > 0)
            .map(|saves| self.blocked_total / saves)
    }
}

/// A [`CheckpointCost`] shared between the tasks that save.
#[derive(Debug, Default)]
pub struct CostMeter {
    cost: Mutex<CheckpointCost>,
}

impl CostMeter {
    /// A meter with nothing measured.
    pub fn new() -> Self {
        CostMeter::default()
    }

    /// Adds one save's cost.
    pub fn record(&self, save: SaveCost) {
        self.lock().record(save);
    }

    /// The cost measured so far.
    pub fn snapshot(&self) -> CheckpointCost {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CheckpointCost> {
        // Nothing panics while holding it: the numbers stay consistent.
        self.cost.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(millis: u64) -> SaveCost {
        SaveCost {
            blocked: Duration::from_millis(millis),
            requests: 1,
            bytes: 100,
        }
    }

    #[test]
    fn the_estimate_follows_recent_saves_and_the_totals_add_up() {
        let mut cost = CheckpointCost::default();
        assert_eq!((cost.estimate(), cost.mean_blocked()), (None, None));
        cost.record(save(400));
        assert_eq!(cost.estimate(), Some(Duration::from_millis(400)));
        // 400 + 0.25·(800 − 400) = 500
        cost.record(save(800));
        assert_eq!(cost.estimate(), Some(Duration::from_millis(500)));
        assert_eq!(cost.mean_blocked(), Some(Duration::from_millis(600)));
        assert_eq!((cost.saves, cost.requests, cost.bytes), (2, 2, 200));
        // A store that became ten times slower is followed within a few saves.
        for _ in 0..8 {
            cost.record(save(8000));
        }
        let recent = cost.estimate().unwrap().as_secs_f64();
        assert!(recent > 7.0 && recent < 8.0, "{recent}");
    }

    #[test]
    fn a_shared_meter_sums_what_every_task_records() {
        let meter = std::sync::Arc::new(CostMeter::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let meter = meter.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        meter.record(save(10));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let cost = meter.snapshot();
        assert_eq!((cost.saves, cost.bytes), (100, 10_000));
        assert_eq!(cost.blocked_total, Duration::from_millis(1000));
    }
}
