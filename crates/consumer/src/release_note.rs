//! Release notes: each release on shutdown (an eviction) is recorded in the
//! message's attempt record (`releases += 1`), so the crash-loop guard,
//! which counts deliveries without a recorded outcome, does not take an
//! eviction for a crash. Without it a job evicted more than
//! `max_deliveries` times would be poisoned.
//!
//! The note is written when the wind-down begins: the handler is still
//! running and the message still leased, seconds before the release, so the
//! write is off the release's path. A release that comes before the note is
//! written (no wind-down at all: a second signal, [`Consumer::run`]) writes
//! it beside the release, concurrently, never in front of it. Either way the
//! write is the attempt record's usual ETag-fenced read and rewrite, bounded
//! by [`NOTE_DEADLINE`]; one that fails or runs out of time is logged and
//! that delivery stays unexplained.
//!
//! A delivery records at most one outcome: the note is started only while
//! the delivery is not being settled yet, and a delivery settled during a
//! shutdown writes no other outcome (it is released, deleted, or left to a
//! lost lease).
//!
//! [`Consumer::run`]: super::Consumer::run

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures_util::future::maybe_done;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use spot_worker_storage::MessageId;

use spot_worker_storage::attempts::AttemptLog;

/// The longest a note may take (capped at the settle timeout). Two small
/// requests take tens of milliseconds; a store that is slower than this
/// during a drain is not waited for.
pub(super) const NOTE_DEADLINE: Duration = Duration::from_secs(1);

/// Nobody has claimed the note yet.
const OPEN: u8 = 0;
/// The wind-down watch claimed it: the note is being written.
const WRITING: u8 = 1;
/// Settling claimed it first: the watch writes nothing.
const CLOSED: u8 = 2;

/// Records one release of `id` in its attempt record, within `deadline`;
/// whether it was recorded.
pub(super) async fn write_note(log: &AttemptLog, id: &MessageId, deadline: Duration) -> bool {
    let note = async {
        let read = log.read(id).await?;
        log.write(id, &read, &read.attempts.released()).await
    };
    match tokio::time::timeout(deadline, note).await {
        Ok(Ok(())) => {
            tracing::debug!("release recorded in the attempt record");
            true
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not record the release in the attempt record; the crash-loop guard counts this delivery as one without an outcome");
            false
        }
        Err(_) => {
            tracing::warn!(
                ?deadline,
                "recording the release in the attempt record timed out; the crash-loop guard \
                 counts this delivery as one without an outcome"
            );
            false
        }
    }
}

/// One delivery's note: a watch that writes it when the wind-down begins,
/// unless the delivery is settled first.
#[derive(Debug)]
pub(super) struct ReleaseNote {
    claim: Arc<AtomicU8>,
    /// Cancelled when settling claims the note, so the watch ends at once.
    settling: CancellationToken,
    /// The watch; `Some` until its outcome was awaited.
    watch: Option<JoinHandle<bool>>,
}

impl ReleaseNote {
    /// Starts watching `wind_down` for the delivery of `id`.
    pub(super) fn watch(
        log: AttemptLog,
        id: MessageId,
        wind_down: CancellationToken,
        deadline: Duration,
    ) -> Self {
        let claim = Arc::new(AtomicU8::new(OPEN));
        let settling = CancellationToken::new();
        let task = {
            let (claim, settling) = (Arc::clone(&claim), settling.clone());
            async move {
                tokio::select! {
                    biased;
                    () = settling.cancelled() => return false,
                    () = wind_down.cancelled() => {}
                }
                if claim
                    .compare_exchange(OPEN, WRITING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    return false;
                }
                write_note(&log, &id, deadline).await
            }
        };
        ReleaseNote {
            claim,
            settling,
            watch: Some(tokio::spawn(task.in_current_span())),
        }
    }

    /// Called as settling begins, before it looks at the drain stage:
    /// whether the note was started (then settling must not record another
    /// outcome, and awaits it with [`ReleaseNote::written`]). If it was
    /// not, it never will be.
    pub(super) fn close(&self) -> bool {
        self.settling.cancel();
        match self
            .claim
            .compare_exchange(OPEN, CLOSED, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => false,
            Err(state) => state == WRITING,
        }
    }

