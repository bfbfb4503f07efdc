//! [`JobCheckpoint`]: one job's handle on its checkpoint, which carries the
//! ETag from read to write (a worker that lost its message cannot overwrite
//! newer progress) and stamps each write so a lost answer is recognised.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use spot_worker_decisions::cadence::CheckpointCadence;
use spot_worker_decisions::goodput::{Ledger, split_stamp, stamp_with_progress};
use tokio_util::sync::CancellationToken;

use crate::error::StorageError;

use super::*;

/// One job's checkpoint: what was read on delivery, and the ETag that fences
/// every later write.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use serde_json::json;
/// use spot_worker_storage::{InMemoryCheckpointStore, JobCheckpoint, StorageError};
///
/// let store = Arc::new(InMemoryCheckpointStore::new());
/// let mut mine = JobCheckpoint::load(store.clone(), "job-1").await?;
/// let mut stale = JobCheckpoint::load(store.clone(), "job-1").await?;
/// mine.save_progress(json!({"row": 10})).await?;
/// // A worker holding an older view cannot overwrite newer progress.
/// let err = stale.save_progress(json!({"row": 5})).await.unwrap_err();
/// assert!(matches!(err, StorageError::Conflict { .. }));
/// // Resuming reads the latest progress.
/// let resumed = JobCheckpoint::load(store, "job-1").await?;
/// assert_eq!(resumed.progress(), Some(&json!({"row": 10})));
/// # Ok::<(), StorageError>(())
/// # }).unwrap();
/// ```
pub struct JobCheckpoint {
    pub(super) store: Arc<dyn CheckpointStore>,
    pub(super) key: String,
    pub(super) latest: Option<(Checkpoint, ETag)>,
    pub(super) cancelled: Option<CancellationToken>,
    /// Where a lost write or an unreachable store is noted for whoever runs
    /// the job (see [`JobCheckpoint::noting_in`]).
    pub(super) notes: Option<Arc<CheckpointNotes>>,
    /// Where the delivery running the job learns what this handle left in
    /// the store under the job's own key (see [`JobCheckpoint::leaving_in`]).
    pub(super) leftover: Option<Arc<Leftover>>,
    /// The delivery's clock, which times this handle's saves and whose
    /// ledger each of them stamps (see [`spot_worker_decisions::goodput`]).
    pub(super) clock: Option<Arc<SaveClock>>,
    /// Random per handle: only this handle's writes carry it, so a stored
    /// stamp with it proves the stored checkpoint is this handle's.
    pub(super) writer: String,
    /// How many writes this handle attempted; the stamp of the next is one
    /// more.
    pub(super) writes: u64,
    /// Requests this handle sent to the store (writes and the reads after
    /// a conflict), for the cost of a save.
    pub(super) requests: u64,
    /// The interval this handle's saves follow, and where their cost is
    /// measured (see [`JobCheckpoint::is_due`]).
    pub(super) cadence: Arc<CheckpointCadence>,
    /// When progress was last saved, or the handle made.
    pub(super) last_saved: tokio::time::Instant,
    /// The job's checkpoint files (see [`JobCheckpoint::save_files`]).
    pub(super) files: FilesState,
}

impl fmt::Debug for JobCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobCheckpoint")
            .field("key", &self.key)
            .field("latest", &self.latest)
            .field("writer", &self.writer)
            .field("writes", &self.writes)
            .field("last_saved", &self.last_saved)
            .finish_non_exhaustive()
    }
}

/// What a stored stamp says about a write of this handle's.
pub(super) enum StampMatch {
    /// Exactly this write: it landed.
    ThisWrite,
    /// An earlier, unacknowledged write of this handle (it failed, for
    /// example timed out, after it landed): nobody wrote since.
    EarlierWrite,
    /// Another writer's, or unstamped: the conflict is real.
    Other,
}

impl JobCheckpoint {
    /// Reads the latest checkpoint for `key`.
    pub async fn load(
        store: Arc<dyn CheckpointStore>,
        key: impl Into<String>,
    ) -> Result<Self, StorageError> {
        let key = key.into();
        let latest = store.read(&key).await?;
        Ok(Self::from_read(store, key, latest))
    }

