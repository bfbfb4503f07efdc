//! [`LaneKeeper`]: the jobs waiting in the Spot lane that have fallen
//! behind their line go to the regular lane. Any worker can run it; one at
//! a time does, the holder of a blob lease ([`KEEPER_LEASE`]), so two
//! keepers never pick over the same queue at once.
//!
//! Every `recheck` the holder:
//!
//! 1. **peeks** at the front of the Spot queue (up to 32 waiting messages;
//!    nothing is hidden or counted);
//! 2. asks the lane rule about each job with a deadline that has waited
//!    longer than the fleet's usual queue wait (d's queue-wait part: until
//!    then it is on its way to a Spot worker, not waiting for one), with its
//!    progress from its checkpoint;
//! 3. if any should be regular, **receives** the front of the queue (as far
//!    as the last of them), moves those (lane record, send, delete: see
//!    [`record`](super::record)) and puts every other message back at once,
//!    noting the look in its attempt record so the crash-loop guard does
//!    not count it.
//!
//! It puts back what it will not move first, at once; then, before each
//! move, renews its lease (every [`RENEW_EVERY`]: a pass stops where it
//! loses it, putting back the rest) and its hold on that message (one it
//! lost is left to whoever received it since). None of that is what keeps
//! a job from running twice, though: a hold can still run out in the
//! middle of a move. That is the lane record's fenced claim, which every
//! delivery writes before it runs and which stops a move by a mover
//! holding an earlier receive of the message (see
//! [`record`](super::record)).
//!
//! A keeper killed anywhere in this leaves every message it received to
//! reappear after its hold, and a move it began to be finished or
//! discarded by the next delivery: nothing is lost, nothing runs twice.
//! What it does not see: jobs deeper in the queue than the 32 at its front
//! (an Azure queue cannot be read further without receiving); they are
//! looked at once they reach it.

mod moving;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spot_worker_decisions::goodput::{split_stamp, stamp_progress};
use spot_worker_decisions::lanes::{Lane, Phase, Reason};
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use spot_worker_storage::CheckpointStore;
use spot_worker_storage::MessageEncoding;
use spot_worker_storage::StorageError;
use spot_worker_storage::attempts::AttemptLog;
use spot_worker_storage::{LeaseId, LeaseStore};
use spot_worker_storage::{MAX_RECEIVE_BATCH, MessageId, QueueMessage, VisibleMessage};

use super::mover::{MoveJob, Moved};
use super::record::{Arrival, LaneRecords, arrival};
use super::{Lanes, progress_of};
use spot_worker_envelope::{Carried, Envelope};

pub use spot_worker_storage::KEEPER_LEASE;

/// How long the keeper's lease lasts; renewed every [`RENEW_EVERY`].
const LEASE_FOR: Duration = Duration::from_secs(30);
const RENEW_EVERY: Duration = Duration::from_secs(10);

/// The job key a handler reads from a body, if it keys jobs by the body.
pub type JobKeyFn = Arc<dyn Fn(&[u8]) -> Option<String> + Send + Sync>;

/// What one pass saw and did, for logs, metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeeperPass {
    /// Waiting messages looked at.
    pub peeked: usize,
    /// Of those, jobs with a deadline.
    pub with_deadline: usize,
    /// Jobs with a deadline whose slack is below two switches and a
    /// recheck: they must run on regular capacity now to make it.
    pub at_risk: usize,
    /// Jobs moved to the regular lane.
    pub moved: Vec<String>,
    /// Old copies found and deleted.
    pub discarded: usize,
    /// Messages received and put back.
    pub put_back: usize,
    /// Candidates whose hold ran out before their move: left to whoever
    /// received them since.
    pub hold_lost: usize,
    /// The pass stopped early: the keeper's lease went to another worker,
    /// or could not be renewed.
    pub lease_lost: bool,
}

/// Tells the worker what each pass did (its metrics).
pub type KeeperObserver = Arc<dyn Fn(&KeeperPass) + Send + Sync>;

