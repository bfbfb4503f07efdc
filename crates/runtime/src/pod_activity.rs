//! What this worker holds and how much of it is unsaved, for its pod's
//! deletion cost (issue 39, item 2): the worker's one hook for it.
//!
//! [`PodActivity`] counts the jobs a handler is running and, for each, when
//! its work was last saved (its start until its first checkpoint write).
//! Two decorators feed it, and nothing else in the worker knows of it:
//! [`ActivityHandler`] around the handler (a job is held while its handler
//! runs) and [`ActivityCheckpoints`] around the checkpoint store (a
//! successful write under a held job's key is a save). The
//! [`pod_deletion_cost`](crate::pod_deletion_cost) task reads
//! [`PodActivity::activity`] and is woken by [`PodActivity::changed`] when
//! the worker turns busy or idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spot_worker_consumer::{HandlerError, Job, MessageHandler};
use spot_worker_decisions::scale_in::Activity;
use spot_worker_storage::{CheckpointStore, ETag, StorageError};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The jobs this worker holds and their last saves; cheap to clone.
#[derive(Clone, Default)]
pub struct PodActivity {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Held jobs by a per-delivery id: (job key, last save or start).
    held: HashMap<u64, (String, Instant)>,
    ever_busy: bool,
    idle_since: Option<Instant>,
}

impl PodActivity {
    /// Nothing held yet: [`Activity::Starting`] until the first job.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A handler started on the job under `key` at `now`; returns the id
    /// [`settled`](Self::settled) takes.
    pub fn taken(&self, key: &str, now: Instant) -> u64 {
        let (id, was_idle) = {
            let mut state = self.state();
            let was_idle = state.held.is_empty();
            let id = state.next_id;
            state.next_id = state.next_id.wrapping_add(1);
            state.held.insert(id, (key.to_owned(), now));
            state.ever_busy = true;
            (id, was_idle)
        };
        if was_idle {
            self.inner.changed.notify_one();
        }
        id
    }

    /// The checkpoint of the job under `key` was saved at `now`.
    pub fn saved(&self, key: &str, now: Instant) {
        for (held_key, since) in self.state().held.values_mut() {
            if held_key == key {
                *since = now;
            }
        }
    }

    /// The handler of `id` returned at `now`.
    pub fn settled(&self, id: u64, now: Instant) {
        let now_idle = {
            let mut state = self.state();
            state.held.remove(&id);
            let idle = state.held.is_empty();
            if idle {
                state.idle_since = Some(now);
            }
            idle
        };
        if now_idle {
            self.inner.changed.notify_one();
        }
    }

    /// What the worker is doing at `now`: busy with the sum of its jobs'
    /// unsaved time (see [`spot_worker_decisions::deletion_cost`] for why
    /// the sum).
    pub fn activity(&self, now: Instant) -> Activity {
        let state = self.state();
        if !state.held.is_empty() {
            let unsaved = state
                .held
                .values()
                .map(|(_, since)| now.saturating_duration_since(*since))
                .fold(Duration::ZERO, Duration::saturating_add);
            Activity::Busy { unsaved }
        } else if let Some(since) = state.idle_since.filter(|_| state.ever_busy) {
            Activity::Idle {
                idle_for: now.saturating_duration_since(since),
            }
        } else {
            Activity::Starting
        }
    }

    /// Resolves when the worker has turned busy or idle since the last
    /// call (at once if it did before this call).
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }
}

/// A handler that tells [`PodActivity`] while it runs a job.
pub(crate) struct ActivityHandler<H> {
    pub(crate) inner: H,
    pub(crate) activity: Option<PodActivity>,
}

impl<H: MessageHandler> MessageHandler for ActivityHandler<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let Some(activity) = &self.activity else {
            return self.inner.handle(job).await;
        };
        let id = activity.taken(job.key(), Instant::now());
        // Settled however the handler ends, a panic unwinding through here
        // included.
        struct Settle<'a>(&'a PodActivity, u64);
        impl Drop for Settle<'_> {
            fn drop(&mut self) {
                self.0.settled(self.1, Instant::now());
            }
        }
        let _settle = Settle(activity, id);
        self.inner.handle(job).await
    }

    crate::decorator::forward_job_knowledge!();
}

/// A checkpoint store that tells [`PodActivity`] of every successful write.
pub(crate) struct ActivityCheckpoints {
    pub(crate) inner: Arc<dyn CheckpointStore>,
    pub(crate) activity: PodActivity,
}

crate::decorator::checkpoint_writes_decorator!(ActivityCheckpoints);

impl ActivityCheckpoints {
    /// A successful write under a held job's key is its save.
    fn written(&self, key: &str, result: &Result<ETag, StorageError>, _: std::time::Instant) {
        if result.is_ok() {
            self.activity.saved(key, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn starting_busy_with_summed_unsaved_work_then_idle() {
        let activity = PodActivity::new();
        let start = Instant::now();
        let at = |s| start + S(s);
        assert_eq!(activity.activity(at(0)), Activity::Starting);
        let a = activity.taken("job-a", at(0));
        let b = activity.taken("job-b", at(100));
        assert_eq!(
            activity.activity(at(200)),
            Activity::Busy { unsaved: S(300) }
        );
        activity.saved("job-a", at(150));
        activity.saved("not-held", at(190));
        assert_eq!(
            activity.activity(at(200)),
            Activity::Busy { unsaved: S(150) }
        );
        activity.settled(a, at(210));
        assert_eq!(
            activity.activity(at(220)),
            Activity::Busy { unsaved: S(120) }
        );
        activity.settled(b, at(230));
        assert_eq!(
            activity.activity(at(240)),
            Activity::Idle { idle_for: S(10) }
        );
    }

    #[tokio::test]
    async fn turning_busy_or_idle_wakes_the_keeper() {
        let activity = PodActivity::new();
        let id = activity.taken("job", Instant::now());
        tokio::time::timeout(S(5), activity.changed())
            .await
            .expect("woken by busy");
        activity.saved("job", Instant::now());
        activity.settled(id, Instant::now());
        tokio::time::timeout(S(5), activity.changed())
            .await
            .expect("woken by idle");
    }
}
