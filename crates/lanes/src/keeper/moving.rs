//! What a keeper's pass does with each job it took from the Spot lane:
//! moved to the regular lane (the lane record claimed first, so a keeper
//! killed mid-move loses and doubles nothing), discarded when it is an old
//! copy, or put back where it was.

use super::*;

impl LaneKeeper {
    /// Moves a candidate received, unless it turned out to be an old copy
    /// (deleted) or cannot be moved now (put back).
    pub(super) async fn move_or_put_back(
        &self,
        message: &QueueMessage,
        candidate: &Candidate,
        pass: &mut KeeperPass,
    ) {
        let Some((envelope, body)) = self.open(&message.body) else {
            return self.give_back(message, pass).await;
        };
        let read = match self.records.read_fenced(&candidate.key).await {
            Ok(read) => read,
            Err(error) => {
                tracing::warn!(%error, job = %candidate.key, "lane keeper: reading the job's lane record failed; leaving it");
                return self.give_back(message, pass).await;
            }
        };
        let to = match arrival(
            read.record.as_ref(),
            envelope.generation,
            message.id.as_str(),
            envelope.moved_from.as_deref(),
        ) {
            Arrival::Stale => return self.discard(message, pass).await,
            // A worker finishes that: the poison record may not be sent.
            Arrival::Poisoning => return self.give_back(message, pass).await,
            Arrival::CompleteMove(to) => to,
            Arrival::Run | Arrival::Claim => Lane::Regular,
        };
        let earlier = match self.attempts.read(&message.id).await {
            Ok(read) => read.attempts,
            Err(error) => {
                tracing::warn!(%error, job = %candidate.key, "lane keeper: reading the attempt record failed; leaving the job");
                return self.give_back(message, pass).await;
            }
        };
        if earlier.poisoning.is_some() {
            // Being poisoned, its lane record not marked yet: a worker
            // finishes that, and a copy sent now could run.
            return self.give_back(message, pass).await;
        }
        // This receive is the keeper's, not a delivery; nor were its
        // earlier looks.
        let deliveries = message
            .dequeue_count
            .saturating_sub(1)
            .saturating_sub(earlier.looks);
        let carried = Carried {
            failures: envelope.carried.failures.saturating_add(earlier.failures),
            deliveries: envelope.carried.deliveries.saturating_add(deliveries),
            tails: envelope.carried.tails.plus(&earlier.goodput),
        };
        let job = MoveJob {
            key: &candidate.key,
            message: &message.id,
            held: message.dequeue_count,
            envelope: &envelope,
            body: &body,
            from: Lane::Spot,
            to,
            carried,
        };
        match self
            .lanes
            .send_moved(&self.records, self.encoding, &job, read)
            .await
        {
            Moved::Sent(id) => {
                if let Err(error) = self
                    .lanes
                    .spot
                    .delete(&message.id, &message.pop_receipt)
                    .await
                {
                    // Its next delivery finds the move done and discards it.
                    tracing::warn!(%error, job = %candidate.key, "lane keeper: moved, but deleting the old message failed");
                }
                let _ = self.attempts.forget(&message.id).await;
                tracing::info!(job = %candidate.key, new_message = %id, "lane keeper: moved to the regular lane");
                pass.moved.push(candidate.key.clone());
            }
            Moved::Stale => self.discard(message, pass).await,
            Moved::NotSent(reason) => {
                tracing::warn!(job = %candidate.key, %reason, "lane keeper: could not move the job; it waits where it is");
                self.give_back(message, pass).await;
            }
        }
    }

    /// Deletes an old copy of a job.
    pub(super) async fn discard(&self, message: &QueueMessage, pass: &mut KeeperPass) {
        match self
            .lanes
            .spot
            .delete(&message.id, &message.pop_receipt)
            .await
        {
            Ok(()) => {
                let _ = self.attempts.forget(&message.id).await;
                pass.discarded += 1;
            }
            Err(error) => tracing::warn!(%error, "lane keeper: deleting an old copy failed"),
        }
    }

    /// Puts a message back (see [`put_back`](Self::put_back)), counted.
    pub(super) async fn give_back(&self, message: &QueueMessage, pass: &mut KeeperPass) {
        pass.put_back += usize::from(self.put_back(message).await);
    }

    /// Makes a message received but not moved visible again at once, its
    /// look noted in its attempt record (beside the release, never in
    /// front of it); whether it is visible again.
    pub(super) async fn put_back(&self, message: &QueueMessage) -> bool {
        let note = async {
            let read = self.attempts.read(&message.id).await?;
            self.attempts
                .write(&message.id, &read, &read.attempts.looked())
                .await
        };
        let release =
            self.lanes
                .spot
                .update_visibility(&message.id, &message.pop_receipt, Duration::ZERO);
        let (noted, released) = tokio::join!(note, release);
        if let Err(error) = noted {
            tracing::warn!(%error, "lane keeper: could not note its look in the attempt record");
        }
        match released {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(%error, "lane keeper: putting a message back failed; it reappears after its hold");
                false
            }
        }
    }
}