    /// Whether the note was recorded: closes the note (see
    /// [`ReleaseNote::close`]) and waits for one being written (it is
    /// bounded by its deadline); false if none was started. Once only:
    /// later calls say false.
    pub(super) async fn written(&mut self) -> bool {
        if !self.close() {
            return false;
        }
        match self.watch.take() {
            Some(watch) => watch.await.unwrap_or(false),
            None => false,
        }
    }
}

impl Drop for ReleaseNote {
    /// A delivery that ends without settling (or without awaiting its
    /// note) stops the watch; a note being written finishes on its own.
    fn drop(&mut self) {
        self.settling.cancel();
    }
}

/// Gives `note` the time until the release stage, then runs `release`
/// beside what is left of it: a note never holds a release past the
/// release stage (at that stage not at all). Returns whether the note was
/// recorded, and the release's outcome.
pub(super) async fn release_after_note<T>(
    note: impl Future<Output = bool>,
    release_stage: &CancellationToken,
    release: impl Future<Output = T>,
) -> (bool, T) {
    let mut note = pin!(maybe_done(note));
    tokio::select! {
        biased;
        () = &mut note => {}
        () = release_stage.cancelled() => {}
    }
    let ((), released) = tokio::join!(&mut note, release);
    (note.as_mut().take_output().unwrap_or(false), released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_worker_storage::memory::InMemoryCheckpointStore;
    use tokio::time::Instant;

    fn log() -> AttemptLog {
        AttemptLog::new(Arc::new(InMemoryCheckpointStore::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_note_is_written_once_the_wind_down_begins_and_counts_one_release() {
        let (log, id) = (log(), MessageId::new("m-1"));
        let wind_down = CancellationToken::new();
        let mut note =
            ReleaseNote::watch(log.clone(), id.clone(), wind_down.clone(), NOTE_DEADLINE);
        tokio::task::yield_now().await;
        assert_eq!(log.read(&id).await.unwrap().attempts.releases, 0);
        wind_down.cancel();
        tokio::task::yield_now().await;
        assert!(note.close(), "started by the wind-down");
        assert!(note.written().await);
        assert!(!note.written().await, "awaited once");
        assert_eq!(log.read(&id).await.unwrap().attempts.releases, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_note_closed_by_settling_first_is_never_written() {
        let (log, id) = (log(), MessageId::new("m-1"));
        let wind_down = CancellationToken::new();
        let mut note =
            ReleaseNote::watch(log.clone(), id.clone(), wind_down.clone(), NOTE_DEADLINE);
        assert!(!note.close());
        wind_down.cancel();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!note.written().await);
        assert_eq!(log.read(&id).await.unwrap().attempts.releases, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn notes_add_up_across_deliveries() {
        let (log, id) = (log(), MessageId::new("m-1"));
        for _ in 0..3 {
            assert!(write_note(&log, &id, NOTE_DEADLINE).await);
        }
        let read = log.read(&id).await.unwrap();
        assert_eq!(
            (read.attempts.releases, read.attempts.unexplained(4)),
            (3, 1)
        );
    }

    /// (note takes, release stage begun, release happens after, note
    /// recorded): the release waits for the note only until the release
    /// stage.
    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_its_note_only_until_the_release_stage() {
        let secs = Duration::from_secs;
        let rows = [
            (secs(0), false, secs(0), true),
            (secs(1), false, secs(1), true),
            // The release stage comes at 3 s: released then, the note
            // finishing beside it.
            (secs(10), false, secs(3), true),
            (secs(10), true, secs(0), true),
            (secs(0), true, secs(0), true),
        ];
        for (note_takes, begun, expected_after, expected_noted) in rows {
            let stage = CancellationToken::new();
            if begun {
                stage.cancel();
            }
            let stage_later = {
                let stage = stage.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(secs(3)).await;
                    stage.cancel();
                })
            };
            let start = Instant::now();
            let released_at = Arc::new(std::sync::Mutex::new(None));
            let note = async move {
                tokio::time::sleep(note_takes).await;
                true
            };
            let release = {
                let released_at = Arc::clone(&released_at);
                async move {
                    *released_at.lock().unwrap() = Some(start.elapsed());
                }
            };
            let (noted, ()) = release_after_note(note, &stage, release).await;
            stage_later.abort();
            assert_eq!(
                (*released_at.lock().unwrap(), noted),
                (Some(expected_after), expected_noted),
                "note takes {note_takes:?}, release stage begun: {begun}"
            );
        }
    }
}