    /// A handle on what an earlier [`CheckpointStore::read`] of `key`
    /// returned, without reading again: the consumer hands its
    /// completed-checkpoint read to the handler this way. Fencing is the
    /// same as after [`JobCheckpoint::load`]: the first write is conditioned
    /// on that read's ETag (or on there being no checkpoint), so anything
    /// written since makes it fail with [`StorageError::Conflict`].
    pub fn from_read(
        store: Arc<dyn CheckpointStore>,
        key: String,
        latest: Option<StoredCheckpoint>,
    ) -> Self {
        JobCheckpoint {
            store,
            key,
            latest: latest.map(|stored| (stored.checkpoint, stored.etag)),
            cancelled: None,
            notes: None,
            leftover: None,
            clock: None,
            writer: uuid::Uuid::new_v4().simple().to_string(),
            writes: 0,
            requests: 0,
            cadence: Arc::new(CheckpointCadence::new(IntervalSource::Adaptive {
                seed_evictions_per_hour: DEFAULT_SEED_EVICTIONS_PER_HOUR,
            })),
            last_saved: tokio::time::Instant::now(),
            files: FilesState::default(),
        }
    }

    /// Follows `cadence` (the worker's, shared by its deliveries; the
    /// consumer passes it): [`JobCheckpoint::is_due`] asks it, and every
    /// save's cost is recorded in it. A handle without one measures and
    /// decides alone, from the default seed rate.
    pub fn following(mut self, cadence: Arc<CheckpointCadence>) -> Self {
        self.cadence = cadence;
        self
    }

    /// The cadence this handle follows.
    pub fn cadence(&self) -> &Arc<CheckpointCadence> {
        &self.cadence
    }

    /// Whether a checkpoint is due: the checkpoint interval (the user's
    /// explicit one, or the adaptive one of docs/checkpoint-interval.md)
    /// has passed since this handle last saved, or since it was made. A
    /// handler that asks this after each unit of work and saves when it
    /// says so saves exactly as often as the interruptions that lose work
    /// make worthwhile; on cancellation it saves regardless.
    ///
    /// A handle on the job's own key ([`Job::checkpoint`](crate::Job::checkpoint))
    /// also knows how much work the job has done, across its deliveries;
    /// once the fleet has finished enough jobs longer than that, the
    /// interval is spread over the rest they say it has left
    /// ([`CheckpointCadence::is_due_in_job`]; "Jobs that end" in
    /// docs/checkpoint-interval.md), so no save falls just before the
    /// typical job's end.
    pub fn is_due(&self) -> bool {
        let since = self.last_saved.elapsed();
        match self.job_work() {
            Some(done) => self.cadence.is_due_in_job(since, done),
            None => self.cadence.is_due(since),
        }
    }

    /// The work the job is expected to have left, from the lengths of the
    /// jobs the fleet finished and the work this job has done so far
    /// ([`CheckpointCadence::expected_left`]); `None` for a handle not on
    /// the job's own key, with an explicit interval, or while the fleet
    /// cannot say.
    pub fn expected_left(&self) -> Option<std::time::Duration> {
        self.cadence.expected_left(self.job_work()?)
    }

    /// The job's work so far, all its deliveries', for a handle timed by
    /// its delivery's clock.
    pub(super) fn job_work(&self) -> Option<std::time::Duration> {
        self.clock.as_ref().map(|clock| clock.job_work())
    }

    /// [`JobCheckpoint::is_due`] for a handler that knows it has about
    /// `left` of work to go: the interval is spread evenly over the rest
    /// of the job, so no save falls just before its end, where it protects
    /// little ([`CheckpointCadence::is_due_before_end`]; "Jobs that end" in
    /// docs/checkpoint-interval.md). An explicit interval is kept as it is.
    pub fn is_due_before_end(&self, left: std::time::Duration) -> bool {
        self.cadence
            .is_due_before_end(self.last_saved.elapsed(), left)
    }

