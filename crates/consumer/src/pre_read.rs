//! What the consumer reads before it runs a handler: nothing, the job's
//! checkpoint, or the checkpoint and then the handler's result marker (see
//! [`MessageHandler::completion_marker`](super::MessageHandler::completion_marker)).

/// The reads made before the handler runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreRead {
    /// None: the handler's first checkpoint handle starts from "no
    /// checkpoint", so its first write is create-only.
    Nothing,
    /// The checkpoint: completed, or the progress the handler resumes from.
    Checkpoint,
    /// The checkpoint, then (unless it is completed) the result marker.
    CheckpointAndMarker,
}

/// Decides the reads for a delivery.
///
/// A first delivery (a dequeue count of 1: the queue counts every receive,
/// so nobody has had this message before) reads nothing when nothing read
/// could change what the handler does safely. A count the queue did not
/// report ([`QueueMessage::UNKNOWN_DEQUEUE_COUNT`](spot_worker_storage::QueueMessage::UNKNOWN_DEQUEUE_COUNT))
/// proves nothing and is read like a redelivery:
///
/// - keyed by the message id, no checkpoint can exist: nobody can have
///   written under the id of a message nobody has received;
/// - keyed by the body but completed by a create-only result (a marker),
///   a duplicate of a running or finished job is caught by the writes
///   themselves: the handler's first checkpoint write is create-only and
///   conflicts with a peer's progress, and its result is create-only, so it
///   can never overwrite one (an identical result is success, another is a
///   conflict).
///
/// A key from the body without a marker is always read: a duplicate may
/// have completed the job, and only the checkpoint says so. A redelivery
/// reads the checkpoint to resume from it, and the marker when the handler
/// has one, so a finished job is deleted rather than run or poisoned.
pub(crate) fn pre_read(dequeue_count: u32, keyed_by_message_id: bool, marked: bool) -> PreRead {
    let first_delivery = dequeue_count == 1;
    match (first_delivery, keyed_by_message_id || marked, marked) {
        (true, true, _) => PreRead::Nothing,
        (_, _, true) => PreRead::CheckpointAndMarker,
        _ => PreRead::Checkpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_reads_only_what_can_exist_and_matter() {
        use PreRead::*;
        // (dequeue count, keyed by the message id, result marker, reads)
        let table = [
            (1, true, false, Nothing),
            // Not reported by the queue: may have been delivered before.
            (0, true, false, Checkpoint),
            (0, false, true, CheckpointAndMarker),
            (2, true, false, Checkpoint),
            (7, true, false, Checkpoint),
            (1, false, false, Checkpoint),
            (2, false, false, Checkpoint),
            (1, false, true, Nothing),
            (1, true, true, Nothing),
            (2, false, true, CheckpointAndMarker),
            (2, true, true, CheckpointAndMarker),
        ];
        for (dequeue_count, keyed_by_message_id, marked, expected) in table {
            assert_eq!(
                pre_read(dequeue_count, keyed_by_message_id, marked),
                expected,
                "dequeue count {dequeue_count}, keyed by the message id: {keyed_by_message_id}, marker: {marked}"
            );
        }
    }
}
