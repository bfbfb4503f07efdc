//! Deciding which events mean "drain now", and by when.
//!
//! A [`NoticePolicy`] picks the transitions that should stop this worker; a
//! [`NoticeSignal`] is what the rest of the program holds: a
//! [`CancellationToken`] cancelled on the first such transition, plus a
//! [`Notice`] whose deadline is the instant `NotBefore` names, mapped onto the
//! monotonic clock so that a wall-clock jump cannot move it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::model::{EventId, EventStatus, EventType, NotBefore, ScheduledEvent};
use crate::transition::{Transition, TransitionKind};

/// How `Freeze` events (a VM paused for live migration or a host update) are
/// treated. A short pause is harmless; a long one can outlive message leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezePolicy {
    /// Never drain for a freeze.
    Ignore,
    /// Drain when the announced pause is longer than this, or unknown (`-1`).
    LongerThan(Duration),
    /// Always drain.
    Always,
}

/// Which events concerning this VM trigger a shutdown.
///
/// The default drains on `Preempt`, `Terminate`, `Reboot` and `Redeploy`, and
/// on a `Freeze` longer than 30 seconds or of unknown length. Events that do
/// not list this VM never trigger.
///
/// ```
/// use std::time::Duration;
/// use spot_worker_imds::{EventType, FreezePolicy, NoticePolicy};
///
/// let policy = NoticePolicy::default()
///     .ignore(EventType::Reboot)
///     .freeze(FreezePolicy::LongerThan(Duration::from_secs(10)));
/// assert!(policy.may_drain(&EventType::Preempt));
/// assert!(!policy.may_drain(&EventType::Reboot));
/// assert!(!policy.clone().ignore(EventType::Freeze).may_drain(&EventType::Freeze));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticePolicy {
    types: HashSet<EventType>,
    freeze: FreezePolicy,
}

impl Default for NoticePolicy {
    fn default() -> Self {
        NoticePolicy {
            types: [
                EventType::Preempt,
                EventType::Terminate,
                EventType::Reboot,
                EventType::Redeploy,
            ]
            .into_iter()
            .collect(),
            freeze: FreezePolicy::LongerThan(Duration::from_secs(30)),
        }
    }
}

impl NoticePolicy {
    /// Also drain on this type (for example an `EventType::Unknown` that
    /// Azure introduces later). For `Freeze` this means
    /// [`FreezePolicy::Always`].
    pub fn drain_on(mut self, event_type: EventType) -> Self {
        match event_type {
            EventType::Freeze => self.freeze = FreezePolicy::Always,
            other => {
                self.types.insert(other);
            }
        }
        self
    }

    /// Do not drain on this type. For `Freeze` this means
    /// [`FreezePolicy::Ignore`].
    pub fn ignore(mut self, event_type: EventType) -> Self {
        match event_type {
            EventType::Freeze => self.freeze = FreezePolicy::Ignore,
            other => {
                self.types.remove(&other);
            }
        }
        self
    }

    /// How to treat `Freeze`.
    pub fn freeze(mut self, freeze: FreezePolicy) -> Self {
        self.freeze = freeze;
        self
    }

    /// Whether events of this type can drain (for `Freeze`, depending on its
    /// duration).
    pub fn may_drain(&self, event_type: &EventType) -> bool {
        match event_type {
            EventType::Freeze => self.freeze != FreezePolicy::Ignore,
            other => self.types.contains(other),
        }
    }

    /// Whether this event, assuming it concerns this VM, should drain it.
    pub fn triggers(&self, event: &ScheduledEvent) -> bool {
        match (&event.event_type, self.freeze) {
            (EventType::Freeze, FreezePolicy::Ignore) => false,
            (EventType::Freeze, FreezePolicy::Always) => true,
            (EventType::Freeze, FreezePolicy::LongerThan(threshold)) => {
                event.duration().is_none_or(|d| d > threshold)
            }
            (other, _) => self.types.contains(other),
        }
    }
}

