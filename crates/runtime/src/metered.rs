//! Telemetry by composition: decorators around the storage traits and the
//! handler that record spans and metrics, so the storage crate stays free of
//! OpenTelemetry and any backend gets the same instruments.
//!
//! - [`MeteredQueue`]: lease renewals, releases, deletes (on the work queue)
//!   and poison moves (on the poison queue);
//! - [`MeteredCheckpoints`]: checkpoint writes and their latency;
//! - [`MeteredHandler`]: the `process {queue}` span, processing duration and
//!   failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, HandlerError, Job, MessageHandler, MessageId, MessageQueue,
    PopReceipt, QueueMessage, StorageError, StoredCheckpoint, WritePrecondition,
};
use spot_worker_telemetry::{CheckpointOutcome, LeaseOutcome, Metrics, record_error};

/// Which queue a [`MeteredQueue`] wraps: what its calls mean differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The work queue: visibility updates are renewals or releases.
    Work,
    /// The poison queue: a send is a message given up on.
    Poison,
}

/// A [`MessageQueue`] that records what the consumer does with it.
pub(crate) struct MeteredQueue {
    inner: Arc<dyn MessageQueue>,
    metrics: Metrics,
    role: Role,
    /// The work queue's name (the poison queue reports under it too, so one
    /// dashboard filter shows a queue's whole story).
    queue: String,
}

impl MeteredQueue {
    pub(crate) fn work(inner: Arc<dyn MessageQueue>, metrics: Metrics) -> Self {
        let queue = inner.name().to_owned();
        MeteredQueue {
            inner,
            metrics,
            role: Role::Work,
            queue,
        }
    }

    pub(crate) fn poison(inner: Arc<dyn MessageQueue>, work_queue: &str, metrics: Metrics) -> Self {
        MeteredQueue {
            inner,
            metrics,
            role: Role::Poison,
            queue: work_queue.to_owned(),
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
        if self.role == Role::Work {
            // Visibility zero hands the message back; anything else renews.
            if visibility_timeout.is_zero() {
                if result.is_ok() {
                    self.metrics.message_released(&self.queue);
                }
            } else {
                let outcome = match &result {
                    Ok(_) => LeaseOutcome::Ok,
                    Err(StorageError::LeaseLost { .. }) => LeaseOutcome::Lost,
                    Err(_) => LeaseOutcome::Error,
                };
                self.metrics.lease_renewed(&self.queue, outcome);
            }
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
        let result = self.inner.send(body, initial_visibility_delay).await;
        if self.role == Role::Poison && result.is_ok() {
            self.metrics.message_poisoned(&self.queue);
        }
        result
    }
}

/// A [`CheckpointStore`] that records every write's outcome and latency.
pub(crate) struct MeteredCheckpoints {
    pub(crate) inner: Arc<dyn CheckpointStore>,
    pub(crate) metrics: Metrics,
}

#[async_trait]
impl CheckpointStore for MeteredCheckpoints {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.inner.read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        let started = Instant::now();
        let result = self.inner.write(key, checkpoint, precondition, stamp).await;
        self.record(&result, started);
        result
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.inner.delete(key).await
    }
}

impl MeteredCheckpoints {
    fn record(&self, result: &Result<ETag, StorageError>, started: Instant) {
        let outcome = match result {
            Ok(_) => CheckpointOutcome::Ok,
            Err(StorageError::Conflict { .. }) => CheckpointOutcome::Conflict,
            Err(_) => CheckpointOutcome::Error,
        };
        self.metrics.checkpoint_written(outcome, started.elapsed());
    }
}

/// A [`MessageHandler`] that records how long each message took and whether
/// it failed, marking a failure on the delivery's span (the `process
/// {queue}` span the consumer runs it in, from
/// [`message_span`](spot_worker_telemetry::message_span)).
pub(crate) struct MeteredHandler<H> {
    pub(crate) inner: H,
    pub(crate) metrics: Metrics,
    pub(crate) queue: String,
}

impl<H: MessageHandler> MessageHandler for MeteredHandler<H> {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        let started = Instant::now();
        let result = self.inner.handle(job).await;
        match &result {
            Ok(()) => self
                .metrics
                .message_processed(&self.queue, started.elapsed()),
            Err(_) => {
                record_error(&tracing::Span::current(), "handler");
                self.metrics.message_failed(&self.queue);
            }
        }
        result
    }

    // A decorator forwards what the handler knows about its jobs, or the
    // consumer would lose the job key and the completed-job check.
    fn job_key(&self, body: &[u8]) -> Option<String> {
        self.inner.job_key(body)
    }

    fn completion_marker(&self, body: &[u8]) -> Option<spot_worker_storage::ResultMarker> {
        self.inner.completion_marker(body)
    }

    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        self.inner.verify_completed(body, result)
    }
}
