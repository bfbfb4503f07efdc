//! The [`Job`] a handler receives: its message, its key, its checkpoint,
//! its cancellation and deadline, and where it reports progress.

use std::str::Utf8Error;
use std::sync::{Arc, Mutex};

use spot_worker_decisions::cadence::CheckpointCadence;
use spot_worker_decisions::lanes::{Deadline, Lane};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use spot_worker_storage::FencedResults;
use spot_worker_storage::MessageId;
use spot_worker_storage::ResultStore;
use spot_worker_storage::StorageError;
use spot_worker_storage::attempts::AttemptLog;
use spot_worker_storage::{
    CheckpointNotes, CheckpointStore, JobCheckpoint, SaveClock, StoredCheckpoint,
};

use spot_worker_storage::Leftover;

/// The consumer's read of the job's checkpoint, made before the handler
/// started (the completed check): the key and what the store returned, or
/// none on a first delivery keyed by the message id, where no checkpoint
/// can exist and the store is not asked. The
/// first [`Job::checkpoint_for`] of that key takes it instead of reading the
/// same blob again; later ones read afresh, since the first handle may have
/// written since.
#[derive(Debug, Default)]
pub(crate) struct EarlierRead(Mutex<Option<(String, CheckpointRead)>>);

/// What a checkpoint read returned: the checkpoint and its ETag, or none.
pub(crate) type CheckpointRead = Option<StoredCheckpoint>;

impl EarlierRead {
    pub(crate) fn new(key: String, latest: CheckpointRead) -> Self {
        EarlierRead(Mutex::new(Some((key, latest))))
    }

    /// What was read under `key`, once.
    fn take(&self, key: &str) -> Option<CheckpointRead> {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.as_ref().is_some_and(|(read_key, _)| read_key == key) {
            return slot.take().map(|(_, latest)| latest);
        }
        None
    }
}

/// One delivery of a message, as the handler sees it.
#[derive(Debug)]
pub struct Job {
    pub(crate) id: MessageId,
    pub(crate) key: String,
    pub(crate) dequeue_count: u32,
    /// Failures recorded for this message before this delivery, when the
    /// consumer knows them without a read (a first delivery, or a record
    /// read for the crash-loop guard).
    pub(crate) failures: Option<u32>,
    /// Where the message's attempt record is, for [`Job::failures`].
    pub(crate) attempts: AttemptLog,
    /// Failures the job's earlier messages recorded, before it moved
    /// between lanes.
    pub(crate) carried_failures: u32,
    pub(crate) inserted_at: Option<OffsetDateTime>,
    pub(crate) body: Vec<u8>,
    pub(crate) cancelled: CancellationToken,
    pub(crate) fence: CancellationToken,
    pub(crate) deadline: watch::Receiver<Option<Instant>>,
    pub(crate) checkpoints: Option<Arc<dyn CheckpointStore>>,
    /// What this delivery's checkpoint handles ran into (a write on the
    /// job's key lost to another holder of the job, an unreachable store):
    /// the consumer settles by it, whatever error the handler returned.
    pub(crate) notes: Arc<CheckpointNotes>,
    pub(crate) earlier_read: EarlierRead,
    /// What is left under [`Job::key`], for the consumer to clean up.
    pub(crate) leftover: Arc<Leftover>,
    /// The delivery's clock: saves on [`Job::key`] are timed on it.
    pub(crate) clock: Arc<SaveClock>,
    /// The worker's checkpoint interval, which this job's checkpoint
    /// handles follow.
    pub(crate) cadence: Arc<CheckpointCadence>,
    /// The job's deadline, if its message carries one.
    pub(crate) due: Option<Deadline>,
    /// The lane the consumer serves, if it serves one of two.
    pub(crate) lane: Option<Lane>,
}