/// Why and by when this worker must be drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The event that triggered (the one with the earliest deadline if
    /// several did).
    pub event_id: EventId,
    /// Its type.
    pub event_type: EventType,
    /// Its status when last seen.
    pub status: EventStatus,
    /// Its `NotBefore`, when it has one.
    pub not_before: Option<OffsetDateTime>,
    /// The instant the impact may begin: `NotBefore` on the monotonic clock;
    /// now for a started event; first sighting plus the type's minimum notice
    /// when `NotBefore` is missing or unreadable.
    pub deadline: Instant,
    /// When the watcher first saw the event.
    pub first_seen: SystemTime,
    /// `DocumentIncarnation` of the document this notice was last updated
    /// from.
    pub incarnation: u64,
    /// Set when every triggering event was cancelled by Azure before it
    /// started. The token stays cancelled (tokens cannot be reset); what to
    /// do about a withdrawn notice is the application's choice.
    pub withdrawn: bool,
}

/// What the application holds to learn that it must drain.
///
/// Cheap to clone; every clone sees the same token and notice.
#[derive(Debug, Clone)]
pub struct NoticeSignal {
    token: CancellationToken,
    notice: watch::Receiver<Option<Notice>>,
}

impl NoticeSignal {
    /// The token cancelled when a triggering event is first seen.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Resolves once a shutdown has been triggered.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// The current notice, if a shutdown has been triggered.
    pub fn notice(&self) -> Option<Notice> {
        self.notice.borrow().clone()
    }

    /// The deadline of the current notice.
    pub fn deadline(&self) -> Option<Instant> {
        self.notice.borrow().as_ref().map(|n| n.deadline)
    }

    /// Resolves with the notice once one is in force: triggered and not
    /// withdrawn. Unlike the token, this can be waited on again after a
    /// withdrawal, to learn of the next notice. `None` once the watcher is
    /// gone without one.
    pub async fn in_force(&self) -> Option<Notice> {
        let mut notice = self.notice.clone();
        let current = notice
            .wait_for(|n| n.as_ref().is_some_and(|n| !n.withdrawn))
            .await;
        current.ok().and_then(|n| n.clone())
    }

    /// Resolves when the notice changes (a new deadline, a start, a
    /// withdrawal). Returns `false` once the watcher is gone.
    pub async fn changed(&mut self) -> bool {
        self.notice.changed().await.is_ok()
    }

    /// Resolves when the deadline of the current notice is reached, following
    /// updates (a deadline moved earlier by an approval is honoured). Pending
    /// forever while no shutdown has been triggered.
    pub async fn deadline_reached(&self) {
        let mut notice = self.notice.clone();
        loop {
            let deadline = notice.borrow_and_update().as_ref().map(|n| n.deadline);
            let wait_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = wait_deadline => return,
                changed = notice.changed() => {
                    if changed.is_err() {
                        // The watcher is gone and no update can come: wait
                        // out the last known deadline, if there is one.
                        match deadline {
                            Some(at) => return tokio::time::sleep_until(at).await,
                            None => return std::future::pending().await,
                        }
                    }
                }
            }
        }
    }
}

/// The half of a [`NoticeSignal`] the watcher feeds with transitions.
#[derive(Debug)]
pub(crate) struct NoticeTrigger {
    policy: NoticePolicy,
    token: CancellationToken,
    notice: watch::Sender<Option<Notice>>,
    /// Triggering events not yet gone, by id.
    active: HashMap<EventId, Notice>,
    /// Whether a triggering event has started or completed: the impact is
    /// real, so the notice can no longer be withdrawn.
    impact_began: bool,
}

impl NoticeTrigger {
    /// A trigger and the signal it drives. `token` lets the application tie
    /// this to its own token (for example one also cancelled on SIGTERM).
    pub(crate) fn new(
        policy: NoticePolicy,
        token: CancellationToken,
    ) -> (NoticeTrigger, NoticeSignal) {
        let (notice, receiver) = watch::channel(None);
        let signal = NoticeSignal {
            token: token.clone(),
            notice: receiver,
        };
        let trigger = NoticeTrigger {
            policy,
            token,
            notice,
            active: HashMap::new(),
            impact_began: false,
        };
        (trigger, signal)
    }