    /// How long ago this handle last saved, or was made: the clock
    /// [`JobCheckpoint::is_due`] goes by, for a caller that plans when to
    /// ask again.
    pub fn since_last_save(&self) -> std::time::Duration {
        self.last_saved.elapsed()
    }

    /// Refuses every write once `token` is cancelled (the consumer passes the
    /// job's token, cancelled when its lease is lost or on shutdown).
    pub fn fenced_by(mut self, token: CancellationToken) -> Self {
        self.cancelled = Some(token);
        self
    }

    /// Notes in `notes` a write that fails because another writer got in
    /// first or because the store cannot be reached, so whoever runs the
    /// job learns why it stopped even if the error is swallowed or wrapped
    /// on its way out of the handler; and a write that succeeds, which
    /// resolves a conflict noted on its key before.
    pub fn noting_in(mut self, notes: Arc<CheckpointNotes>) -> Self {
        self.notes = Some(notes);
        self
    }

    /// Tells `leftover` what this handle has seen and writes, so that the
    /// consumer can remove a checkpoint nobody can use once the job has
    /// succeeded, and knows when there is none to remove.
    pub fn leaving_in(mut self, leftover: Arc<Leftover>) -> Self {
        leftover.saw(self.latest());
        self.leftover = Some(leftover);
        self
    }

