//! [`StoreHealth`]: whether the checkpoint store serves this worker, and the
//! decision, as a pure function with a table test, between a short outage
//! (waited out, uncounted, intake goes on), a refusal and a missing
//! container (waited out the same way at first; paused on once they
//! persist).
//!
//! "Persists" is defined per kind of request (read, write, delete, the
//! probe): requests of one kind refused (401/403) or finding the container
//! missing (404 `ContainerNotFound`), with none of that kind answered in
//! between, for at least the grace ([`ConsumerConfig::refusal_grace`]).
//! Refusals are counted per kind because a role can lose one permission
//! and keep another: a store that still answers reads but refuses every
//! write would otherwise look healthy after each read. Outages prove
//! nothing either way and leave the decision as it was. Once paused, only a
//! successful probe ([`CheckpointStore::prepare`]: create the container if
//! missing, write and delete a probe blob) resumes: answered reads prove
//! nothing about writes.
//!
//! [`ConsumerConfig::refusal_grace`]: crate::ConsumerConfig::refusal_grace
//! [`CheckpointStore::prepare`]: spot_worker_storage::CheckpointStore::prepare

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use spot_worker_storage::StorageError;

/// Whether the checkpoint store serves this worker, as the consumer last
/// found it. Not healthy means intake is paused; the reason is for
/// `/readyz`, logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreHealth {
    /// Answering, or failing for less than the grace (an outage, a refusal
    /// or a missing container still waited out uncounted).
    #[default]
    Healthy,
    /// The store has refused this worker's requests for longer than the
    /// grace (a role assignment removed, a SAS without write permission).
    Refused {
        /// The latest refusal, as the service put it.
        reason: String,
    },
    /// The store's container has been missing for longer than the grace,
    /// and re-creating it has not worked (yet).
    MissingContainer {
        /// The latest "container not found", as the service put it.
        reason: String,
        /// Why re-creating it failed, if the service refused that too.
        recreate_refused: Option<String>,
    },
}

impl StoreHealth {
    /// Whether the consumer takes work.
    pub fn is_healthy(&self) -> bool {
        matches!(self, StoreHealth::Healthy)
    }

    /// A short, bounded name of the problem for metric attributes:
    /// `refused` or `missing_container`; `None` while healthy.
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            StoreHealth::Healthy => None,
            StoreHealth::Refused { .. } => Some("refused"),
            StoreHealth::MissingContainer { .. } => Some("missing_container"),
        }
    }
}

impl fmt::Display for StoreHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreHealth::Healthy => f.write_str("the checkpoint store answers"),
            StoreHealth::Refused { reason } => write!(
                f,
                "the checkpoint store refuses this worker's requests (intake paused until it answers again): {reason}"
            ),
            StoreHealth::MissingContainer {
                reason,
                recreate_refused: None,
            } => write!(
                f,
                "the checkpoint container is missing (intake paused; re-creating it): {reason}"
            ),
            StoreHealth::MissingContainer {
                reason,
                recreate_refused: Some(refusal),
            } => write!(
                f,
                "the checkpoint container is missing and this worker may not create it (intake paused until it exists): {reason}; creating it was refused: {refusal}"
            ),
        }
    }
}

/// The kind of request an observation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Delete,
    /// [`CheckpointStore::prepare`](spot_worker_storage::CheckpointStore::prepare): the
    /// probe that proves the store serves the worker again.
    Probe,
}

impl Op {
    fn index(self) -> usize {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Delete => 2,
            Op::Probe => 3,
        }
    }
}

/// What one request showed about the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// It answered (success, or an answer about the data: not found,
    /// conflict, invalid data, a bad request).
    Answered,
    /// Nothing either way: an outage, or an error made before any request.
    Nothing,
    Refused(String),
    MissingContainer(String),
}

impl Seen {
    /// Classifies the result of one `op` request.
    pub(crate) fn of<T>(op: Op, result: &Result<T, StorageError>) -> Seen {
        match result {
            Ok(_) => Seen::Answered,
            Err(StorageError::Refused { .. }) => Seen::Refused(error_text(result)),
            Err(StorageError::MissingContainer { .. }) => {
                Seen::MissingContainer(error_text(result))
            }
            Err(
                StorageError::Unavailable { .. }
                | StorageError::JobCancelled { .. }
                | StorageError::InvalidArgument(_),
            ) => Seen::Nothing,
            // A probe proves the store serves the worker only by succeeding
            // (re-creating a container just deleted fails with 409 for a
            // while: that is no answer yet).
            Err(_) if op == Op::Probe => Seen::Nothing,
            Err(_) => Seen::Answered,
        }
    }
}