    /// Applies one transition; `now` is the monotonic instant matching
    /// `transition.observed_at`.
    pub(crate) fn observe(&mut self, transition: &Transition, now: Instant) {
        let event = &transition.event;
        let pending = matches!(
            transition.kind,
            TransitionKind::Scheduled | TransitionKind::Started | TransitionKind::Updated
        );
        if pending && transition.concerns_this_vm && self.policy.triggers(event) {
            self.upsert(transition, now);
            // Publish before cancelling: whoever wakes on the token reads
            // the notice, and must never find it missing.
            self.publish();
            self.token.cancel();
            return;
        } else if let Some(gone) = self.active.remove(&event.id) {
            // Finished, cancelled, or no longer a reason to drain (this VM
            // dropped from its resources, a freeze shortened).
            if transition.kind == TransitionKind::Completed || gone.status == EventStatus::Started {
                self.impact_began = true;
            }
        } else {
            return;
        }
        self.publish();
    }

    fn upsert(&mut self, transition: &Transition, now: Instant) {
        let event = &transition.event;
        let known = self.active.get(&event.id);
        let first_seen = known.map_or(transition.observed_at, |n| n.first_seen);
        let mut deadline = deadline_for(event, transition.observed_at, now, first_seen);
        if event.status == EventStatus::Started {
            // Started is started: a later update cannot push the impact back.
            self.impact_began = true;
            if let Some(known) = known {
                deadline = deadline.min(known.deadline);
            }
        }
        let notice = Notice {
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            status: event.status.clone(),
            not_before: event.not_before.instant(),
            deadline,
            first_seen,
            incarnation: transition.incarnation,
            withdrawn: false,
        };
        self.active.insert(event.id.clone(), notice);
    }

    /// Publishes the earliest deadline among the triggering events still
    /// pending; when none is left and none ever started, the notice is
    /// withdrawn.
    fn publish(&self) {
        match self.active.values().min_by_key(|n| n.deadline) {
            Some(earliest) => {
                self.notice.send_replace(Some(earliest.clone()));
            }
            None if !self.impact_began => {
                self.notice.send_modify(|notice| {
                    if let Some(notice) = notice {
                        notice.withdrawn = true;
                    }
                });
            }
            None => {}
        }
    }
}

