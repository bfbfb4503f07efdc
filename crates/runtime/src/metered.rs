//! Telemetry by composition: decorators around the storage traits and the
//! handler that record spans and metrics, so the storage crate stays free of
//! OpenTelemetry and any backend gets the same instruments.
//!
//! - [`MeteredQueue`]: lease renewals (on the work queue);
//! - [`MeteredCheckpoints`]: checkpoint writes and their latency;
//! - [`MeteredHandler`]: how long successful handlers took;
//! - [`goodput_observer`]: where each finished job's time went;
//! - [`settlement_observer`]: what became of each delivery, from the
//!   consumer's own settlement (the source of its statistics), and the
//!   `process {queue}` span marked as an error for a counted failure or
//!   poison only: an eviction, a wait or a lost lease is not a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use spot_worker_consumer::{
    DeadlineObserver, DeadlineOutcome, DeliveryOutcome, GoodputObserver, HandlerError, Job,
    MessageHandler, SettlementObserver,
};
use spot_worker_decisions::goodput::{Ledger, TimeKind};
use spot_worker_storage::{
    CheckpointStore, ETag, MessageId, MessageQueue, PopReceipt, QueueMessage, StorageError,
    VisibleMessage,
};
use spot_worker_telemetry::{
    CheckpointOutcome, JobTimeKind, LeaseOutcome, MessageOutcome, Metrics, record_error,
};

/// The work queue, recording its lease renewals (what became of each
/// message is the [`settlement_observer`]'s).
pub(crate) struct MeteredQueue {
    inner: Arc<dyn MessageQueue>,
    metrics: Metrics,
    queue: String,
}

impl MeteredQueue {
    pub(crate) fn work(inner: Arc<dyn MessageQueue>, metrics: Metrics) -> Self {
        let queue = inner.name().to_owned();
        MeteredQueue {
            inner,
            metrics,
            queue,
        }
    }
}

#[async_trait]
impl MessageQueue for MeteredQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max_messages: u8,
        visibility_timeout: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        self.inner.receive(max_messages, visibility_timeout).await
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        pop_receipt: &PopReceipt,
        visibility_timeout: Duration,
    ) -> Result<PopReceipt, StorageError> {
        let result = self
            .inner
            .update_visibility(id, pop_receipt, visibility_timeout)
            .await;
        // Visibility zero hands the message back (a settlement, counted by
        // the observer); anything else renews.
        if !visibility_timeout.is_zero() {
            let outcome = match &result {
                Ok(_) => LeaseOutcome::Ok,
                Err(StorageError::LeaseLost { .. }) => LeaseOutcome::Lost,
                Err(_) => LeaseOutcome::Error,
            };
            self.metrics.lease_renewed(&self.queue, outcome);
        }
        result
    }

    async fn delete(&self, id: &MessageId, pop_receipt: &PopReceipt) -> Result<(), StorageError> {
        self.inner.delete(id, pop_receipt).await
    }

    async fn send(
        &self,
        body: &str,
        initial_visibility_delay: Duration,
    ) -> Result<MessageId, StorageError> {
        self.inner.send(body, initial_visibility_delay).await
    }

    async fn peek(&self, max_messages: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        self.inner.peek(max_messages).await
    }
}

/// A [`CheckpointStore`] that records every write's outcome and latency.
pub(crate) struct MeteredCheckpoints {
    pub(crate) inner: Arc<dyn CheckpointStore>,
    pub(crate) metrics: Metrics,
}

crate::decorator::checkpoint_writes_decorator!(MeteredCheckpoints);

impl MeteredCheckpoints {
    /// Records a write's outcome and latency.
    fn written(&self, _key: &str, result: &Result<ETag, StorageError>, started: Instant) {
        let outcome = match result {
            Ok(_) => CheckpointOutcome::Ok,
            Err(StorageError::Conflict { .. }) => CheckpointOutcome::Conflict,
            Err(_) => CheckpointOutcome::Error,
        };
        self.metrics.checkpoint_written(outcome, started.elapsed());
    }
}

/// A [`MessageHandler`] that records how long each successful handler took.
/// Whether a delivery failed is not its to say: an `Err` may be an eviction
/// or a wait; the [`settlement_observer`] records what the consumer decided.
pub(crate) struct MeteredHandler<H> {
    pub(crate) inner: H,
    pub(crate) metrics: Metrics,
    pub(crate) queue: String,
    /// Counts the handler as holding a message while it runs.
    pub(crate) activity: crate::activity::WorkerActivity,
}

impl<H: MessageHandler> MessageHandler for MeteredHandler<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let _held = self.activity.hold();
        let started = Instant::now();
        let result = self.inner.handle(job).await;
        if result.is_ok() {
            self.metrics
                .handler_succeeded(&self.queue, started.elapsed());
        }
        result
    }

    crate::decorator::forward_job_knowledge!();
}

