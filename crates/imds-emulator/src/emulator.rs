//! [`Emulator`]: the handle shared by the HTTP server, the scenario player
//! and in-process tests.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

use crate::config::EmulatorConfig;
use crate::error::EmulatorError;
use crate::event::{self, EmulatedStatus, EventSpec};
use crate::fault::Fault;
use crate::identities::IdentityConfig;
use crate::scenario::{Action, Scenario};
use crate::state::{RecordedApproval, State, Stats};
use crate::token::IssuedToken;

/// The api-version whose document [`Emulator::document`] returns.
pub const CURRENT_API_VERSION: &str = "2020-07-01";

/// An emulated IMDS. Cheap to clone; clones share one state.
///
/// Time-driven transitions (auto-start at `NotBefore`, removal of completed
/// events) are applied lazily whenever the state is looked at, through the
/// HTTP API or through these methods.
#[derive(Clone)]
pub struct Emulator {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// The document incarnation, published for waiters.
    incarnation: watch::Sender<u64>,
    /// Scenario players, stopped by [`Emulator::reset`].
    players: Mutex<Vec<AbortHandle>>,
}

/// The result of [`Emulator::schedule`].
#[derive(Debug, Clone)]
pub struct PostedEvent {
    /// The `EventId` (an upper-case UUID).
    pub id: String,
    /// The document incarnation that first contains the event.
    pub incarnation: u64,
    /// When the event became visible to clients (for latency measurements).
    pub visible_at: Instant,
    /// `NotBefore` (whole seconds), `None` for an event created `Started`.
    pub not_before: Option<SystemTime>,
    /// The event in the wire format of api-version 2020-07-01.
    pub wire: serde_json::Value,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("incarnation", &*self.shared.incarnation.borrow())
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// An emulator with no events and document incarnation 1.
    pub fn new(config: EmulatorConfig) -> Self {
        let state = State::new(config);
        let (incarnation, _) = watch::channel(state.incarnation());
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                incarnation,
                players: Mutex::new(Vec::new()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, and every mutation leaves
        // the state consistent, so a poisoned lock is still safe to use.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state brought up to now and publishes the
    /// incarnation if it changed.
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.lock();
        state.advance(SystemTime::now());
        let result = f(&mut state);
        let incarnation = state.incarnation();
        self.shared.incarnation.send_if_modified(|published| {
            let changed = *published != incarnation;
            *published = incarnation;
            changed
        });
        result
    }

    /// The current configuration (including changes made at run time).
    pub fn config(&self) -> EmulatorConfig {
        self.lock().config.clone()
    }

    /// Schedules an event; it is visible to the next GET.
    pub fn schedule(&self, spec: EventSpec) -> Result<PostedEvent, EmulatorError> {
        self.with_state(|state| schedule_in(state, &spec))
    }

    /// Starts a scheduled event now, as if approved or its `NotBefore` had
    /// passed. Starting a started event changes nothing.
    pub fn start_event(&self, id: &str) -> Result<(), EmulatorError> {
        self.with_state(|state| state.start(id, SystemTime::now()).map(drop))
    }

    /// Removes an event (scheduled or started) as finished.
    pub fn complete_event(&self, id: &str) -> Result<(), EmulatorError> {
        self.with_state(|state| state.complete(id))
    }

    /// Removes a scheduled event that will not happen after all; fails with
    /// [`EmulatorError::AlreadyStarted`] for a started one.
    pub fn cancel_event(&self, id: &str) -> Result<(), EmulatorError> {
        self.with_state(|state| state.cancel(id))
    }

    /// Makes the next Scheduled Events GET fail with `fault`.
    pub fn inject_fault(&self, fault: Fault) {
        self.inject_faults(fault, 1);
    }

    /// Makes the next `count` Scheduled Events GETs (after those of faults
    /// injected earlier) fail with `fault`.
    pub fn inject_faults(&self, fault: Fault, count: u32) {
        self.with_state(|state| state.faults.push(fault, count));
    }

    /// Forgets all pending faults.
    pub fn clear_faults(&self) {
        self.with_state(|state| state.faults.clear());
    }

    /// Makes `/metadata/instance` answer 404 with an HTML page (or serve
    /// the instance document again), like a Scheduled Events stand-in
    /// without instance metadata (Azure-Samples/scheduled-events-mock-server).
    /// The requests are still counted in [`Stats::instance_gets`].
    pub fn set_instance_metadata_missing(&self, missing: bool) {
        self.with_state(|state| state.instance_missing = missing);
    }

    /// Whether `/metadata/instance` answers 404 (see
    /// [`set_instance_metadata_missing`](Self::set_instance_metadata_missing)).
    pub fn instance_metadata_missing(&self) -> bool {
        self.with_state(|state| state.instance_missing)
    }

    /// Sets the delay of the first Scheduled Events GET and re-arms it, as if
    /// Scheduled Events had just been enabled for this VM.
    pub fn set_first_call_delay(&self, delay: Duration) {
        self.with_state(|state| {
            state.config.first_call_delay = delay;
            state.first_get_pending = true;
        });
    }

    /// Sets (or with `None` disables) the IMDS rate limit.
    pub fn set_rate_limit(&self, per_sec: Option<u32>) {
        self.with_state(|state| state.config.rate_limit_per_sec = per_sec);
    }

    /// The current document incarnation.
    pub fn incarnation(&self) -> u64 {
        self.with_state(|state| state.incarnation())
    }

    /// What a GET with api-version 2020-07-01 would return now.
    pub fn document(&self) -> serde_json::Value {
        self.with_state(|state| {
            serde_json::json!({
                "DocumentIncarnation": state.incarnation(),
                "Events": state.wire_events(CURRENT_API_VERSION),
            })
        })
    }

    /// Every approval received so far, oldest first.
    pub fn approvals(&self) -> Vec<RecordedApproval> {
        self.with_state(|state| state.approvals.clone())
    }

    /// Request counters.
    pub fn stats(&self) -> Stats {
        self.with_state(|state| state.stats)
    }

    /// Replaces the VM's managed identities and token settings; tokens
    /// already issued stay valid until they expire, as in Azure.
    pub fn set_identity(&self, identity: IdentityConfig) {
        self.with_state(|state| state.config.identity = identity);
    }

    /// The tokens the identity endpoint issued, oldest first.
    pub fn tokens(&self) -> Vec<IssuedToken> {
        self.with_state(|state| state.tokens.clone())
    }

    /// The id of the event a scenario step scheduled under `key`.
    pub fn event_id(&self, key: &str) -> Option<String> {
        self.with_state(|state| state.id_for_key(key).ok())
    }

    /// Empties the events array (one more incarnation if it was not empty)
    /// and forgets approvals, statistics, faults and scenario keys; stops
    /// running scenario players. The incarnation never goes back.
    pub fn reset(&self) {
        let players = std::mem::take(
            &mut *self
                .shared
                .players
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for player in players {
            player.abort();
        }
        self.with_state(State::reset);
    }

    /// Applies one scenario action now, synchronously.
    ///
    /// The waiting actions take effect at once, as if the awaited time had
    /// passed: [`Action::AwaitStart`] starts the event and
    /// [`Action::AwaitCompletion`] removes it (both do nothing if that
    /// already happened). This lets tests walk through a scenario
    /// deterministically without sleeping.
    pub fn apply(&self, action: &Action) -> Result<(), EmulatorError> {
        self.with_state(|state| apply_in(state, action))
    }

    /// Applies all steps of `scenario` at once, ignoring their delays.
    pub fn apply_scenario(&self, scenario: &Scenario) -> Result<(), EmulatorError> {
        scenario
            .steps
            .iter()
            .try_for_each(|step| self.apply(&step.action))
    }

    /// Plays `scenario` in a background task, in real time divided by
    /// `speed` (10.0 is ten times faster; a `speed` that is not a positive
    /// number means 1.0). Waiting steps wait for the emulated service to get
    /// there by itself (or for a client's approval).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn play(&self, scenario: Scenario, speed: f64) -> JoinHandle<()> {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        let handle = tokio::spawn(play(self.clone(), scenario, speed));
        let mut players = self
            .shared
            .players
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        players.retain(|player| !player.is_finished());
        players.push(handle.abort_handle());
        handle
    }

    /// Resolves when the document incarnation reaches at least `n`,
    /// including through time-driven transitions (no polling needed).
    pub async fn wait_for_incarnation(&self, n: u64) {
        self.wait_until(|state| state.incarnation() >= n).await;
    }

    /// Resolves once `done` holds for the state brought up to date; wakes on
    /// every change and at every time-driven transition.
    pub(crate) async fn wait_until(&self, mut done: impl FnMut(&State) -> bool) {
        loop {
            // Subscribe before looking, so no change can slip in between.
            let mut changes = self.shared.incarnation.subscribe();
            let deadline = {
                let (finished, deadline) =
                    self.with_state(|state| (done(state), state.next_deadline()));
                if finished {
                    return;
                }
                deadline
            };
            // Without a deadline only a change can help; still look again
            // now and then in case the wall clock jumped.
            let wait = deadline.map_or(Duration::from_secs(60), |at| {
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
                    + Duration::from_millis(1)
            });
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

fn schedule_in(state: &mut State, spec: &EventSpec) -> Result<PostedEvent, EmulatorError> {
    let event = state.schedule(spec, SystemTime::now())?;
    let mut scheduled = PostedEvent {
        id: event.id.clone(),
        incarnation: 0,
        visible_at: event.visible_at,
        not_before: event.not_before,
        wire: serde_json::to_value(event.wire(CURRENT_API_VERSION)).unwrap_or_default(),
    };
    scheduled.incarnation = state.incarnation();
    Ok(scheduled)
}

fn apply_in(state: &mut State, action: &Action) -> Result<(), EmulatorError> {
    let now = SystemTime::now();
    match action {
        Action::Schedule { key, spec } => {
            let id = schedule_in(state, spec)?.id;
            state.bind_key(key, id);
        }
        Action::Start { key } => {
            let id = state.id_for_key(key)?;
            state.start(&id, now)?;
        }
        Action::AwaitStart { key } => {
            let id = state.id_for_key(key)?;
            if state.event(&id).is_some() {
                state.start(&id, now)?;
            }
        }
        Action::Complete { key } => {
            let id = state.id_for_key(key)?;
            state.complete(&id)?;
        }
        Action::AwaitCompletion { key } => {
            let id = state.id_for_key(key)?;
            if state.event(&id).is_some() {
                state.complete(&id)?;
            }
        }
        Action::Cancel { key } => {
            let id = state.id_for_key(key)?;
            state.cancel(&id)?;
        }
    }
    Ok(())
}

/// Performs `scenario` on `emulator` in real time divided by `speed`.
pub(crate) async fn play(emulator: Emulator, scenario: Scenario, speed: f64) {
    tracing::info!(scenario = %scenario.name, speed, "playing scenario");
    for step in scenario.steps {
        tokio::time::sleep(event::scale(step.after, speed)).await;
        let result = match step.action {
            Action::AwaitStart { key } => {
                emulator
                    .wait_until(|state| {
                        state
                            .id_for_key(&key)
                            .ok()
                            .and_then(|id| state.event(&id))
                            .is_none_or(|e| e.status == EmulatedStatus::Started)
                    })
                    .await;
                Ok(())
            }
            Action::AwaitCompletion { key } => {
                emulator
                    .wait_until(|state| {
                        state
                            .id_for_key(&key)
                            .ok()
                            .and_then(|id| state.event(&id))
                            .is_none()
                    })
                    .await;
                Ok(())
            }
            Action::Schedule { key, spec } => emulator.apply(&Action::Schedule {
                key,
                spec: spec.scaled(speed),
            }),
            action => emulator.apply(&action),
        };
        if let Err(error) = result {
            // The state may have been changed from outside (an approval, the
            // control API, a reset); the rest of the script may still apply.
            tracing::warn!(scenario = %scenario.name, %error, "scenario step failed");
        }
    }
    tracing::info!(scenario = %scenario.name, "scenario finished");
}
