//! Why and by when the worker stops: the first of an eviction notice, a
//! signal from the service manager, or a request from the application, turned
//! into a plan with two instants — when to release what is still running,
//! and the hard deadline a watchdog enforces.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spot_worker_imds::{Notice, ShutdownSignal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ShutdownSettings;

/// What started a shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A Scheduled Event concerning this VM (Preempt, Terminate, ...).
    Event(Notice),
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// The application asked ([`Worker::shutdown_token`](crate::Worker::shutdown_token)).
    Requested,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trigger::Event(n) => write!(f, "{} event {}", n.event_type, n.event_id),
            Trigger::Signal(name) => f.write_str(name),
            Trigger::Requested => f.write_str("shutdown requested"),
        }
    }
}

/// The instants a drain works to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// When the notice arrived.
    pub noticed_at: Instant,
    /// Handlers still running now are dropped and their messages released.
    pub release_at: Instant,
    /// The process must be gone by now: one second before `NotBefore`, and
    /// never later than the drain budget after the notice.
    pub hard_deadline: Instant,
}

/// Why the impact may begin a little before `NotBefore` says: the VM's clock
/// and Azure's can differ by a fraction of a second.
const BEFORE_NOT_BEFORE: Duration = Duration::from_secs(1);

impl Plan {
    /// The plan for `trigger` noticed at `noticed_at`.
    pub fn new(trigger: &Trigger, noticed_at: Instant, settings: &ShutdownSettings) -> Plan {
        let mut hard_deadline = noticed_at + settings.drain_budget;
        if let Trigger::Event(notice) = trigger {
            let before_impact = notice
                .deadline
                .checked_sub(BEFORE_NOT_BEFORE)
                .unwrap_or(notice.deadline)
                .max(noticed_at);
            hard_deadline = hard_deadline.min(before_impact);
        }
        let release_at = hard_deadline
            .checked_sub(settings.release_margin)
            .unwrap_or(noticed_at)
            .max(noticed_at);
        Plan {
            noticed_at,
            release_at,
            hard_deadline,
        }
    }
}

/// Everything that can start a shutdown, merged into one future.
#[derive(Clone)]
pub(crate) struct Triggers {
    event: Option<ShutdownSignal>,
    external: CancellationToken,
    reason: Arc<Mutex<Option<Trigger>>>,
}

impl Triggers {
    pub(crate) fn new(event: Option<ShutdownSignal>, requested: CancellationToken) -> Self {
        Triggers {
            event,
            external: requested,
            reason: Arc::new(Mutex::new(None)),
        }
    }

    /// Drains on SIGTERM and SIGINT from now on. The handlers are installed
    /// before this returns, so a signal sent right after is not lost (nor
    /// does it kill the process with the default action).
    pub(crate) fn listen_for_signals(&self) {
        let this = self.clone();
        let interrupted = interrupted();
        tokio::spawn(async move {
            let name = interrupted.await;
            this.set_reason(Trigger::Signal(name));
            this.external.cancel();
        });
    }

    fn set_reason(&self, trigger: Trigger) {
        let mut reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        reason.get_or_insert(trigger);
    }

    /// Resolves with the first trigger.
    pub(crate) async fn first(&self) -> Trigger {
        let event = async {
            match &self.event {
                Some(signal) => {
                    signal.cancelled().await;
                    signal.notice()
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            notice = event => match notice {
                Some(notice) => Trigger::Event(notice),
                None => Trigger::Requested,
            },
            () = self.external.cancelled() => self
                .reason
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or(Trigger::Requested),
        }
    }
}

/// Installs SIGTERM (systemd's stop) and SIGINT (Ctrl-C) handlers now and
/// returns a future that resolves with the first signal's name. Installing
/// before awaiting means a signal sent meanwhile is neither lost nor fatal.
pub fn interrupted() -> impl std::future::Future<Output = &'static str> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = signal(SignalKind::terminate())
            .and_then(|term| signal(SignalKind::interrupt()).map(|int| (term, int)));
        async move {
            let Ok((mut term, mut int)) = streams else {
                tracing::error!(
                    "cannot listen for SIGTERM/SIGINT; only events and requests stop this worker"
                );
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// Ends the process at `deadline` unless disarmed (dropped) first: the last
/// line of defence against a handler that blocks its thread and ignores
/// cancellation. Runs on its own OS thread so a blocked runtime cannot stop it.
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

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_imds::{EventStatus, EventType};
    use std::time::SystemTime;

    fn settings() -> ShutdownSettings {
        crate::WorkerConfig::default().shutdown
    }

    fn notice(deadline: Instant) -> Trigger {
        Trigger::Event(Notice {
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

    #[tokio::test(start_paused = true)]
    async fn a_preempt_drains_before_not_before() {
        let now = Instant::now();
        let plan = Plan::new(&notice(now + Duration::from_secs(30)), now, &settings());
        // The 25 s budget comes before NotBefore - 1 s.
        assert_eq!(plan.hard_deadline, now + Duration::from_secs(25));
        assert_eq!(plan.release_at, now + Duration::from_secs(22));
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_notice_shrinks_the_plan() {
        let now = Instant::now();
        let plan = Plan::new(&notice(now + Duration::from_secs(10)), now, &settings());
        assert_eq!(plan.hard_deadline, now + Duration::from_secs(9));
        assert_eq!(plan.release_at, now + Duration::from_secs(6));
        // Already started: release at once.
        let plan = Plan::new(&notice(now), now, &settings());
        assert_eq!((plan.release_at, plan.hard_deadline), (now, now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_gets_the_drain_budget() {
        let now = Instant::now();
        let plan = Plan::new(&Trigger::Signal("SIGTERM"), now, &settings());
        assert_eq!(plan.hard_deadline, now + Duration::from_secs(25));
        // A long Terminate notice is capped by the budget too.
        let plan = Plan::new(&notice(now + Duration::from_secs(600)), now, &settings());
        assert_eq!(plan.hard_deadline, now + Duration::from_secs(25));
    }

    #[tokio::test]
    async fn the_first_trigger_wins_and_keeps_its_reason() {
        let requested = CancellationToken::new();
        let triggers = Triggers::new(None, requested.clone());
        triggers.set_reason(Trigger::Signal("SIGTERM"));
        triggers.set_reason(Trigger::Signal("SIGINT"));
        requested.cancel();
        assert_eq!(triggers.first().await, Trigger::Signal("SIGTERM"));
    }
}