/// Records each delivery's outcome as the consumer counts it: the
/// `spot_worker.messages.settled` series by outcome, `messages.failed` for
/// counted handler failures only, and an error on the delivery's span (the
/// observer runs inside it) for those and for poison.
pub(crate) fn settlement_observer(metrics: Metrics, queue: String) -> SettlementObserver {
    Arc::new(move |outcome: DeliveryOutcome| {
        metrics.message_settled(&queue, message_outcome(outcome));
        if outcome.is_failure() {
            metrics.message_failed(&queue);
        }
        if let Some(error_type) = span_error(outcome) {
            record_error(&tracing::Span::current(), error_type);
        }
    })
}

/// Records each finished job's time by kind, its goodput and its
/// unaccounted deliveries (see `spot_worker_decisions::goodput`).
pub(crate) fn goodput_observer(metrics: Metrics, queue: String) -> GoodputObserver {
    Arc::new(move |ledger: &Ledger| {
        let seconds = TimeKind::ALL.map(|kind| (job_time_kind(kind), ledger.seconds(kind)));
        metrics.job_finished(&queue, &seconds, ledger.unaccounted);
    })
}

/// Records each finished job with a deadline: met or missed, and its
/// hours by lane.
pub(crate) fn deadline_observer(metrics: Metrics, queue: String) -> DeadlineObserver {
    Arc::new(move |outcome: &DeadlineOutcome, ledger: &Ledger| {
        metrics.deadline_job_finished(
            &queue,
            outcome.met,
            ledger.spot_ms() as f64 / 1000.0,
            ledger.regular_ms as f64 / 1000.0,
        );
    })
}

/// The telemetry attribute for a kind of job time.
fn job_time_kind(kind: TimeKind) -> JobTimeKind {
    match kind {
        TimeKind::Useful => JobTimeKind::Useful,
        TimeKind::Redone => JobTimeKind::Redone,
        TimeKind::Checkpointing => JobTimeKind::Checkpointing,
        TimeKind::Waiting => JobTimeKind::Waiting,
    }
}

/// The telemetry attribute for a consumer outcome.
fn message_outcome(outcome: DeliveryOutcome) -> MessageOutcome {
    match outcome {
        DeliveryOutcome::Succeeded => MessageOutcome::Succeeded,
        DeliveryOutcome::SkippedCompleted => MessageOutcome::SkippedCompleted,
        DeliveryOutcome::Retried => MessageOutcome::Retried,
        DeliveryOutcome::Poisoned { .. } => MessageOutcome::Poisoned,
        DeliveryOutcome::Released => MessageOutcome::Released,
        DeliveryOutcome::WaitedForPeer => MessageOutcome::WaitedForPeer,
        DeliveryOutcome::WaitedForStore => MessageOutcome::WaitedForStore,
        DeliveryOutcome::LeaseLost => MessageOutcome::LeaseLost,
        DeliveryOutcome::Moved => MessageOutcome::Moved,
        DeliveryOutcome::Superseded => MessageOutcome::Superseded,
        DeliveryOutcome::ProbeTaken => MessageOutcome::ProbeTaken,
    }
}

/// The span's `error.type` for an outcome, if it is an error at all: a
/// counted handler failure is `handler`, other poison is `poisoned`.
fn span_error(outcome: DeliveryOutcome) -> Option<&'static str> {
    match outcome {
        _ if outcome.is_failure() => Some("handler"),
        DeliveryOutcome::Poisoned { .. } => Some("poisoned"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counted_failures_and_poison_are_errors() {
        use DeliveryOutcome::*;
        // (consumer outcome, attribute, span error)
        let table = [
            (Succeeded, "succeeded", None),
            (SkippedCompleted, "skipped_completed", None),
            (Retried, "retried", Some("handler")),
            (
                Poisoned {
                    handler_failed: true,
                },
                "poisoned",
                Some("handler"),
            ),
            (
                Poisoned {
                    handler_failed: false,
                },
                "poisoned",
                Some("poisoned"),
            ),
            (Released, "released", None),
            (WaitedForPeer, "waited_for_peer", None),
            (WaitedForStore, "waited_for_store", None),
            (LeaseLost, "lease_lost", None),
            (Moved, "moved", None),
            (Superseded, "superseded", None),
            (ProbeTaken, "probe_taken", None),
        ];
        for (outcome, attribute, error) in table {
            assert_eq!(message_outcome(outcome).as_str(), attribute, "{outcome:?}");
            assert_eq!(span_error(outcome), error, "{outcome:?}");
        }
    }
}
