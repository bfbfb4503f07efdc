//! The consumer's decisions as pure functions of a delivery's facts, so
//! every rule is in one place and tested as a table:
//!
//! - [`admit`]: before the handler runs: delete a job that is completed
//!   already, poison a body that cannot be decoded or a message stuck in a
//!   crash loop, or run it.
//! - [`settle`]: after the handler stopped: delete, release, wait for the
//!   other holder of the job, retry, or poison.
//!
//! Only a handler's own failure counts towards the poison queue: a delivery
//! ended by shutdown (a Spot eviction) or by a lost lease never does. The
//! crash-loop guard counts deliveries without a recorded outcome (failure,
//! wait for a peer, or release on shutdown): crashes, and the few
//! deliveries whose outcome could not be recorded.

use spot_worker_storage::attempts::Attempts;

/// The limits that turn counts into a poison decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Failures after which a message is poisoned.
    pub(crate) max_failures: u32,
    /// Deliveries without a recorded outcome after which it is poisoned.
    pub(crate) max_deliveries: u32,
}

/// Why a message goes to the poison queue; its text is the record's
/// `last_error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoisonCause {
    /// The message text does not decode with the configured encoding.
    Undecodable(String),
    /// Delivered too often without a recorded outcome (no failure, wait for
    /// a peer or release on shutdown). The consumer cannot tell why each
    /// such delivery ended: the process died, its lease was lost, it waited
    /// for the checkpoint store (whose outage leaves no record, the record
    /// living in that store), or it was released but the record of that
    /// could not be written in time.
    CrashLoop {
        dequeue_count: u32,
        unexplained: u32,
        max_deliveries: u32,
    },
    /// The job's key is one the workers keep for their own records
    /// ([`reserved_job_key`](spot_worker_storage::reserved_job_key)): why.
    Reserved(String),
    /// The handler marked its failure permanent.
    Permanent(String),
    /// The job's lane record names this message as poisoned, and its
    /// attempt record (which says why) was not there to say more: the
    /// poisoning an earlier delivery began is finished.
    Tombstoned,
    /// The handler failed `failures` times.
    Failed {
        failures: u32,
        max_failures: u32,
        last_error: String,
    },
}

impl PoisonCause {
    /// Whether the handler's own failure sent the message here (counted as
    /// a failure), rather than its body or the crash-loop guard.
    pub(crate) fn is_handler_failure(&self) -> bool {
        matches!(self, PoisonCause::Permanent(_) | PoisonCause::Failed { .. })
    }

    /// The poison record's `last_error`: what really happened.
    pub(crate) fn describe(&self) -> String {
        match self {
            PoisonCause::Undecodable(reason) => format!("the message does not decode: {reason}"),
            PoisonCause::CrashLoop {
                dequeue_count,
                unexplained,
                max_deliveries,
            } => {
                let deliveries = if unexplained == dequeue_count {
                    format!("delivered {dequeue_count} times without an outcome")
                } else {
                    format!(
                        "delivered {dequeue_count} times, {unexplained} of them without an outcome"
                    )
                };
                format!(
                    "crash-loop guard: {deliveries} (no failure, wait for a peer or release \
                     recorded), more than max_deliveries {max_deliveries}"
                )
            }
            PoisonCause::Reserved(reason) => format!("refused unrun: {reason}"),
            PoisonCause::Tombstoned => "an earlier delivery began moving it to the poison queue \
                 (the job's lane record is its tombstone); its reason was not kept"
                .to_owned(),
            PoisonCause::Permanent(error) => format!("permanent failure: {error}"),
            PoisonCause::Failed {
                failures,
                max_failures,
                last_error,
            } => {
                let times = if *failures == 1 { "time" } else { "times" };
                format!(
                    "the handler failed {failures} {times} (max_failures {max_failures}); last error: {last_error}"
                )
            }
        }
    }
}