    /// Times this handle's saves on the delivery's `clock`, and stamps each
    /// with the job's goodput ledger as of the save.
    pub fn timed_by(mut self, clock: Arc<SaveClock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The checkpoint key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The latest checkpoint known to this handle.
    pub fn latest(&self) -> Option<&Checkpoint> {
        self.latest.as_ref().map(|(checkpoint, _)| checkpoint)
    }

    /// The ETag of [`JobCheckpoint::latest`].
    pub fn etag(&self) -> Option<&ETag> {
        self.latest.as_ref().map(|(_, etag)| etag)
    }

    /// The saved progress, if the job is in progress.
    pub fn progress(&self) -> Option<&Value> {
        match self.latest() {
            Some(Checkpoint::InProgress { progress }) => Some(progress),
            _ => None,
        }
    }

    /// The saved result, if the job completed.
    pub fn result(&self) -> Option<&Value> {
        match self.latest() {
            Some(Checkpoint::Completed { result }) => Some(result),
            _ => None,
        }
    }

    /// True once a completed checkpoint was saved or read.
    pub fn is_completed(&self) -> bool {
        self.latest().is_some_and(Checkpoint::is_completed)
    }

    /// The job's result as the store holds it now, if the job is completed
    /// there (by this handle or by another run of the job): a fresh read
    /// that leaves this handle as it is. A second run of a job that finds
    /// its result slot taken asks this to tell "another run finished the
    /// job" from "someone else's result is in the way".
    pub async fn completed_in_store(&self) -> Result<Option<Value>, StorageError> {
        Ok(match self.store.read(&self.key).await? {
            Some(StoredCheckpoint {
                checkpoint: Checkpoint::Completed { result },
                ..
            }) => Some(result),
            _ => None,
        })
    }

    /// Saves progress (see [`JobCheckpoint::save`]).
    pub async fn save_progress(&mut self, progress: Value) -> Result<(), StorageError> {
        self.save(Checkpoint::InProgress { progress }).await
    }

    /// Saves the final result (see [`JobCheckpoint::save`]). The chunks of
    /// the job's checkpoint files are then deleted, beside: a completed
    /// job resumes nothing.
    pub async fn complete(&mut self, result: Value) -> Result<(), StorageError> {
        self.save(Checkpoint::Completed { result }).await?;
        self.remove_files();
        Ok(())
    }

    /// Writes `checkpoint`, fenced by the ETag this handle last saw.
    ///
    /// Every write is stamped with this handle's random writer id and its
    /// sequence number (see [`CheckpointStore::write`]). On a conflict,
    /// the stored stamp decides:
    ///
    /// - this very write: an attempt whose response was lost landed (the
    ///   SDK's retry then met its own new ETag); it succeeded.
    /// - an earlier write of this handle whose call failed after it landed:
    ///   nobody has written since, so this write is retried once on top of it.
    /// - anything else (another handle's stamp, or none) is
    ///   [`StorageError::Conflict`], even if the stored checkpoint equals
    ///   `checkpoint`: a worker that lost its message must not adopt the new
    ///   owner's ETag. The job should stop.
    pub async fn save(&mut self, checkpoint: Checkpoint) -> Result<(), StorageError> {
        self.save_blocking(checkpoint, Blocking::CALL).await
    }

    /// [`JobCheckpoint::save`], for a save that blocks its job as
    /// `blocking` says rather than for its whole call: a program's
    /// checkpoint file, which the program took `written_before` to write
    /// and whose upload runs beside it (`spot-worker run`). That time is
    /// the save's cost for the checkpoint interval and its checkpointing
    /// time in the job's goodput ledger.
    pub async fn save_blocking(
        &mut self,
        checkpoint: Checkpoint,
        blocking: Blocking,
    ) -> Result<(), StorageError> {
        self.save_measured(checkpoint, blocking, (0, 0), None).await
    }

    /// [`JobCheckpoint::save_blocking`] of data written before the call,
    /// at `written_at` on this machine's monotonic clock: a program's
    /// checkpoint file, whose version's modification time the runner maps
    /// onto it. The save keeps the job's work up to then, not up to the
    /// call: in the job's goodput ledger the work after it is redone if
    /// this delivery ends without finishing the job, however late the
    /// version is uploaded; and a drain whose last save holds data written
    /// before the notice saved nothing at it (docs/goodput.md).
    pub async fn save_written(
        &mut self,
        checkpoint: Checkpoint,
        blocking: Blocking,
        written_at: tokio::time::Instant,
    ) -> Result<(), StorageError> {
        self.save_measured(checkpoint, blocking, (0, 0), Some(written_at))
            .await
    }

    /// The one measured save: `sent` (requests, bytes) went out before
    /// this write (the chunks of its files), and `written_at`, if known,
    /// is when its data was written (else the call).
    pub(super) async fn save_measured(
        &mut self,
        checkpoint: Checkpoint,
        blocking: Blocking,
        sent: (u64, u64),
        written_at: Option<tokio::time::Instant>,
    ) -> Result<(), StorageError> {
        let bytes = checkpoint
            .to_json_bytes()
            .map_or(0, |bytes| bytes.len() as u64)
            .saturating_add(sent.1);
        // The one measurement of this save, from here to the return,
        // retries and conflict reads included.
        let measurement = SaveMeasurement::start(
            blocking,
            self.clock.as_ref(),
            self.requests,
            bytes,
            written_at,
        );
        self.requests = self.requests.saturating_add(sent.0);
        let saved = self
            .save_fenced(checkpoint, measurement.ledger(), measurement.progress())
            .await;
        let ended = measurement.finish(self.requests, saved.is_ok(), &self.cadence);
        if saved.is_ok() {
            self.last_saved = ended;
        }
        if let Some(notes) = &self.notes {
            match &saved {
                Ok(()) => notes.note_written(&self.key),
                Err(error) => notes.note(error),
            }
        }
        saved
    }

    pub(super) async fn save_fenced(
        &mut self,
        checkpoint: Checkpoint,
        ledger: Option<Ledger>,
        progress: Option<f64>,
    ) -> Result<(), StorageError> {
        // One retry at most: after an earlier write of ours is adopted, a
        // second conflict can only be another writer's.
        for _ in 0..2 {
            if self
                .cancelled
                .as_ref()
                .is_some_and(CancellationToken::is_cancelled)
            {
                return Err(StorageError::JobCancelled {
                    key: self.key.clone(),
                });
            }
            let precondition = match self.etag() {
                Some(etag) => WritePrecondition::IfMatch(etag.clone()),
                None => WritePrecondition::Create,
            };
            self.writes += 1;
            self.requests += 1;
            let stamp = match &ledger {
                Some(ledger) => stamp_with_progress(&self.stamp(self.writes), ledger, progress),
                None => self.stamp(self.writes),
            };
            if let Some(leftover) = &self.leftover {
                leftover.writing();
            }
            let conflict = match self
                .store
                .write(&self.key, &checkpoint, precondition, Some(&stamp))
                .await
            {
                Ok(etag) => {
                    if let Some(leftover) = &self.leftover {
                        leftover.wrote(&checkpoint);
                    }
                    self.latest = Some((checkpoint, etag));
                    return Ok(());
                }
                Err(StorageError::Conflict { key }) => key,
                Err(other) => return Err(other),
            };
            self.requests += 1;
            let Some(StoredCheckpoint {
                checkpoint: stored,
                etag,
                stamp: stored_stamp,
            }) = self.store.read(&self.key).await?
            else {
                if let Some(leftover) = &self.leftover {
                    leftover.saw(None);
                }
                return Err(StorageError::Conflict { key: conflict });
            };
            if let Some(leftover) = &self.leftover {
                leftover.wrote(&stored);
            }
            match self.classify(stored_stamp.as_deref()) {
                StampMatch::ThisWrite if stored == checkpoint => {
                    self.latest = Some((stored, etag));
                    return Ok(());
                }
                StampMatch::EarlierWrite => self.latest = Some((stored, etag)),
                StampMatch::ThisWrite | StampMatch::Other => {
                    return Err(StorageError::Conflict { key: conflict });
                }
            }
        }
        Err(StorageError::Conflict {
            key: self.key.clone(),
        })
    }

    pub(super) fn stamp(&self, sequence: u64) -> String {
        format!("{}:{sequence}", self.writer)
    }

    pub(super) fn classify(&self, stored: Option<&str>) -> StampMatch {
        // The ledger a stamp may carry says nothing about who wrote it.
        let own = stored.map(|stamp| split_stamp(stamp).0);
        let Some((writer, sequence)) = own.and_then(|stamp| stamp.split_once(':')) else {
            return StampMatch::Other;
        };
        match sequence.parse::<u64>() {
            Ok(n) if writer == self.writer && n == self.writes => StampMatch::ThisWrite,
            Ok(n) if writer == self.writer && n < self.writes => StampMatch::EarlierWrite,
            _ => StampMatch::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::memory::InMemoryCheckpointStore;

    fn progress(n: u64) -> Checkpoint {
        Checkpoint::InProgress {
            progress: json!({"rows": n}),
        }
    }

    /// Performs each write, then fails the call with the next planned error:
    /// a write that landed although its caller saw a failure (a lost
    /// response, which the SDK's retry turns into 412 Precondition Failed).
    /// With `keeps_stamps: false` it is a store that keeps no stamps.
    struct LandsThenFails {
        inner: InMemoryCheckpointStore,
        planned: Mutex<Vec<StorageError>>,
        keeps_stamps: bool,
    }

    impl LandsThenFails {
        fn new(keeps_stamps: bool, planned: Vec<StorageError>) -> Arc<Self> {
            Arc::new(LandsThenFails {
                inner: InMemoryCheckpointStore::new(),
                planned: Mutex::new(planned),
                keeps_stamps,
            })
        }

        fn planned_failure(&self) -> Result<(), StorageError> {
            match self.planned.lock().unwrap().pop() {
                Some(error) => Err(error),
                None => Ok(()),
            }
        }
    }

    #[async_trait]
    impl CheckpointStore for LandsThenFails {
        async fn prepare(&self) -> Result<(), StorageError> {
            Ok(())
        }
        async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
            let stored = self.inner.read(key).await?;
            Ok(if self.keeps_stamps {
                stored
            } else {
                stored.map(|stored| StoredCheckpoint {
                    stamp: None,
                    ..stored
                })
            })
        }
        async fn delete(&self, key: &str) -> Result<(), StorageError> {
            self.inner.delete(key).await
        }

        async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
            self.inner.list(prefix).await
        }
        async fn write(
            &self,
            key: &str,
            checkpoint: &Checkpoint,
            precondition: WritePrecondition,
            stamp: Option<&str>,
        ) -> Result<ETag, StorageError> {
            let stamp = stamp.filter(|_| self.keeps_stamps);
            let etag = self
                .inner
                .write(key, checkpoint, precondition, stamp)
                .await?;
            self.planned_failure().map(|()| etag)
        }
    }

    fn conflict() -> StorageError {
        StorageError::Conflict { key: "job".into() }
    }

    #[tokio::test]
    async fn a_write_whose_response_was_lost_is_recognised_as_this_handles() {
        let store = LandsThenFails::new(true, vec![conflict(), conflict()]);
        let mut job = JobCheckpoint::load(store.clone(), "job").await.unwrap();
        // Create, then update: each lands, then the call reports a conflict.
        job.save(progress(1)).await.unwrap();
        job.save(progress(2)).await.unwrap();
        let StoredCheckpoint {
            checkpoint: stored,
            etag,
            stamp,
        } = store.read("job").await.unwrap().unwrap();
        assert_eq!(stored, progress(2));
        assert_eq!(
            job.etag(),
            Some(&etag),
            "the handle carries the stored ETag"
        );
        assert!(stamp.is_some_and(|s| s.ends_with(":2")));
        job.save(progress(3)).await.unwrap();
        assert_eq!(store.inner.get("job"), Some(progress(3)));
    }

    #[tokio::test]
    async fn a_failed_write_that_landed_is_built_upon_by_the_next_save() {
        let unavailable = StorageError::Unavailable {
            message: "timed out".into(),
        };
        let store = LandsThenFails::new(true, vec![unavailable]);
        let mut job = JobCheckpoint::load(store.clone(), "job").await.unwrap();
        assert!(job.save(progress(1)).await.unwrap_err().is_transient());
        // The handle still expects no checkpoint; the stored one is its own.
        job.save(progress(2)).await.unwrap();
        assert_eq!(store.inner.get("job"), Some(progress(2)));
    }

    #[tokio::test]
    async fn without_stamps_no_conflict_is_taken_for_ones_own() {
        let store = LandsThenFails::new(false, vec![conflict()]);
        let mut job = JobCheckpoint::load(store.clone(), "job").await.unwrap();
        assert_eq!(job.save(progress(1)).await.unwrap_err(), conflict());
    }

    #[tokio::test]
    async fn another_handles_stamp_after_ours_is_a_conflict() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let mut mine = JobCheckpoint::load(store.clone(), "job").await.unwrap();
        mine.save(progress(1)).await.unwrap();
        let mut theirs = JobCheckpoint::load(store.clone(), "job").await.unwrap();
        theirs.save(progress(2)).await.unwrap();
        assert_eq!(mine.save(progress(2)).await.unwrap_err(), conflict());
        let cancelled = CancellationToken::new();
        let mut fenced = JobCheckpoint::load(store.clone(), "job")
            .await
            .unwrap()
            .fenced_by(cancelled.clone());
        cancelled.cancel();
        assert!(matches!(
            fenced.save(progress(3)).await,
            Err(StorageError::JobCancelled { .. })
        ));
        assert_eq!(store.get("job"), Some(progress(2)));
    }

    #[test]
    fn stamped_documents_round_trip_and_plain_readers_ignore_the_stamp() {
        let checkpoint = Checkpoint::Completed {
            result: json!({"written_by": "the result may use the name too"}),
        };
        let bytes = checkpoint.to_json_bytes_stamped("w:7").unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""written_by":"w:7""#), "{text}");
        assert_eq!(
            Checkpoint::from_json_bytes_stamped(&bytes, "doc").unwrap(),
            (checkpoint.clone(), Some("w:7".to_owned()))
        );
        assert_eq!(
            Checkpoint::from_json_bytes(&bytes, "doc").unwrap(),
            checkpoint
        );
        // Unstamped documents (older writers) and odd stamps prove nothing.
        let plain = checkpoint.to_json_bytes().unwrap();
        assert_eq!(
            Checkpoint::from_json_bytes_stamped(&plain, "doc").unwrap(),
            (checkpoint.clone(), None)
        );
        let odd = br#"{"status":"in_progress","progress":1,"written_by":7}"#;
        assert_eq!(
            Checkpoint::from_json_bytes_stamped(odd, "doc").unwrap(),
            (Checkpoint::InProgress { progress: json!(1) }, None)
        );
    }
}