impl Job {
    /// The message id.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The job's checkpoint key: [`MessageHandler::job_key`] of the body,
    /// or the message id.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many times the message has been received, this time included
    /// ([`QueueMessage::UNKNOWN_DEQUEUE_COUNT`](spot_worker_storage::QueueMessage::UNKNOWN_DEQUEUE_COUNT)
    /// if the queue did not say). Evictions raise it too: it is not a count
    /// of failures.
    pub fn dequeue_count(&self) -> u32 {
        self.dequeue_count
    }

    /// How many failures the consumer recorded for this job before this
    /// delivery (evictions and waits are not failures; a job moved between
    /// lanes counts those of its earlier messages); it is poisoned when
    /// failures reach `max_failures`. On a redelivery this reads the
    /// message's attempt record (one request) unless the consumer has read
    /// it already; a first delivery costs nothing.
    pub async fn failures(&self) -> Result<u32, StorageError> {
        let own = match self.failures {
            Some(failures) => failures,
            None => self.attempts.read(&self.id).await?.attempts.failures,
        };
        Ok(own.saturating_add(self.carried_failures))
    }

    /// When the message was first sent, if known.
    pub fn inserted_at(&self) -> Option<OffsetDateTime> {
        self.inserted_at
    }

    /// The decoded body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The decoded body as UTF-8 text.
    pub fn text(&self) -> Result<&str, Utf8Error> {
        std::str::from_utf8(&self.body)
    }