/// What is known when a message arrives.
#[derive(Clone, Debug)]
pub(crate) struct Arrival<'a> {
    /// Receives so far, this one included.
    pub(crate) dequeue_count: u32,
    /// What the job's checkpoint says about completion.
    pub(crate) completion: Completion,
    /// Why the body does not decode, if it does not.
    pub(crate) undecodable: Option<&'a str>,
    /// Outcomes recorded by earlier deliveries (read only when the
    /// crash-loop guard could fire; empty otherwise).
    pub(crate) attempts: &'a Attempts,
    /// The record was needed but could not be read (the checkpoint store
    /// could not be reached): the crash-loop guard cannot count.
    pub(crate) record_unread: bool,
}

/// What the job's checkpoint says, checked before the handler runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    NotCompleted,
    /// Completed, and the handler agrees it is this message's job.
    Completed,
    /// Completed, but the handler says this message asks for another job
    /// under the same key (its permanent error).
    CompletedDifferently(String),
}

/// What to do with a message before running its handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    Run,
    /// Done on an earlier delivery (or by a duplicate message): delete.
    DeleteCompleted,
    Poison(PoisonCause),
}

/// Decides what to do with a message that just arrived. A completed job is
/// deleted before any poison decision: a finished job whose delete was cut
/// short must never land in the poison queue.
pub(crate) fn admit(arrival: &Arrival<'_>, limits: Limits) -> Admission {
    match &arrival.completion {
        Completion::Completed => return Admission::DeleteCompleted,
        Completion::CompletedDifferently(reason) => {
            return Admission::Poison(PoisonCause::Permanent(reason.clone()));
        }
        Completion::NotCompleted => {}
    }
    if let Some(reason) = arrival.undecodable {
        return Admission::Poison(PoisonCause::Undecodable(reason.to_owned()));
    }
    let unexplained = arrival.attempts.unexplained(arrival.dequeue_count);
    // A storage error never poisons a message: without its record the
    // guard would take every recorded failure and wait for a missing
    // outcome. It is consulted again at the next delivery.
    if unexplained > limits.max_deliveries && !arrival.record_unread {
        return Admission::Poison(PoisonCause::CrashLoop {
            dequeue_count: arrival.dequeue_count,
            unexplained,
            max_deliveries: limits.max_deliveries,
        });
    }
    Admission::Run
}

/// How the handler's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ending<'a> {
    Succeeded,
    Failed {
        error: &'a str,
        permanent: bool,
    },
    /// Dropped before it finished (release stage, or lease lost).
    Dropped,
}

/// What is known when the handler has stopped.
#[derive(Clone, Debug)]
pub(crate) struct Departure<'a> {
    pub(crate) ending: Ending<'a>,
    /// Another consumer has the message now: nothing may be written for it.
    pub(crate) lease_lost: bool,
    /// The worker is winding down or releasing: the handler was told to stop.
    pub(crate) shutting_down: bool,
    /// The failure is a conflict on the job's own key: this delivery's
    /// latest write of the job's checkpoint lost to another holder of the
    /// job (a conflict on another key, or one resolved by a later write,
    /// does not count).
    pub(crate) fenced_by_peer: bool,
    /// The checkpoint store could not be reached while the handler ran.
    pub(crate) store_unreachable: bool,
    /// Outcomes recorded by earlier deliveries.
    pub(crate) attempts: &'a Attempts,
}

/// What to do with a message once its handler has stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Settlement {
    Delete,
    /// Visible again at once, not counted: the worker is shutting down.
    Release,
    /// Nothing may or need be done (the lease is lost, or the handler was
    /// dropped for no known reason: the message reappears after its lease).
    Leave(&'static str),
    /// Fenced out by another holder of the job: record the wait and check
    /// again later; never poisoned for it.
    WaitForPeer {
        attempts: Attempts,
    },
    /// The handler stopped because the checkpoint store could not be
    /// reached: try again after a backoff, uncounted (the attempt record
    /// lives in that store too, so nothing is recorded).
    WaitForStore,
    /// Record the failure and retry after a backoff.
    Retry {
        attempts: Attempts,
    },
    Poison(PoisonCause),
}

