//! [`PlanClock`]: the time of day and the jitter a seeded run gives the
//! library ([`Clock`]), so that its waits and lane decisions replay
//! exactly: a fixed start plus tokio's (paused) clock, and jitter drawn
//! from the run's [`FaultPlan`].

use std::time::{Duration, SystemTime};

use spot_worker_storage::Clock;
use tokio::time::Instant;

use super::plan::FaultPlan;

/// Where every seeded run's time of day starts, in seconds since the
/// Unix epoch: 2100-01-01, after any real time a producer compares a
/// deadline with.
const RUN_START_SECS: u64 = 4_102_444_800;

/// Where every seeded run's time of day starts (2100-01-01).
pub fn run_start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(RUN_START_SECS)
}

/// The time of day [`run_start`] plus tokio's clock since the clock was
/// made, and jitter from `plan`.
pub struct PlanClock {
    plan: FaultPlan,
    made: Instant,
}

impl PlanClock {
    /// A clock at [`run_start`] now (make it inside the run's runtime).
    pub fn new(plan: &FaultPlan) -> Self {
        PlanClock {
            plan: plan.clone(),
            made: Instant::now(),
        }
    }
}

impl Clock for PlanClock {
    fn now(&self) -> SystemTime {
        run_start() + self.made.elapsed()
    }

    fn jitter(&self, max: u64) -> u64 {
        self.plan.jitter(max)
    }
}
