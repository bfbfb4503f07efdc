//! How the worker stops: the drain's settings, and the rule that the
//! longest drain and the exit fit the service's stop timeout, inside
//! Azure's 30-second notice.

use std::path::PathBuf;
use std::time::Duration;

use spot_worker_settings::table;

use crate::error::ConfigError;

/// How long the service manager gives the worker to stop: the unit's
/// `TimeoutStopSec=28s`, two seconds inside Azure's 30-second Preempt notice.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(28);

/// Kept between the end of the longest drain and [`STOP_TIMEOUT`]: the process
/// must also stop its watcher, flush telemetry and close the health server.
pub const EXIT_MARGIN: Duration = Duration::from_secs(2);

/// How the worker stops.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainSettings {
    /// Time kept in hand before the hard deadline: handlers still running
    /// this long before it are dropped and their messages released
    /// (`SPOT_WORKER_RELEASE_MARGIN`, default 3s).
    pub release_margin: Duration,
    /// The time releasing in-flight messages always gets before the watchdog
    /// may end the process, however late the notice (already started, or
    /// `NotBefore` passed): one release request per message, concurrently
    /// (`SPOT_WORKER_RELEASE_FLOOR`, default 2s, at most `release_margin`).
    pub release_floor: Duration,
    /// The longest a drain may take after any notice, whatever `NotBefore`
    /// says (`SPOT_WORKER_DRAIN_BUDGET`, default 25s). The rule: the longest
    /// drain ([`longest_drain`](Self::longest_drain)) plus [`EXIT_MARGIN`]
    /// must fit in the unit's [`STOP_TIMEOUT`] (28 s), itself inside Azure's
    /// 30 s Preempt notice; so at most 26s.
    pub drain_budget: Duration,
    /// Approve the Scheduled Event that caused the drain once drained, so
    /// Azure may proceed at once (`SPOT_WORKER_APPROVE_EVENTS`, default on).
    /// Only an event whose `Resources` is exactly this VM is approved, unless
    /// `approve_shared_events` is on.
    pub approve_events: bool,
    /// Also approve events that list other VMs besides this one
    /// (`SPOT_WORKER_APPROVE_SHARED_EVENTS`, default off). Approving starts
    /// the event for every VM it lists, cutting their notice short: turn it
    /// on only when the other VMs need no notice (or do not run workers).
    pub approve_shared_events: bool,
    /// Where the workers on this VM meet, so that none approves an event
    /// before all have drained (`SPOT_WORKER_RUNTIME_DIR`; default
    /// `/run/spot-worker`, else `$XDG_RUNTIME_DIR/spot-worker`).
    pub runtime_dir: Option<PathBuf>,
    /// End the process if the drain overruns its hard deadline, and, for a
    /// worker [owning its process](crate::Worker::owning_the_process), if the
    /// process is still up [`EXIT_GRACE`](crate::EXIT_GRACE) after `run`
    /// returned (`SPOT_WORKER_WATCHDOG`, default on). Off in tests that run
    /// a worker inside the test process.
    pub watchdog: bool,
    /// Drain on SIGTERM and SIGINT (default on).
    pub handle_signals: bool,
}

impl DrainSettings {
    /// The longest a drain can take from its notice to its hard deadline:
    /// the drain budget, or the release margin plus the release floor when a
    /// short notice stretches the release past the time left.
    pub fn longest_drain(&self) -> Duration {
        self.drain_budget
            .max(self.release_margin + self.release_floor)
    }

    /// Checks that the drain fits the stop timeout and its stages fit the
    /// drain.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: Duration, reason: String| {
            Err(ConfigError::Invalid {
                setting: setting.to_owned(),
                value: format!("{value:?}"),
                reason,
            })
        };
        if self.release_floor < Duration::from_millis(100) {
            return invalid(
                table::RELEASE_FLOOR.key,
                self.release_floor,
                "at least 100ms: releasing takes one request per message".into(),
            );
        }
        if self.release_floor > self.release_margin {
            return invalid(
                table::RELEASE_FLOOR.key,
                self.release_floor,
                format!(
                    "at most SPOT_WORKER_RELEASE_MARGIN ({:?})",
                    self.release_margin
                ),
            );
        }
        if self.drain_budget <= self.release_margin {
            return invalid(
                table::DRAIN_BUDGET.key,
                self.drain_budget,
                format!(
                    "must be longer than SPOT_WORKER_RELEASE_MARGIN ({:?})",
                    self.release_margin
                ),
            );
        }
        if self.longest_drain() + EXIT_MARGIN > STOP_TIMEOUT {
            return invalid(
                table::DRAIN_BUDGET.key,
                self.drain_budget,
                format!(
                    "the drain ({:?} at most) plus {EXIT_MARGIN:?} to exit must fit in the \
                     service's stop timeout (TimeoutStopSec={}s), inside Azure's 30 s notice",
                    self.longest_drain(),
                    STOP_TIMEOUT.as_secs()
                ),
            );
        }
        Ok(())
    }
}