/// Decides how to settle a delivery whose handler has stopped.
pub(crate) fn settle(departure: &Departure<'_>, limits: Limits) -> Settlement {
    if departure.lease_lost {
        return Settlement::Leave("the lease is lost; another consumer has the message");
    }
    let (error, permanent) = match departure.ending {
        Ending::Succeeded => return Settlement::Delete,
        // Whatever a handler told to stop returns, it did not fail on its
        // own: hand the message to another worker now, uncounted.
        _ if departure.shutting_down => return Settlement::Release,
        Ending::Dropped => return Settlement::Leave("the handler was dropped for no known reason"),
        Ending::Failed { error, permanent } => (error, permanent),
    };
    // The handler's own verdict wins over anything noted on the way.
    if permanent {
        return Settlement::Poison(PoisonCause::Permanent(error.to_owned()));
    }
    if departure.fenced_by_peer {
        return Settlement::WaitForPeer {
            attempts: departure.attempts.waited(),
        };
    }
    // A storage outage is not the handler's fault, whatever error it
    // turned into on the way out.
    if departure.store_unreachable {
        return Settlement::WaitForStore;
    }
    let attempts = departure.attempts.failed(error);
    if attempts.failures >= limits.max_failures {
        return Settlement::Poison(PoisonCause::Failed {
            failures: attempts.failures,
            max_failures: limits.max_failures,
            last_error: error.to_owned(),
        });
    }
    Settlement::Retry { attempts }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_failures: 3,
        max_deliveries: 10,
    };

    fn attempts(failures: u32, waits: u32) -> Attempts {
        Attempts {
            failures,
            waits,
            ..Attempts::default()
        }
    }

    fn with_releases(failures: u32, waits: u32, releases: u32) -> Attempts {
        Attempts {
            releases,
            ..attempts(failures, waits)
        }
    }

    #[test]
    fn admission_table() {
        use Admission::*;
        let none = attempts(0, 0);
        let crash_loop = |dequeue_count, unexplained| {
            Poison(PoisonCause::CrashLoop {
                dequeue_count,
                unexplained,
                max_deliveries: 10,
            })
        };
        let open = Completion::NotCompleted;
        let done = Completion::Completed;
        let other = Completion::CompletedDifferently("j1 was [0, 10)".into());
        // (dequeue count, completion, undecodable, attempts, expected)
        let rows: Vec<(u32, Completion, Option<&str>, Attempts, Admission)> = vec![
            (1, open.clone(), None, none.clone(), Run),
            // Not reported by the queue: nothing to count.
            (0, open.clone(), None, none.clone(), Run),
            (10, open.clone(), None, none.clone(), Run),
            (11, open.clone(), None, none.clone(), crash_loop(11, 11)),
            // Recorded failures and waits are explained deliveries.
            (11, open.clone(), None, attempts(1, 0), Run),
            (14, open.clone(), None, attempts(2, 2), Run),
            (15, open.clone(), None, attempts(2, 2), crash_loop(15, 11)),
            // Releases on shutdown (evictions) are explained too: however
            // often a job is evicted, the guard sees only the rest.
            (11, open.clone(), None, with_releases(0, 0, 1), Run),
            (500, open.clone(), None, with_releases(0, 0, 499), Run),
            (500, open.clone(), None, with_releases(0, 0, 490), Run),
            (
                500,
                open.clone(),
                None,
                with_releases(0, 0, 489),
                crash_loop(500, 11),
            ),
            (30, open.clone(), None, with_releases(2, 3, 15), Run),
            (
                31,
                open.clone(),
                None,
                with_releases(2, 3, 15),
                crash_loop(31, 11),
            ),
            // Completed wins over every poison reason.
            (1, done.clone(), None, none.clone(), DeleteCompleted),
            (500, done.clone(), None, none.clone(), DeleteCompleted),
            (3, done, Some("bad base64"), none.clone(), DeleteCompleted),
            // Completed as another job: a permanent failure, never a skip.
            (
                1,
                other.clone(),
                None,
                none.clone(),
                Poison(PoisonCause::Permanent("j1 was [0, 10)".into())),
            ),
            (
                500,
                other,
                None,
                none.clone(),
                Poison(PoisonCause::Permanent("j1 was [0, 10)".into())),
            ),
            (
                1,
                open,
                Some("bad base64"),
                none.clone(),
                Poison(PoisonCause::Undecodable("bad base64".into())),
            ),
        ];
        for (dequeue_count, completion, undecodable, attempts, expected) in rows {
            let arrival = Arrival {
                dequeue_count,
                completion,
                undecodable,
                attempts: &attempts,
                record_unread: false,
            };
            assert_eq!(admit(&arrival, LIMITS), expected, "{arrival:?}");
        }
    }

    #[test]
    fn an_attempt_record_that_cannot_be_read_never_trips_the_crash_loop_guard() {
        use Admission::*;
        let none = attempts(0, 0);
        // (dequeue count, completion, undecodable, expected), all with the
        // record needed but unread.
        let rows: Vec<(u32, Completion, Option<&str>, Admission)> = vec![
            (11, Completion::NotCompleted, None, Run),
            (500, Completion::NotCompleted, None, Run),
            (500, Completion::Completed, None, DeleteCompleted),
            (
                500,
                Completion::NotCompleted,
                Some("bad base64"),
                Poison(PoisonCause::Undecodable("bad base64".into())),
            ),
        ];
        for (dequeue_count, completion, undecodable, expected) in rows {
            let arrival = Arrival {
                dequeue_count,
                completion,
                undecodable,
                attempts: &none,
                record_unread: true,
            };
            assert_eq!(admit(&arrival, LIMITS), expected, "{arrival:?}");
        }
    }

    #[test]
    fn settlement_table() {
        use Settlement::*;
        let failed = Ending::Failed {
            error: "boom",
            permanent: false,
        };
        let permanent = Ending::Failed {
            error: "not a job",
            permanent: true,
        };
        let retry = |failures| Retry {
            attempts: Attempts {
                failures,
                last_error: Some("boom".into()),
                ..Attempts::default()
            },
        };
        let wait = |waits| WaitForPeer {
            attempts: Attempts {
                waits,
                ..Attempts::default()
            },
        };
        let poisoned = |failures| {
            Poison(PoisonCause::Failed {
                failures,
                max_failures: 3,
                last_error: "boom".into(),
            })
        };
        let lost = Leave("the lease is lost; another consumer has the message");
        // (ending, lease lost, shutting down, fenced by peer, attempts, expected)
        let rows: Vec<(Ending<'_>, bool, bool, bool, Attempts, Settlement)> = vec![
            (
                Ending::Succeeded,
                false,
                false,
                false,
                attempts(0, 0),
                Delete,
            ),
            (
                Ending::Succeeded,
                false,
                true,
                false,
                attempts(2, 0),
                Delete,
            ),
            // A lost lease: nothing may be written, whatever happened.
            (
                Ending::Succeeded,
                true,
                false,
                false,
                attempts(0, 0),
                lost.clone(),
            ),
            (
                failed.clone(),
                true,
                false,
                false,
                attempts(2, 0),
                lost.clone(),
            ),
            (Ending::Dropped, true, true, false, attempts(0, 0), lost),
            // Shutdown: released, never counted, however often.
            (failed.clone(), false, true, false, attempts(2, 0), Release),
            (
                permanent.clone(),
                false,
                true,
                false,
                attempts(0, 0),
                Release,
            ),
            (Ending::Dropped, false, true, false, attempts(0, 0), Release),
            (failed.clone(), false, true, true, attempts(0, 0), Release),
            (
                Ending::Dropped,
                false,
                false,
                false,
                attempts(0, 0),
                Leave("the handler was dropped for no known reason"),
            ),
            // Failures count up to max_failures.
            (
                failed.clone(),
                false,
                false,
                false,
                attempts(0, 0),
                retry(1),
            ),
            (
                failed.clone(),
                false,
                false,
                false,
                attempts(1, 0),
                retry(2),
            ),
            (
                failed.clone(),
                false,
                false,
                false,
                attempts(2, 0),
                poisoned(3),
            ),
            (
                failed.clone(),
                false,
                false,
                false,
                attempts(7, 0),
                poisoned(8),
            ),
            // Fenced out by another holder of the job: wait, never poison.
            (failed.clone(), false, false, true, attempts(0, 0), wait(1)),
            (
                failed.clone(),
                false,
                false,
                true,
                attempts(0, 40),
                wait(41),
            ),
            // Permanent: poisoned at once, even when fenced out by another
            // holder of the job (the handler's own verdict wins).
            (
                permanent.clone(),
                false,
                false,
                true,
                attempts(0, 0),
                Poison(PoisonCause::Permanent("not a job".into())),
            ),
            (
                permanent.clone(),
                false,
                false,
                true,
                attempts(2, 40),
                Poison(PoisonCause::Permanent("not a job".into())),
            ),
            (
                permanent,
                false,
                false,
                false,
                attempts(0, 0),
                Poison(PoisonCause::Permanent("not a job".into())),
            ),
        ];
        for (ending, lease_lost, shutting_down, fenced_by_peer, attempts, expected) in rows {
            let departure = Departure {
                ending,
                lease_lost,
                shutting_down,
                fenced_by_peer,
                store_unreachable: false,
                attempts: &attempts,
            };
            assert_eq!(settle(&departure, LIMITS), expected, "{departure:?}");
        }
    }

    #[test]
    fn a_handler_stopped_by_a_storage_outage_waits_for_the_store_uncounted() {
        use Settlement::*;
        let failed = Ending::Failed {
            error: "checkpoint store unavailable",
            permanent: false,
        };
        let permanent = Ending::Failed {
            error: "not a job",
            permanent: true,
        };
        // All with the store unreachable and two failures recorded (a third
        // would poison): (ending, lease lost, shutting down, fenced by peer,
        // expected)
        let rows: Vec<(Ending<'_>, bool, bool, bool, Settlement)> = vec![
            (failed.clone(), false, false, false, WaitForStore),
            (Ending::Succeeded, false, false, false, Delete),
            (failed.clone(), false, true, false, Release),
            (
                failed.clone(),
                true,
                false,
                false,
                Leave("the lease is lost; another consumer has the message"),
            ),
            // Another holder's write is news about the job: wait for it.
            (
                failed,
                false,
                false,
                true,
                WaitForPeer {
                    attempts: attempts(2, 1),
                },
            ),
            // The handler's own verdict stands, fenced out or not.
            (
                permanent.clone(),
                false,
                false,
                false,
                Poison(PoisonCause::Permanent("not a job".into())),
            ),
            (
                permanent,
                false,
                false,
                true,
                Poison(PoisonCause::Permanent("not a job".into())),
            ),
        ];
        for (ending, lease_lost, shutting_down, fenced_by_peer, expected) in rows {
            let departure = Departure {
                ending,
                lease_lost,
                shutting_down,
                fenced_by_peer,
                store_unreachable: true,
                attempts: &attempts(2, 0),
            };
            assert_eq!(settle(&departure, LIMITS), expected, "{departure:?}");
        }
    }

    #[test]
    fn poison_causes_name_what_happened() {
        // Only what is known: the deliveries left no outcome. Why each
        // ended (a crash, an eviction, a lost lease, a wait for the store)
        // the consumer cannot tell, so the reason does not guess.
        let crash = |dequeue_count, unexplained| {
            PoisonCause::CrashLoop {
                dequeue_count,
                unexplained,
                max_deliveries: 100,
            }
            .describe()
        };
        assert_eq!(
            crash(101, 101),
            "crash-loop guard: delivered 101 times without an outcome (no failure, wait for a \
             peer or release recorded), more than max_deliveries 100"
        );
        assert_eq!(
            crash(104, 101),
            "crash-loop guard: delivered 104 times, 101 of them without an outcome (no failure, \
             wait for a peer or release recorded), more than max_deliveries 100"
        );
        let failed = PoisonCause::Failed {
            failures: 5,
            max_failures: 5,
            last_error: "db down".into(),
        }
        .describe();
        assert!(
            failed.contains("failed 5 times") && failed.ends_with("db down"),
            "{failed}"
        );
        assert_eq!(
            PoisonCause::Permanent("range 5..3 is empty".into()).describe(),
            "permanent failure: range 5..3 is empty"
        );
    }
}