/// The lane keeper of one worker; see the module documentation.
pub struct LaneKeeper {
    lanes: Lanes,
    checkpoints: Arc<dyn CheckpointStore>,
    records: LaneRecords,
    attempts: AttemptLog,
    leases: Arc<dyn LeaseStore>,
    encoding: MessageEncoding,
    job_key: JobKeyFn,
    hold: Duration,
    observer: Option<KeeperObserver>,
    /// When this keeper first saw each waiting message that had been
    /// received before (its wait since it was put back is not known
    /// otherwise).
    first_seen: Mutex<HashMap<MessageId, Instant>>,
}

impl std::fmt::Debug for LaneKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneKeeper")
            .field("lanes", &self.lanes)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

/// A job waiting in the Spot lane that the rule sends to the regular one.
struct Candidate {
    id: MessageId,
    key: String,
}

impl LaneKeeper {
    /// A keeper of `lanes`, whose job records and checkpoints are in
    /// `checkpoints`, taking turns by the leases of `leases`. It reads
    /// keys from bodies with `job_key` (the handler's), messages with
    /// `encoding`, and holds what it receives for `hold` (a lease's length:
    /// a keeper that dies leaves them hidden that long).
    pub fn new(
        lanes: Lanes,
        checkpoints: Arc<dyn CheckpointStore>,
        leases: Arc<dyn LeaseStore>,
        encoding: MessageEncoding,
        job_key: JobKeyFn,
        hold: Duration,
    ) -> Self {
        LaneKeeper {
            lanes,
            records: LaneRecords::new(Arc::clone(&checkpoints)),
            attempts: AttemptLog::new(Arc::clone(&checkpoints)),
            checkpoints,
            leases,
            encoding,
            job_key,
            hold,
            observer: None,
            first_seen: Mutex::default(),
        }
    }

