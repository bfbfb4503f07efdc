//! Why and by when the worker stops: the first of an eviction notice, a
//! signal from the service manager, or a request from the application, turned
//! into a plan with two instants — when to release what is still running,
//! and the hard deadline a watchdog enforces.
//!
//! However late a notice arrives (already `Started`, `NotBefore` passed, seen
//! only after an IMDS outage), the plan keeps a floor: intake stops and the
//! messages in flight are released (one request each, concurrently) before
//! the watchdog may end the process. A second SIGTERM or SIGINT skips the
//! handlers' wind-down and goes straight to the release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_imds::{Notice, NoticeSignal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::DrainSettings;

/// What started a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainTrigger {
    /// A Scheduled Event concerning this VM (Preempt, Terminate, ...).
    Event(Notice),
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// The application asked ([`Worker::shutdown_token`](crate::Worker::shutdown_token)).
    Requested,
}

impl std::fmt::Display for DrainTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DrainTrigger::Event(n) => write!(f, "{} event {}", n.event_type, n.event_id),
            DrainTrigger::Signal(name) => f.write_str(name),
            DrainTrigger::Requested => f.write_str("shutdown requested"),
        }
    }
}

/// The instants a drain works to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainPlan {
    /// When the notice arrived.
    pub noticed_at: Instant,
    /// Handlers still running now are dropped and their messages released.
    pub release_at: Instant,
    /// The process must be gone by now; the watchdog ends it here.
    pub hard_deadline: Instant,
}

/// Why the impact may begin a little before `NotBefore` says: the VM's clock
/// and Azure's can differ by a fraction of a second.
const BEFORE_NOT_BEFORE: Duration = Duration::from_secs(1);

impl DrainPlan {
    /// The plan for `trigger` noticed at `noticed_at`:
    ///
    /// - the time left is the drain budget, and for an event no later than
    ///   one second before `NotBefore` (none for a started or late event);
    /// - handlers wind down (their tokens cancelled, so they checkpoint) for
    ///   the time left minus the release margin, but at least half the time
    ///   left, so a notice 2 to 4 s away still gives them a moment;
    /// - then whatever still runs is released, and the release always gets
    ///   `release_floor` before the hard deadline, however late the notice;
    /// - a notice with no time left at all (already `Started`, `NotBefore`
    ///   passed) still lets handlers make their final save: they wind down
    ///   for the first half of the release floor (a handler that returns
    ///   sooner has its message released as it returns), and the release
    ///   has the second half before the hard deadline, which stays the
    ///   floor after the notice.
    ///
    /// So the drain never takes longer than
    /// [`DrainSettings::longest_drain`].
    pub fn new(trigger: &DrainTrigger, noticed_at: Instant, settings: &DrainSettings) -> DrainPlan {
        let mut time_left = settings.drain_budget;
        if let DrainTrigger::Event(notice) = trigger {
            let before_impact = notice
                .deadline
                .checked_sub(BEFORE_NOT_BEFORE)
                .unwrap_or(notice.deadline);
            time_left = time_left.min(before_impact.saturating_duration_since(noticed_at));
        }
        if time_left.is_zero() {
            let final_save = settings.release_floor / 2;
            return DrainPlan {
                noticed_at,
                release_at: noticed_at + final_save,
                hard_deadline: noticed_at + settings.release_floor,
            };
        }
        let wind_down = time_left
            .saturating_sub(settings.release_margin)
            .max(time_left / 2);
        let release_at = noticed_at + wind_down;
        let hard_deadline = (noticed_at + time_left).max(release_at + settings.release_floor);
        DrainPlan {
            noticed_at,
            release_at,
            hard_deadline,
        }
    }
}

/// Everything that can start a shutdown, merged into one future.
#[derive(Clone)]
pub(crate) struct Triggers {
    event: Option<NoticeSignal>,
    external: CancellationToken,
    /// Cancelled by a second SIGTERM/SIGINT: release now, skip the wind-down.
    hurry: CancellationToken,
    reason: Arc<Mutex<Option<DrainTrigger>>>,
}

impl Triggers {
    pub(crate) fn new(event: Option<NoticeSignal>, requested: CancellationToken) -> Self {
        Triggers {
            event,
            external: requested,
            hurry: CancellationToken::new(),
            reason: Arc::new(Mutex::new(None)),
        }
    }