/// The monotonic instant matching an event's `NotBefore`.
///
/// `wall_now` and `mono_now` are the same moment on the two clocks. A started
/// event's deadline is now; a scheduled event without a usable `NotBefore`
/// gets the type's minimum notice counted from `first_seen`.
pub fn deadline_for(
    event: &ScheduledEvent,
    wall_now: SystemTime,
    mono_now: Instant,
    first_seen: SystemTime,
) -> Instant {
    let after_now = |at: SystemTime| mono_now + at.duration_since(wall_now).unwrap_or_default();
    if event.status == EventStatus::Started {
        return mono_now;
    }
    match &event.not_before {
        NotBefore::At(at) => after_now((*at).into()),
        NotBefore::Unset | NotBefore::Invalid(_) => {
            after_now(first_seen + event.event_type.minimum_notice())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventSource, ScheduledEvents};
    use crate::transition::diff;

    const VM: &str = "spotvmss_0";

    fn event(event_type: EventType, not_before: NotBefore) -> ScheduledEvent {
        ScheduledEvent {
            id: "E1".into(),
            event_type,
            status: EventStatus::Scheduled,
            resource_type: "VirtualMachine".into(),
            resources: vec![VM.into()],
            not_before,
            description: String::new(),
            source: Some(EventSource::Platform),
            duration_in_seconds: Some(-1),
        }
    }

    fn at(wall: SystemTime, secs: u64) -> NotBefore {
        NotBefore::At((wall + Duration::from_secs(secs)).into())
    }

    /// Feeds `events` as one document at wall time `wall`.
    fn feed(
        trigger: &mut NoticeTrigger,
        previous: &[ScheduledEvent],
        events: Vec<ScheduledEvent>,
        wall: SystemTime,
    ) {
        let document = ScheduledEvents {
            incarnation: 1,
            events,
        };
        for transition in diff(previous, &document, Some(VM), wall) {
            trigger.observe(&transition, Instant::now());
        }
    }

    fn whole_seconds(wall: SystemTime) -> SystemTime {
        let secs = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[tokio::test(start_paused = true)]
    async fn preempt_deadline_is_not_before_on_the_monotonic_clock() {
        let wall = whole_seconds(SystemTime::now());
        let start = Instant::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        assert!(!signal.token().is_cancelled());

        feed(
            &mut trigger,
            &[],
            vec![event(EventType::Preempt, at(wall, 30))],
            wall,
        );

        assert!(signal.token().is_cancelled());
        let notice = signal.notice().unwrap();
        assert_eq!(notice.deadline, start + Duration::from_secs(30));
        assert_eq!(notice.event_type, EventType::Preempt);
        assert!(!notice.withdrawn);

        // The deadline fires exactly at NotBefore, not a moment before.
        let reached = signal.deadline_reached();
        tokio::pin!(reached);
        tokio::time::advance(Duration::from_millis(29_999)).await;
        assert!(futures_poll(&mut reached).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(futures_poll(&mut reached).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_moves_the_deadline_to_now() {
        let wall = whole_seconds(SystemTime::now());
        let start = Instant::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let scheduled = event(EventType::Terminate, at(wall, 300));
        feed(&mut trigger, &[], vec![scheduled.clone()], wall);
        assert_eq!(signal.deadline(), Some(start + Duration::from_secs(300)));

        tokio::time::advance(Duration::from_secs(5)).await;
        let mut started = scheduled.clone();
        started.status = EventStatus::Started;
        started.not_before = NotBefore::Unset;
        feed(
            &mut trigger,
            &[scheduled],
            vec![started],
            wall + Duration::from_secs(5),
        );
        let notice = signal.notice().unwrap();
        assert_eq!(notice.deadline, start + Duration::from_secs(5));
        assert_eq!(notice.status, EventStatus::Started);
        assert_eq!(notice.first_seen, wall);
    }

    #[tokio::test(start_paused = true)]
    async fn missing_not_before_falls_back_to_the_minimum_notice() {
        let wall = SystemTime::now();
        let start = Instant::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        feed(
            &mut trigger,
            &[],
            vec![event(EventType::Preempt, NotBefore::Invalid("soon".into()))],
            wall,
        );
        assert_eq!(signal.deadline(), Some(start + Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_not_before_in_the_past_means_now() {
        let wall = SystemTime::now();
        let start = Instant::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let past = NotBefore::At((wall - Duration::from_secs(10)).into());
        feed(
            &mut trigger,
            &[],
            vec![event(EventType::Reboot, past)],
            wall,
        );
        assert_eq!(signal.deadline(), Some(start));
    }

    #[test]
    fn the_notice_is_there_when_the_token_fires() {
        // A waiter woken by the token on another thread reads the notice at
        // once: it must already be published.
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let token = signal.token().clone();
        let reader = std::thread::spawn(move || {
            let give_up = std::time::Instant::now() + Duration::from_secs(10);
            while !token.is_cancelled() && std::time::Instant::now() < give_up {
                std::hint::spin_loop();
            }
            signal.notice()
        });
        let wall = SystemTime::now();
        feed(
            &mut trigger,
            &[],
            vec![event(EventType::Preempt, at(wall, 30))],
            wall,
        );
        assert!(reader.join().unwrap().is_some());
    }

    #[tokio::test]
    async fn cancellation_by_azure_is_observable() {
        let wall = SystemTime::now();
        let (mut trigger, mut signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let reboot = event(EventType::Reboot, at(wall, 900));
        feed(&mut trigger, &[], vec![reboot.clone()], wall);
        assert!(signal.changed().await);
        assert!(!signal.notice().unwrap().withdrawn);

        feed(&mut trigger, &[reboot], vec![], wall);
        assert!(signal.changed().await);
        assert!(signal.notice().unwrap().withdrawn);
        assert!(signal.token().is_cancelled());
    }

    #[tokio::test]
    async fn a_new_notice_is_in_force_again_after_a_withdrawal() {
        let wall = SystemTime::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let reboot = event(EventType::Reboot, at(wall, 900));
        feed(&mut trigger, &[], vec![reboot.clone()], wall);
        assert_eq!(signal.in_force().await.unwrap().event_id, reboot.id);
        feed(&mut trigger, &[reboot], vec![], wall);
        let waiting = signal.in_force();
        tokio::pin!(waiting);
        assert!(futures_poll(&mut waiting).is_pending(), "withdrawn");
        let mut preempt = event(EventType::Preempt, at(wall, 30));
        preempt.id = "E2".into();
        feed(&mut trigger, &[], vec![preempt.clone()], wall);
        assert_eq!(waiting.await.unwrap().event_id, preempt.id);
        drop(trigger);
        assert!(signal.in_force().await.is_some(), "still in force");
    }

    #[tokio::test]
    async fn an_event_that_drops_this_vm_withdraws_the_notice() {
        let wall = SystemTime::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let mine = event(EventType::Reboot, at(wall, 900));
        feed(&mut trigger, &[], vec![mine.clone()], wall);
        let mut theirs = mine.clone();
        theirs.resources = vec!["spotvmss_1".into()];
        feed(&mut trigger, &[mine], vec![theirs.clone()], wall);
        assert!(signal.notice().unwrap().withdrawn);
        // Its later cancellation changes nothing more.
        feed(&mut trigger, &[theirs], vec![], wall);
        assert!(signal.notice().unwrap().withdrawn);
    }

    #[tokio::test]
    async fn a_completed_impact_is_never_withdrawn() {
        let wall = SystemTime::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let mut first = event(EventType::Reboot, at(wall, 900));
        let mut second = first.clone();
        second.id = "E2".into();
        feed(&mut trigger, &[], vec![first.clone(), second.clone()], wall);
        let before = vec![first.clone(), second.clone()];
        first.status = EventStatus::Started;
        feed(
            &mut trigger,
            &before,
            vec![first.clone(), second.clone()],
            wall,
        );
        feed(&mut trigger, &[first, second], vec![], wall);
        assert!(!signal.notice().unwrap().withdrawn);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_follows_the_earliest_pending_event() {
        let wall = whole_seconds(SystemTime::now());
        let start = Instant::now();
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let late = event(EventType::Reboot, at(wall, 900));
        let mut soon = event(EventType::Preempt, at(wall, 30));
        soon.id = "E2".into();
        feed(&mut trigger, &[], vec![late.clone(), soon.clone()], wall);
        assert_eq!(signal.deadline(), Some(start + Duration::from_secs(30)));
        // The Preempt is called off: the Reboot's deadline applies again.
        feed(&mut trigger, &[late.clone(), soon], vec![late], wall);
        let notice = signal.notice().unwrap();
        assert_eq!(notice.deadline, start + Duration::from_secs(900));
        assert!(!notice.withdrawn);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_reached_resolves_after_the_watcher_is_gone() {
        let wall = whole_seconds(SystemTime::now());
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        feed(
            &mut trigger,
            &[],
            vec![event(EventType::Preempt, at(wall, 30))],
            wall,
        );
        drop(trigger);
        let waited = tokio::time::timeout(Duration::from_secs(31), signal.deadline_reached()).await;
        assert!(waited.is_ok());
    }

    #[test]
    fn freeze_drains_only_when_long_or_unknown() {
        let policy = NoticePolicy::default();
        let mut freeze = event(EventType::Freeze, NotBefore::Unset);
        freeze.duration_in_seconds = Some(5);
        assert!(!policy.triggers(&freeze));
        freeze.duration_in_seconds = Some(31);
        assert!(policy.triggers(&freeze));
        freeze.duration_in_seconds = Some(-1);
        assert!(policy.triggers(&freeze));
        assert!(
            !policy
                .clone()
                .freeze(FreezePolicy::Ignore)
                .triggers(&freeze)
        );
        freeze.duration_in_seconds = Some(1);
        assert!(policy.freeze(FreezePolicy::Always).triggers(&freeze));
    }

    #[test]
    fn unknown_types_drain_only_when_asked() {
        let novel = event(EventType::Unknown("Hibernate".into()), NotBefore::Unset);
        assert!(!NoticePolicy::default().triggers(&novel));
        let policy = NoticePolicy::default().drain_on(EventType::Unknown("Hibernate".into()));
        assert!(policy.triggers(&novel));
    }

    #[test]
    fn events_for_other_vms_never_trigger() {
        let (mut trigger, signal) =
            NoticeTrigger::new(NoticePolicy::default(), CancellationToken::new());
        let mut other = event(EventType::Preempt, NotBefore::Unset);
        other.resources = vec!["spotvmss_1".into()];
        feed(&mut trigger, &[], vec![other], SystemTime::now());
        assert!(!signal.token().is_cancelled());
        assert!(signal.notice().is_none());
    }

    /// Polls a future once without a runtime waker dance.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::Pin::new(f).poll(&mut cx)
    }
}