    /// Cancelled when the lease is lost or the worker winds down; long
    /// handlers watch it, save their progress and return an error (the
    /// message is then released at once for another worker, and the
    /// delivery does not count as a failure).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancelled
    }

    /// The instant by which a winding-down handler must have returned (after
    /// it, the handler is dropped and its message released); `None` while
    /// the worker is not shutting down or has no deadline.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.borrow()
    }

    /// `store` fenced by this delivery: its writes are refused with
    /// [`StorageError::JobCancelled`] once the message is released, the
    /// lease lost, or the delivery settled, so a handler abandoned at the
    /// release (blocking code that ignored cancellation) writes nothing
    /// after it. The way handlers should write their results.
    pub fn results(&self, store: Arc<dyn ResultStore>) -> FencedResults {
        FencedResults::new(store, self.key.clone(), self.fence.clone())
    }

    /// The job's deadline (when it started, when it is due, its work), if
    /// its producer gave it one (in its envelope, [`spot_worker_envelope`]).
    pub fn due(&self) -> Option<Deadline> {
        self.due
    }

    /// The lane this delivery runs in (Spot or regular capacity), for a
    /// worker that serves one of two lanes.
    pub fn lane(&self) -> Option<Lane> {
        self.lane
    }

    /// Tells the worker how much of its work the job has done: a share from
    /// 0 to 1 (values outside are clamped; not a number is ignored). The
    /// next checkpoint save on the job's key records it, and the lane rule
    /// of a job with a deadline reads it from there: where the job is let
    /// go, and when the lane keeper looks at it waiting. A job that never
    /// reports is measured by the useful time its saves kept. Without a
    /// deadline nothing is recorded.
    ///
    /// ```
    /// use spot_worker_consumer::{HandlerError, Job};
    ///
    /// async fn handle(job: Job, items: &[u64]) -> Result<(), HandlerError> {
    ///     let mut checkpoint = job.checkpoint().await?;
    ///     for (done, _item) in items.iter().enumerate() {
    ///         // ... one item of work ...
    ///         job.report_progress((done + 1) as f64 / items.len() as f64);
    ///         if checkpoint.is_due() {
    ///             checkpoint.save_progress(serde_json::json!({ "done": done + 1 })).await?;
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn report_progress(&self, done: f64) {
        self.clock.report_progress(done);
    }

    /// The share the program's progress file said as a save of its
    /// checkpoint begins (the command runner reads it then): that save
    /// stamps it before anything reported with [`Job::report_progress`],
    /// by the one progress rule
    /// ([`spot_worker_decisions::lanes::job_progress`]). Ignored unless
    /// finite; clamped to 0..=1.
    pub fn report_progress_file_at_save(&self, done: f64) {
        if done.is_finite() {
            self.clock.progress_file_at_save(done);
        }
    }

    /// The worker's checkpoint interval, which this job's checkpoint
    /// handles follow ([`JobCheckpoint::is_due`]); a handler that does not
    /// save through a [`JobCheckpoint`] can ask it directly.
    pub fn cadence(&self) -> &Arc<CheckpointCadence> {
        &self.cadence
    }

    /// Records this job's save trouble where `spot-worker status` reads it
    /// ([`SaveTrouble`]), or with `None` deletes the record (a good save, or
    /// the job's end). Not fenced by the lease as checkpoint writes are,
    /// but written only while the delivery holds the job (nothing once it
    /// is released or settled), and never counted as a note of the store's
    /// health: a record that cannot be written says nothing of the job.
    pub async fn record_save_trouble(
        &self,
        trouble: Option<&spot_worker_storage::SaveTrouble>,
    ) -> Result<(), StorageError> {
        if self.fence.is_cancelled() {
            return Ok(());
        }
        let store = self.checkpoints.clone().ok_or_else(|| {
            StorageError::InvalidArgument("the consumer has no checkpoint store".to_owned())
        })?;
        let key = spot_worker_storage::SaveTrouble::key(&self.key);
        let Some(trouble) = trouble else {
            return store.delete(&key).await;
        };
        let checkpoint = trouble
            .to_checkpoint()
            .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
        let precondition = match store.read(&key).await? {
            Some(stored) => spot_worker_storage::WritePrecondition::IfMatch(stored.etag),
            None => spot_worker_storage::WritePrecondition::Create,
        };
        store
            .write(&key, &checkpoint, precondition, None)
            .await
            .map(|_| ())
    }

    /// This job's checkpoint, under [`Job::key`].
    pub async fn checkpoint(&self) -> Result<JobCheckpoint, StorageError> {
        self.checkpoint_for(&self.key).await
    }

    /// A checkpoint under a key the handler chooses. The first handle on
    /// [`Job::key`] reuses the consumer's read from before the handler
    /// started, so a delivery reads its checkpoint once; its first write is
    /// conditioned on that read's ETag, so a write made in between by
    /// anyone else fails with a conflict. Any other handle reads the store.
    /// Its writes are refused once the lease is lost or the message
    /// released, but allowed while winding down. A write on the job's own
    /// key that loses to another writer fails with
    /// [`StorageError::Conflict`] and marks this delivery as fenced out
    /// until a later write on that key succeeds: if the handler then fails
    /// (not [`permanent`]ly), the consumer waits for the other holder of the
    /// job instead of counting a failure, whatever error it returns. A
    /// conflict on any other key, or one the handler resolved, explains
    /// nothing: its failure counts as usual. Likewise a read or write that fails because the store
    /// cannot be reached marks an outage: if the handler then fails, the
    /// message is tried again later, uncounted.
    pub async fn checkpoint_for(&self, key: &str) -> Result<JobCheckpoint, StorageError> {
        let store = self.checkpoints.clone().ok_or_else(|| {
            StorageError::InvalidArgument("the consumer has no checkpoint store".to_owned())
        })?;
        let checkpoint = match self.earlier_read.take(key) {
            Some(latest) => JobCheckpoint::from_read(store, key.to_owned(), latest),
            None => JobCheckpoint::load(store, key)
                .await
                .inspect_err(|error| self.notes.note(error))?,
        };
        let checkpoint = checkpoint
            .fenced_by(self.fence.clone())
            .noting_in(Arc::clone(&self.notes))
            .following(Arc::clone(&self.cadence));
        let checkpoint = if key == self.key {
            checkpoint.timed_by(Arc::clone(&self.clock))
        } else {
            checkpoint
        };
        Ok(if key == self.leftover.key() {
            checkpoint.leaving_in(Arc::clone(&self.leftover))
        } else {
            checkpoint
        })
    }
}