    /// Drains on SIGTERM and SIGINT from now on; a second one hurries the
    /// drain (see [`hurried`](Self::hurried)). The handlers are installed
    /// before this returns, so a signal sent right after is not lost (nor
    /// does it kill the process with the default action).
    pub(crate) fn listen_for_signals(&self) {
        let this = self.clone();
        let mut interrupts = Interrupts::install();
        tokio::spawn(async move {
            let name = interrupts.next().await;
            this.set_reason(DrainTrigger::Signal(name));
            this.external.cancel();
            let again = interrupts.next().await;
            tracing::warn!(
                signal = again,
                "second signal: releasing the messages in flight now, without waiting for handlers"
            );
            this.hurry.cancel();
        });
    }

    fn set_reason(&self, trigger: DrainTrigger) {
        let mut reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        reason.get_or_insert(trigger);
    }

    /// Resolves with the first trigger: the application's request or a
    /// signal, or a Scheduled Event notice that is in force (not withdrawn:
    /// after intake resumes for a cancelled event, only a new one counts).
    pub(crate) async fn first(&self) -> DrainTrigger {
        let event = async {
            match &self.event {
                Some(signal) => signal.in_force().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            notice = event => match notice {
                Some(notice) => DrainTrigger::Event(notice),
                // The watcher is gone: nothing more will come from it.
                None => self.external().await,
            },
            trigger = self.external() => trigger,
        }
    }

    /// Resolves when the application or a signal asks to stop.
    pub(crate) async fn external(&self) -> DrainTrigger {
        self.external.cancelled().await;
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or(DrainTrigger::Requested)
    }

    /// Resolves when a second signal asks for a fast exit.
    pub(crate) async fn hurried(&self) {
        self.hurry.cancelled().await
    }

    /// The event side, for following a notice after the drain.
    pub(crate) fn event_signal(&self) -> Option<&NoticeSignal> {
        self.event.as_ref()
    }
}

/// SIGTERM (systemd's stop) and SIGINT (Ctrl-C), installed once and read as
/// many times as they arrive.
struct Interrupts {
    #[cfg(unix)]
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    /// Installs the handlers now, so that a signal sent from here on is
    /// neither lost nor fatal.
    fn install() -> Interrupts {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let streams = signal(SignalKind::terminate())
                .and_then(|term| signal(SignalKind::interrupt()).map(|int| (term, int)));
            match streams {
                Ok(streams) => Interrupts {
                    streams: Some(streams),
                },
                Err(error) => {
                    tracing::error!(
                        %error,
                        "cannot listen for SIGTERM/SIGINT; only events and requests stop this worker"
                    );
                    Interrupts { streams: None }
                }
            }
        }
        #[cfg(not(unix))]
        {
            Interrupts {}
        }
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            let Some((term, int)) = &mut self.streams else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// Installs SIGTERM (systemd's stop) and SIGINT (Ctrl-C) handlers now and
/// returns a future that resolves with the first signal's name. Installing
/// before awaiting means a signal sent meanwhile is neither lost nor fatal.
pub fn interrupted() -> impl std::future::Future<Output = &'static str> + Send + 'static {
    let mut interrupts = Interrupts::install();
    async move { interrupts.next().await }
}

/// Ends the process at `deadline` unless disarmed (dropped) first: the last
/// line of defence against a handler that blocks its thread and ignores
/// cancellation, or a last step (approval, telemetry flush, the health
/// server) that hangs. Runs on its own OS thread so a blocked runtime cannot
/// stop it; the worker holds it until `run` returns.
pub(crate) struct Watchdog {
    _disarm: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    pub(crate) fn arm(deadline: Instant) -> Watchdog {
        let (disarm, disarmed) = std::sync::mpsc::channel::<()>();
        let deadline = deadline.into_std();
        let spawned = std::thread::Builder::new()
            .name("spot-worker-watchdog".into())
            .spawn(move || {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = disarmed.recv_timeout(left)
                {
                    tracing::error!("drain overran its hard deadline; ending the process now");
                    eprintln!("spot-worker: drain overran its hard deadline; exiting");
                    std::process::exit(WATCHDOG_EXIT_CODE);
                }
            });
        if let Err(error) = spawned {
            tracing::error!(%error, "could not start the shutdown watchdog");
        }
        Watchdog { _disarm: disarm }
    }
}

/// Exit status when the watchdog ends the process: not a graceful exit.
pub const WATCHDOG_EXIT_CODE: i32 = 3;

/// How long a process whose worker stopped gets to exit by itself before
/// the exit guard of a worker [owning its
/// process](crate::Worker::owning_the_process) ends it: the drain has
/// released every message and flushed telemetry by then, so only logging a
/// last line is left to do.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Ends the process with `code` after `grace`, unless it exits by itself
/// first. Armed by a worker that owns its process when `run` returns: a
/// Tokio runtime being dropped waits for every `spawn_blocking` task, so a
/// handler's blocking code that ignores cancellation (its message already
/// released, its writes fenced) would otherwise keep the process up until
/// the service manager's SIGKILL. Runs on its own OS thread, which nothing
/// can disarm: the worker has stopped, the process is to exit.
pub(crate) fn exit_after(grace: Duration, code: i32) {
    let spawned = std::thread::Builder::new()
        .name("spot-worker-exit".into())
        .spawn(move || {
            std::thread::sleep(grace);
            tracing::warn!(
                code,
                "the worker stopped but the process did not exit (handler code still running?); exiting now"
            );
            eprintln!(
                "spot-worker: still running {grace:?} after the worker stopped; exiting with status {code}"
            );
            std::process::exit(code);
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "could not start the exit guard");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_imds::{EventStatus, EventType};
    use std::time::SystemTime;

    fn settings() -> DrainSettings {
        crate::WorkerConfig::default().drain
    }

    fn notice(deadline: Instant) -> DrainTrigger {
        DrainTrigger::Event(Notice {
            event_id: "E".into(),
            event_type: EventType::Preempt,
            status: EventStatus::Scheduled,
            not_before: None,
            deadline,
            first_seen: SystemTime::now(),
            incarnation: 2,
            withdrawn: false,
        })
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[tokio::test(start_paused = true)]
    async fn every_notice_gets_a_plan_with_a_release_floor() {
        let now = Instant::now();
        let settings = settings();
        assert_eq!(settings.release_margin, secs(3.0));
        assert_eq!(settings.release_floor, secs(2.0));
        let past = now.checked_sub(secs(10.0)).unwrap_or(now);
        // (case, trigger, release after, hard deadline after)
        let table = [
            // 30 s Preempt: the 25 s budget comes before NotBefore - 1 s.
            ("preempt 30 s", notice(now + secs(30.0)), 22.0, 25.0),
            // A long Terminate notice is capped by the budget too.
            ("terminate 600 s", notice(now + secs(600.0)), 22.0, 25.0),
            ("signal", DrainTrigger::Signal("SIGTERM"), 22.0, 25.0),
            ("requested", DrainTrigger::Requested, 22.0, 25.0),
            ("notice 10 s", notice(now + secs(10.0)), 6.0, 9.0),
            // Less than twice the margin left: handlers get half of it.
            ("notice 6 s", notice(now + secs(6.0)), 2.5, 5.0),
            ("notice 4 s", notice(now + secs(4.0)), 1.5, 3.5),
            ("notice 3 s", notice(now + secs(3.0)), 1.0, 3.0),
            ("notice 2 s", notice(now + secs(2.0)), 0.5, 2.5),
            // Started, or NotBefore passed: half the floor for the final
            // save, half for the release, the hard deadline the floor.
            ("started", notice(now), 1.0, 2.0),
            ("late", notice(past), 1.0, 2.0),
        ];
        for (case, trigger, release, hard) in table {
            let plan = DrainPlan::new(&trigger, now, &settings);
            assert_eq!(plan.noticed_at, now, "{case}");
            assert_eq!(plan.release_at, now + secs(release), "{case}: release");
            assert_eq!(
                plan.hard_deadline,
                now + secs(hard),
                "{case}: hard deadline"
            );
            assert!(
                plan.hard_deadline - now <= settings.longest_drain(),
                "{case}: within the longest drain"
            );
        }
    }

    #[tokio::test]
    async fn the_first_trigger_wins_and_keeps_its_reason() {
        let requested = CancellationToken::new();
        let triggers = Triggers::new(None, requested.clone());
        triggers.set_reason(DrainTrigger::Signal("SIGTERM"));
        triggers.set_reason(DrainTrigger::Signal("SIGINT"));
        requested.cancel();
        assert_eq!(triggers.first().await, DrainTrigger::Signal("SIGTERM"));
    }
}
