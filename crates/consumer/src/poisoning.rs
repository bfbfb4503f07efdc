//! Moving a message to the poison queue, durably step by step: its
//! attempt record is marked first, so whichever step a fault or a stop
//! cuts short, the message's next delivery finishes the poisoning instead
//! of running the job again (see [`Consumer::poison`]).

use std::time::Duration;

use time::OffsetDateTime;

use spot_worker_storage::QueueMessage;

use super::Consumer;
use super::in_flight::Delivery;
use super::outcome::DeliveryOutcome;
use super::poison::{BodyBlob, MAX_LAST_ERROR_LEN, PoisonRecord, poison_body_blob_name};
use super::settlement::PoisonCause;
use super::stats::bump;
use spot_worker_storage::attempts::Poisoning;
use spot_worker_storage::shorten_keeping_ends;

impl Consumer {
    /// Moves the message to the poison queue, in an order a lost answer or
    /// a stop between any two steps cannot undo:
    ///
    /// 1. marks its attempt record poisoning (ETag-fenced), so a
    ///    redelivery finishes the move rather than run the job again (an
    ///    earlier delivery's mark is kept: that poisoning is finished);
    /// 2. marks the job's lane record poisoned (a tombstone: copies a move
    ///    left behind stay unrun, and nobody moves this message on); if
    ///    the record says this message is an old copy, the job lives on in
    ///    the newer one and this copy is deleted unrun instead;
    /// 3. sends the poison record (storing a big original as a blob first),
    ///    unless the mark says it was sent, and notes it sent;
    /// 4. deletes the original, then its attempt record.
    ///
    /// A step that fails leaves the original (kept out of the way for a
    /// while, never dropped); its next delivery resumes at the mark. The
    /// poison queue holds two records of one message only if the send's
    /// answer, or the note that it was sent, was lost: they share `queue`
    /// and `original_id`, by which the poison queue's reader tells them
    /// apart (see docs/deadlines.md).
    pub(super) async fn poison(&self, delivery: Delivery, cause: PoisonCause, failures: u32) {
        let mut last_error = cause.describe();
        let last_error_truncated = last_error.len() > MAX_LAST_ERROR_LEN;
        shorten_keeping_ends(&mut last_error, MAX_LAST_ERROR_LEN);
        let poisoning = Poisoning {
            last_error,
            last_error_truncated,
            failures,
            handler_failed: cause.is_handler_failure(),
            sent: false,
        };
        self.finish_poisoning(delivery, poisoning).await;
    }

    /// Carries out [`Consumer::poison`] from its durable mark: `poisoning`
    /// is this delivery's reason, used unless an earlier delivery marked
    /// the message already.
    pub(super) async fn finish_poisoning(&self, mut delivery: Delivery, poisoning: Poisoning) {
        if delivery.lease.is_lost() {
            return self.poison_later(delivery, false).await;
        }
        let Some(read) = self.try_read_attempts(&delivery).await else {
            return self.poison_later(delivery, false).await;
        };
        let id = &delivery.message.id;
        let (poisoning, marked) = match read.attempts.poisoning.clone() {
            Some(earlier) => (earlier, read),
            None => {
                let marked = read.attempts.poisoned(poisoning.clone());
                let written = self.settle_call(
                    "mark the message poisoned in its attempt record",
                    self.attempts.rewrite(id, &read, &marked),
                );
                match written.await {
                    Some(marked) => (poisoning, marked),
                    None => return self.poison_later(delivery, false).await,
                }
            }
        };
        // Before the record is sent: from here on no copy a move left
        // behind runs, and nobody moves this message on.
        match self.poison_lane(&delivery).await {
            Some(true) => {}
            Some(false) => return self.poisoned_copy(delivery).await,
            None => return self.poison_later(delivery, false).await,
        }
        if !poisoning.sent {
            if !self.send_to_poison(&delivery.message, &poisoning).await {
                return self.poison_later(delivery, false).await;
            }
            // Only spares a later delivery a second record if this one
            // stops short: a failure here is logged and nothing more.
            let sent = marked.attempts.poisoned(Poisoning {
                sent: true,
                ..poisoning.clone()
            });
            self.settle_call(
                "note the poison record sent in the attempt record",
                self.attempts.write(id, &marked, &sent),
            )
            .await;
        }
        delivery.stop_renewing().await;
        if delivery.lease.is_lost() {
            self.settled(DeliveryOutcome::LeaseLost);
            tracing::warn!(
                "lease lost while moving the message to the poison queue; another consumer finishes it"
            );
            return;
        }
        if self.delete(&delivery.lease).await {
            self.settled(DeliveryOutcome::Poisoned {
                handler_failed: poisoning.handler_failed,
            });
            // Quoted and escaped like the retry's `error`: a program's
            // stderr spans many lines, and one event must stay one line.
            tracing::warn!(
                poison_queue = self.poison.name(),
                last_error = poisoning.last_error.as_str(),
                "moved to the poison queue"
            );
            // The mark is written on every delivery, a first one too.
            delivery.note.written().await;
            self.settle_call(
                "delete the attempt record",
                self.attempts.forget(&delivery.message.id),
            )
            .await;
        }
    }