fn error_text<T>(result: &Result<T, StorageError>) -> String {
    result
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// Refusals of one kind of request not yet broken by an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Streak {
    since: Instant,
}

/// What the decision remembers between requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HealthState {
    streaks: [Option<Streak>; 4],
    pub(crate) health: StoreHealth,
}

/// The state after `op` showed `seen` at `now`, with `grace` before a
/// refusal or a missing container counts as persisting.
pub(crate) fn assess(
    state: &HealthState,
    op: Op,
    seen: Seen,
    now: Instant,
    grace: Duration,
) -> HealthState {
    let mut next = state.clone();
    let slot = &mut next.streaks[op.index()];
    let problem = match seen {
        Seen::Nothing => return next,
        Seen::Answered if op == Op::Probe => {
            // The probe created, wrote and deleted: everything works.
            return HealthState::default();
        }
        Seen::Answered => {
            *slot = None;
            return next;
        }
        Seen::Refused(reason) => Problem::Refused(reason),
        Seen::MissingContainer(reason) => Problem::Missing(reason),
    };
    let since = slot.get_or_insert(Streak { since: now }).since;
    let persisted = now.saturating_duration_since(since) >= grace;
    next.health = match (&state.health, problem) {
        // Paused: stays paused, with the latest reason; a missing container
        // whose re-creation is refused says so.
        (StoreHealth::MissingContainer { reason, .. }, Problem::Refused(refusal)) => {
            StoreHealth::MissingContainer {
                reason: reason.clone(),
                recreate_refused: Some(refusal),
            }
        }
        (
            StoreHealth::MissingContainer {
                recreate_refused, ..
            },
            Problem::Missing(reason),
        ) => StoreHealth::MissingContainer {
            reason,
            recreate_refused: recreate_refused.clone(),
        },
        (health, problem) if !health.is_healthy() || persisted => problem.into_health(),
        (health, _) => health.clone(),
    };
    next
}

enum Problem {
    Refused(String),
    Missing(String),
}

impl Problem {
    fn into_health(self) -> StoreHealth {
        match self {
            Problem::Refused(reason) => StoreHealth::Refused { reason },
            Problem::Missing(reason) => StoreHealth::MissingContainer {
                reason,
                recreate_refused: None,
            },
        }
    }
}

