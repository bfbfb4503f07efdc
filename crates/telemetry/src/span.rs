//! Spans that follow the OpenTelemetry messaging semantic conventions, so
//! backends group the worker's traces like any other queue consumer's.
//!
//! The `otel.*` fields are read by `tracing-opentelemetry`: `otel.name`
//! becomes the span name (`process orders`), `otel.kind` the span kind.
//! Fields left `Empty` can be filled in later with [`record_error`].

use tracing::Span;
use tracing::field::Empty;

/// `messaging.system` value. The conventions list no value for Azure
/// Storage Queues (only `servicebus` and `eventhubs` among Azure services),
/// so this follows their lower_snake_case style.
pub const MESSAGING_SYSTEM_VALUE: &str = "azure_storage_queue";

/// Attribute: the messaging system.
pub const MESSAGING_SYSTEM: &str = "messaging.system";
/// Attribute: `receive`, `process` or `settle`.
pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
/// Attribute: the system-specific operation name (`process`, `delete`...).
pub const MESSAGING_OPERATION_NAME: &str = "messaging.operation.name";
/// Attribute: the queue name. The only messaging attribute also used on metrics.
pub const MESSAGING_DESTINATION_NAME: &str = "messaging.destination.name";
/// Attribute: the message id (spans only: unbounded cardinality).
pub const MESSAGING_MESSAGE_ID: &str = "messaging.message.id";
/// Attribute: how many times the queue has handed this message out,
/// named after Service Bus's `messaging.servicebus.message.delivery_count`.
pub const MESSAGING_DEQUEUE_COUNT: &str = "messaging.azure_storage_queue.message.dequeue_count";
/// Attribute: the number of messages a receive returned.
pub const MESSAGING_BATCH_MESSAGE_COUNT: &str = "messaging.batch.message_count";
/// Attribute: a low-cardinality error class, set by [`record_error`].
pub const ERROR_TYPE: &str = "error.type";

/// The `messaging.operation.type` values this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationType {
    /// Pulling messages from the queue.
    Receive,
    /// Running the handler on one message.
    Process,
    /// Deleting, releasing or poisoning a message after processing.
    Settle,
}

impl OperationType {
    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Receive => "receive",
            Self::Process => "process",
            Self::Settle => "settle",
        }
    }
}

/// The span around processing one message: name `process {queue}`, kind
/// consumer, with `messaging.system`, `messaging.operation.type = process`,
/// `messaging.destination.name`, `messaging.message.id` and the dequeue count.
///
/// ```
/// let span = spot_worker_telemetry::message_span("orders", "7d0c1f2e", 1);
/// let _entered = span.enter();
/// // handle the message; logs inside carry the span's fields
/// ```
pub fn message_span(queue: &str, message_id: &str, dequeue_count: u32) -> Span {
    tracing::info_span!(
        "process_message",
        otel.name = format!("process {queue}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        "messaging.system" = MESSAGING_SYSTEM_VALUE,
        "messaging.operation.type" = OperationType::Process.as_str(),
        "messaging.operation.name" = "process",
        "messaging.destination.name" = queue,
        "messaging.message.id" = message_id,
        // As i64: tracing-opentelemetry exports u64 fields as strings.
        "messaging.azure_storage_queue.message.dequeue_count" = i64::from(dequeue_count),
        "error.type" = Empty,
    )
}

/// The span around one receive call (a batch of up to 32 messages): name
/// `receive {queue}`, kind consumer. Record the number of messages with
/// `span.record("messaging.batch.message_count", n)`.
pub fn receive_span(queue: &str) -> Span {
    tracing::info_span!(
        "receive_messages",
        otel.name = format!("receive {queue}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        "messaging.system" = MESSAGING_SYSTEM_VALUE,
        "messaging.operation.type" = OperationType::Receive.as_str(),
        "messaging.operation.name" = "receive",
        "messaging.destination.name" = queue,
        "messaging.batch.message_count" = Empty,
        "error.type" = Empty,
    )
}

/// The span around settling one message, where `operation` names what was
/// done (`delete`, `release`, `poison`...): name `{operation} {queue}`,
/// kind client (it is a call to the queue service).
pub fn settle_span(queue: &str, message_id: &str, operation: &'static str) -> Span {
    tracing::info_span!(
        "settle_message",
        otel.name = format!("{operation} {queue}"),
        otel.kind = "client",
        otel.status_code = Empty,
        "messaging.system" = MESSAGING_SYSTEM_VALUE,
        "messaging.operation.type" = OperationType::Settle.as_str(),
        "messaging.operation.name" = operation,
        "messaging.destination.name" = queue,
        "messaging.message.id" = message_id,
        "error.type" = Empty,
    )
}

/// Marks a span from this module as failed: sets `error.type` (keep it a
/// short class such as `timeout` or `handler`, not a message) and the span
/// status to error.
pub fn record_error(span: &Span, error_type: &str) {
    span.record(ERROR_TYPE, error_type);
    span.record("otel.status_code", "error");
}