    /// Settles an old copy of a job that was to be poisoned: the job moved
    /// on (another copy claimed it and carries its failures), so nothing is
    /// sent; the copy is deleted unrun with its attempt record.
    async fn poisoned_copy(&self, mut delivery: Delivery) {
        delivery.stop_renewing().await;
        if self.settled_lease(&delivery) && self.delete(&delivery.lease).await {
            self.settled(DeliveryOutcome::Superseded);
            tracing::info!(
                "an old copy of the job was to be poisoned; the job lives on in its newer copy, deleted unrun"
            );
            delivery.note.written().await;
            self.settle_call(
                "delete the attempt record",
                self.attempts.forget(&delivery.message.id),
            )
            .await;
        }
    }

    /// Leaves a message whose poisoning stopped short (`sent`: its record
    /// is stored) for a later delivery to finish: kept out of the way on
    /// the retry schedule of its deliveries instead of retried at once, but
    /// never dropped. (Parked for the longest backoff, five minutes, a
    /// message poisoned during a short storage outage sat out of every
    /// consumer's reach long after the store was back.)
    async fn poison_later(&self, mut delivery: Delivery, sent: bool) {
        delivery.stop_renewing().await;
        if delivery.lease.is_lost() {
            self.settled(DeliveryOutcome::LeaseLost);
            tracing::warn!(
                copied = sent,
                "lease lost while moving the message to the poison queue; another consumer has it"
            );
            return;
        }
        let delay = self.backoff(delivery.message.dequeue_count);
        tracing::warn!(
            copied = sent,
            retry_in = ?delay,
            "moving the message to the poison queue stopped short; a later delivery finishes it"
        );
        self.make_visible_after(&delivery.lease, delay).await;
    }

    /// Sends the poison record for `message`; false if it was not sent.
    async fn send_to_poison(&self, message: &QueueMessage, poisoning: &Poisoning) -> bool {
        let mut record = PoisonRecord {
            queue: self.queue.name().to_owned(),
            original_id: message.id.to_string(),
            dequeue_count: message.dequeue_count,
            failures: poisoning.failures,
            inserted_at: message.inserted_at,
            poisoned_at: OffsetDateTime::now_utc(),
            last_error: poisoning.last_error.clone(),
            last_error_truncated: poisoning.last_error_truncated,
            encoding: self.config.encoding,
            body: Some(message.body.clone()),
            body_blob: None,
        };
        record.cap_last_error();
        let text = match record.to_message_text() {
            Ok(Some(text)) => text,
            Ok(None) => match self.claim_check(&mut record, message).await {
                Some(text) => text,
                None => return false,
            },
            Err(error) => {
                bump(&self.counters.settle_failures);
                tracing::error!(%error, "could not build the poison record");
                return false;
            }
        };
        self.settle_call(
            "send to poison queue",
            self.poison.send(&text, Duration::ZERO),
        )
        .await
        .is_some()
    }

    /// Stores the original text as a blob and points `record` at it; the
    /// record's message text, or `None` if that could not be done.
    async fn claim_check(
        &self,
        record: &mut PoisonRecord,
        message: &QueueMessage,
    ) -> Option<String> {
        let Some(store) = &self.poison_bodies else {
            bump(&self.counters.settle_failures);
            tracing::error!(
                len = message.body.len(),
                "the original does not fit into a poison record and the consumer has no store \
                 for poison bodies (Consumer::with_poison_bodies); keeping the message rather \
                 than losing its body"
            );
            return None;
        };
        let name = poison_body_blob_name(self.queue.name(), message.id.as_str());
        self.settle_call(
            "store the poisoned original as a blob",
            store.put_new(&name, message.body.as_bytes()),
        )
        .await?;
        record.body_blob = Some(BodyBlob::new(store.name(), name, &message.body));
        record.body = None;
        match record.to_message_text() {
            Ok(Some(text)) => Some(text),
            _ => {
                bump(&self.counters.settle_failures);
                tracing::error!("the poison record does not fit even without its body");
                None
            }
        }
    }
}