/// How often a paused consumer logs why at error level.
pub(crate) const PAUSED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Whether a paused consumer logs now, having last logged at `last`.
pub(crate) fn log_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|last| now.saturating_duration_since(last) >= PAUSED_LOG_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    fn refused() -> Seen {
        Seen::Refused("403 AuthorizationPermissionMismatch".into())
    }

    fn missing() -> Seen {
        Seen::MissingContainer("404 ContainerNotFound".into())
    }

    fn refused_health() -> StoreHealth {
        StoreHealth::Refused {
            reason: "403 AuthorizationPermissionMismatch".into(),
        }
    }

    fn missing_health(recreate_refused: Option<&str>) -> StoreHealth {
        StoreHealth::MissingContainer {
            reason: "404 ContainerNotFound".into(),
            recreate_refused: recreate_refused.map(str::to_owned),
        }
    }

    /// Requests: the kind, what it showed, seconds after the start.
    type Requests = Vec<(Op, Seen, u64)>;

    /// Each row: requests and the health after the last one.
    #[test]
    fn outages_are_waited_out_and_refusals_pause_only_once_they_persist() {
        use Op::*;
        let rows: Vec<(&str, Requests, StoreHealth)> = vec![
            (
                "one refusal",
                vec![(Write, refused(), 0)],
                StoreHealth::Healthy,
            ),
            (
                "refusals shorter than the grace",
                vec![(Write, refused(), 0), (Write, refused(), 29)],
                StoreHealth::Healthy,
            ),
            (
                "refusals over the grace",
                vec![(Write, refused(), 0), (Write, refused(), 30)],
                refused_health(),
            ),
            (
                "an outage never pauses",
                vec![(Read, Seen::Nothing, 0), (Read, Seen::Nothing, 600)],
                StoreHealth::Healthy,
            ),
            (
                "an outage between refusals does not break them",
                vec![
                    (Write, refused(), 0),
                    (Write, Seen::Nothing, 10),
                    (Write, refused(), 40),
                ],
                refused_health(),
            ),
            (
                "an answer breaks a streak",
                vec![
                    (Write, refused(), 0),
                    (Write, Seen::Answered, 10),
                    (Write, refused(), 40),
                ],
                StoreHealth::Healthy,
            ),
            (
                "reads answered do not hide refused writes",
                vec![
                    (Write, refused(), 0),
                    (Read, Seen::Answered, 10),
                    (Write, refused(), 31),
                ],
                refused_health(),
            ),
            (
                "a missing container that persists",
                vec![(Read, missing(), 0), (Read, missing(), 31)],
                missing_health(None),
            ),
            (
                "paused, answered reads do not resume",
                vec![
                    (Write, refused(), 0),
                    (Write, refused(), 30),
                    (Read, Seen::Answered, 31),
                ],
                refused_health(),
            ),
            (
                "paused, a failed probe stays paused",
                vec![
                    (Write, refused(), 0),
                    (Write, refused(), 30),
                    (Probe, refused(), 31),
                    (Probe, Seen::Nothing, 40),
                ],
                refused_health(),
            ),
            (
                "paused, a successful probe resumes",
                vec![
                    (Write, refused(), 0),
                    (Write, refused(), 30),
                    (Probe, Seen::Answered, 60),
                ],
                StoreHealth::Healthy,
            ),
            (
                "a missing container whose re-creation is refused says so",
                vec![
                    (Read, missing(), 0),
                    (Read, missing(), 30),
                    (Probe, refused(), 31),
                ],
                missing_health(Some("403 AuthorizationPermissionMismatch")),
            ),
            (
                "a missing container re-created resumes",
                vec![
                    (Read, missing(), 0),
                    (Read, missing(), 30),
                    (Probe, Seen::Answered, 31),
                ],
                StoreHealth::Healthy,
            ),
        ];
        let start = Instant::now();
        for (name, requests, expected) in rows {
            let mut state = HealthState::default();
            for (op, seen, at) in requests {
                state = assess(&state, op, seen, start + Duration::from_secs(at), GRACE);
            }
            assert_eq!(state.health, expected, "{name}");
        }
    }

    #[test]
    fn a_zero_grace_pauses_at_the_first_refusal() {
        let state = assess(
            &HealthState::default(),
            Op::Write,
            refused(),
            Instant::now(),
            Duration::ZERO,
        );
        assert_eq!(state.health, refused_health());
    }

    #[test]
    fn errors_are_classified_by_kind_and_request() {
        let refused: Result<(), _> = Err(StorageError::Refused {
            status: 403,
            message: "AuthorizationPermissionMismatch".into(),
        });
        let missing: Result<(), _> = Err(StorageError::MissingContainer {
            what: "checkpoint checkpoints/j1".into(),
            message: "ContainerNotFound".into(),
        });
        let outage: Result<(), _> = Err(StorageError::Unavailable {
            message: "connection refused".into(),
        });
        let conflict: Result<(), _> = Err(StorageError::Conflict { key: "k".into() });
        for (op, result, expected) in [
            (Op::Read, Ok(()), "answered"),
            (Op::Write, refused.clone(), "refused"),
            (Op::Probe, refused, "refused"),
            (Op::Read, missing.clone(), "missing"),
            (Op::Probe, missing, "missing"),
            (Op::Read, outage.clone(), "nothing"),
            (Op::Probe, outage, "nothing"),
            (Op::Write, conflict.clone(), "answered"),
            (Op::Probe, conflict, "nothing"),
        ] {
            let seen = match Seen::of(op, &result) {
                Seen::Answered => "answered",
                Seen::Nothing => "nothing",
                Seen::Refused(_) => "refused",
                Seen::MissingContainer(_) => "missing",
            };
            assert_eq!(seen, expected, "{op:?} {result:?}");
        }
    }

    #[test]
    fn a_paused_consumer_logs_once_a_minute() {
        let start = Instant::now();
        for (last, after, due) in [
            (None, 0, true),
            (Some(start), 0, false),
            (Some(start), 59, false),
            (Some(start), 60, true),
        ] {
            assert_eq!(log_due(last, start + Duration::from_secs(after)), due);
        }
    }

    #[test]
    fn the_reason_is_in_the_text() {
        let text = missing_health(Some("403 nope")).to_string();
        assert!(text.contains("404 ContainerNotFound") && text.contains("403 nope"));
        assert!(refused_health().to_string().contains("refuses"));
        assert_eq!(refused_health().kind(), Some("refused"));
        assert_eq!(StoreHealth::Healthy.kind(), None);
    }
}