    /// Tells `observer` what every pass did.
    pub fn observed_by(mut self, observer: KeeperObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Takes part until `stop` is cancelled: holds the keeper's lease when
    /// it is free (renewing it), makes a pass every `recheck` while it
    /// holds it, and gives it up when stopped.
    pub async fn run(&self, stop: CancellationToken) {
        let mut lease: Option<LeaseId> = None;
        let mut next_pass = Instant::now();
        let tick = self.lanes.recheck.min(RENEW_EVERY);
        let mut first = true;
        loop {
            if !first {
                let stopped = tokio::select! {
                    () = stop.cancelled() => true,
                    () = tokio::time::sleep(tick) => false,
                };
                if stopped {
                    break;
                }
            }
            first = false;
            lease = self.hold_lease(lease).await;
            if lease.is_none() || Instant::now() < next_pass {
                continue;
            }
            next_pass = Instant::now() + self.lanes.recheck;
            let pass = tokio::select! {
                () = stop.cancelled() => break,
                pass = self.pass_holding(lease.as_ref()) => pass,
            };
            match pass {
                Ok(pass) => {
                    if pass.lease_lost {
                        tracing::info!(
                            "lane keeper: the lease was lost during a pass; the pass stopped there"
                        );
                        lease = None;
                    }
                    if !pass.moved.is_empty() || pass.discarded > 0 {
                        tracing::info!(moved = ?pass.moved, discarded = pass.discarded, at_risk = pass.at_risk, "lane keeper: jobs behind their line moved to the regular lane");
                    }
                    if let Some(observer) = &self.observer {
                        observer(&pass);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "lane keeper: the pass failed; trying again at the next")
                }
            }
        }
        if let Some(lease) = lease
            && let Err(error) = self.leases.release(KEEPER_LEASE, &lease).await
        {
            tracing::debug!(%error, "lane keeper: giving up the lease failed; it runs out by itself");
        }
    }

    /// Renews the lease held, or takes it if it is free: the lease held
    /// afterwards, if any.
    async fn hold_lease(&self, held: Option<LeaseId>) -> Option<LeaseId> {
        match held {
            Some(lease) => match self.leases.renew(KEEPER_LEASE, &lease).await {
                Ok(true) => Some(lease),
                Ok(false) => {
                    tracing::info!("lane keeper: the lease went to another worker");
                    None
                }
                Err(error) => {
                    tracing::warn!(%error, "lane keeper: renewing the lease failed");
                    None
                }
            },
            None => match self.leases.acquire(KEEPER_LEASE, LEASE_FOR).await {
                Ok(Some(lease)) => {
                    tracing::info!("lane keeper: this worker keeps the lanes now");
                    Some(lease)
                }
                Ok(None) => None,
                Err(error) => {
                    tracing::warn!(%error, "lane keeper: taking the lease failed");
                    None
                }
            },
        }
    }

    /// One pass over the front of the Spot queue (see the module
    /// documentation). Whoever calls it must hold the keeper's lease, or
    /// know that nobody else makes a pass now.
    pub async fn pass(&self) -> Result<KeeperPass, StorageError> {
        self.pass_holding(None).await
    }

    /// A pass by the holder of `lease` (renewed during the pass; the pass
    /// stops where it is lost), or by whoever knows nobody else makes one.
    async fn pass_holding(&self, lease: Option<&LeaseId>) -> Result<KeeperPass, StorageError> {
        let peeked = self.lanes.spot.peek(MAX_RECEIVE_BATCH).await?;
        let mut pass = KeeperPass {
            peeked: peeked.len(),
            ..KeeperPass::default()
        };
        self.forget_unseen(&peeked);
        self.note_unmet_demand(&peeked).await;
        let mut candidates = Vec::new();
        let mut reach = 0;
        for (index, message) in peeked.iter().enumerate() {
            let Some((envelope, body)) = self.open(&message.body) else {
                continue;
            };
            pass.with_deadline += 1;
            let key = self.key_of(&envelope, &body, &message.id);
            let progress = match self.progress(&envelope, &key, message).await {
                Ok(progress) => progress,
                Err(error) => {
                    tracing::warn!(%error, job = %key, "lane keeper: reading the job's checkpoint failed; looking again at the next pass");
                    continue;
                }
            };
            let choice = self
                .lanes
                .choose(envelope.deadline, progress, Lane::Spot, Phase::Waiting);
            let margin = self.lanes.switch_cost.d() * 2 + self.lanes.recheck;
            if choice
                .standing
                .is_some_and(|standing| standing.slack_secs() < margin.as_secs_f64())
            {
                pass.at_risk += 1;
            }
            // The safety net does not wait: the job has no slack to spend.
            let urgent = choice.reason == Reason::SafetyNet;
            if choice.lane == Lane::Regular && (urgent || self.waited_long_enough(message)) {
                tracing::debug!(job = %key, reason = choice.reason.as_str(), "lane keeper: behind its line while waiting for Spot");
                candidates.push(Candidate {
                    id: message.id.clone(),
                    key,
                });
                reach = index + 1;
            }
        }
        if candidates.is_empty() {
            return Ok(pass);
        }
        let wanted = u8::try_from(reach).unwrap_or(MAX_RECEIVE_BATCH);
        let received = self.lanes.spot.receive(wanted, self.hold).await?;
        let (mine, others): (Vec<_>, Vec<_>) = received
            .into_iter()
            .partition(|message| candidates.iter().any(|c| c.id == message.id));
        // What it will not move goes back at once, not after the moves.
        let put_back =
            futures_util::future::join_all(others.iter().map(|m| self.put_back(m))).await;
        pass.put_back += put_back.into_iter().filter(|&back| back).count();
        let mut renewed_at = Instant::now();
        for (index, message) in mine.iter().enumerate() {
            if let Some(lease) = lease
                && renewed_at.elapsed() >= RENEW_EVERY
            {
                if self.hold_lease(Some(lease.clone())).await.is_none() {
                    pass.lease_lost = true;
                    for message in &mine[index..] {
                        self.give_back(message, &mut pass).await;
                    }
                    break;
                }
                renewed_at = Instant::now();
            }
            let Some(candidate) = candidates.iter().find(|c| c.id == message.id) else {
                continue;
            };
            // A fresh hold for the move's few calls; one that ran out is
            // another receive's now.
            let receipt = match self
                .lanes
                .spot
                .update_visibility(&message.id, &message.pop_receipt, self.hold)
                .await
            {
                Ok(receipt) => receipt,
                Err(error) => {
                    tracing::info!(%error, job = %candidate.key, "lane keeper: its hold on the job ran out before the move; leaving it");
                    pass.hold_lost += 1;
                    continue;
                }
            };
            let held = QueueMessage {
                pop_receipt: receipt,
                ..message.clone()
            };
            self.move_or_put_back(&held, candidate, &mut pass).await;
        }
        Ok(pass)
    }

    /// Notes Spot capacity as gone when a message at the front of the Spot
    /// queue has waited longer than the fleet's usual queue wait with no
    /// Spot worker heard from since it was sent: the Spot pool was asked
    /// for a VM and none came. (All Spot workers busy is not that: they
    /// are heard from.) A failure is logged.
    async fn note_unmet_demand(&self, peeked: &[VisibleMessage]) {
        let usual = self.lanes.switch_cost.estimate().queue_wait;
        let heard_at = self.lanes.spot_capacity.heard_at();
        let unmet = peeked
            .iter()
            .filter(|message| message.dequeue_count == 0)
            .filter_map(|message| message.inserted_at)
            .filter(|inserted| {
                let inserted = inserted.unix_timestamp_nanos() as f64 / 1e9;
                heard_at.is_none_or(|heard| heard < inserted)
            })
            .map(|inserted| inserted + usual)
            .filter(|since| *since <= OffsetDateTime::from(self.lanes.spot_capacity.now()))
            .min();
        let Some(since) = unmet else {
            return;
        };
        let since = std::time::SystemTime::from(since);
        let capacity = &self.lanes.spot_capacity;
        match capacity
            .fleet()
            .lost(None, since, capacity.fresh_for())
            .await
        {
            Ok(sightings) => self.lanes.spot_capacity.set(sightings),
            Err(error) => {
                tracing::warn!(%error, "lane keeper: could not note that no Spot worker came")
            }
        }
    }

    /// The envelope and body of a message text; `None` for a job without
    /// a deadline or one that does not decode (a worker poisons that).
    fn open(&self, text: &str) -> Option<(Envelope, Vec<u8>)> {
        let bytes = self.encoding.decode(text).ok()?;
        let (envelope, body) = Envelope::unwrap(&bytes).ok()?;
        Some((envelope?, body.to_vec()))
    }

    fn key_of(&self, envelope: &Envelope, body: &[u8], id: &MessageId) -> String {
        (self.job_key)(body)
            .or_else(|| envelope.key.clone())
            .unwrap_or_else(|| id.to_string())
    }

    /// The job's progress as of its last save: none for a message nobody
    /// received yet that no move made (no checkpoint can exist), else from
    /// its checkpoint's stamp.
    async fn progress(
        &self,
        envelope: &Envelope,
        key: &str,
        message: &VisibleMessage,
    ) -> Result<Duration, StorageError> {
        if message.dequeue_count == 0 && envelope.generation == 0 {
            return Ok(Duration::ZERO);
        }
        let stamp = self
            .checkpoints
            .read(key)
            .await?
            .and_then(|stored| stored.stamp);
        let fraction = stamp.as_deref().and_then(stamp_progress);
        let ledger = stamp.as_deref().and_then(|stamp| split_stamp(stamp).1);
        Ok(progress_of(&envelope.deadline, fraction, ledger.as_ref()))
    }

    /// Whether `message` has waited longer than the fleet's usual queue
    /// wait: since it was sent, if nobody received it yet; else since this
    /// keeper first saw it waiting.
    fn waited_long_enough(&self, message: &VisibleMessage) -> bool {
        let usual = self.lanes.switch_cost.estimate().queue_wait;
        if message.dequeue_count == 0
            && let Some(inserted) = message.inserted_at
        {
            let waited = OffsetDateTime::now_utc() - inserted;
            return waited.whole_milliseconds() >= usual.as_millis() as i128;
        }
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let since = *seen.entry(message.id.clone()).or_insert_with(Instant::now);
        since.elapsed() >= usual
    }

    /// Keeps first sightings of the messages still waiting only.
    fn forget_unseen(&self, peeked: &[VisibleMessage]) {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.retain(|id, _| peeked.iter().any(|m| &m.id == id));
    }
}
