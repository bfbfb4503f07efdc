//! The settings of the queue and its consumer.

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, seconds, text};

/// The queue to consume.
pub const QUEUE: Setting<Text> = Setting {
    key: "SPOT_WORKER_QUEUE",
    default: text("jobs"),
    default_doc: None,
    doc: "queue to consume; poison queue `<queue>-poison`",
    secret: false,
};

/// How message text encodes bodies.
pub const MESSAGE_ENCODING: Setting<Text> = Setting {
    key: "SPOT_WORKER_MESSAGE_ENCODING",
    default: text("text"),
    default_doc: None,
    doc: "or `base64` (Azure Functions / WebJobs)",
    secret: false,
};

/// Messages handled at once.
pub const CONCURRENCY: Setting<Option<usize>> = Setting {
    key: "SPOT_WORKER_CONCURRENCY",
    default: None,
    default_doc: Some("CPUs"),
    doc: "messages handled at once",
    secret: false,
};

/// Lease length.
pub const VISIBILITY_TIMEOUT: Setting<Duration> = Setting {
    key: "SPOT_WORKER_VISIBILITY_TIMEOUT",
    default: seconds(30),
    default_doc: None,
    doc: "lease length (5 s to 7 days), renewed every third of it: a job of N minutes costs about 3·N / timeout renewals",
    secret: false,
};

/// Handler failures before the poison queue.
pub const MAX_FAILURES: Setting<u32> = Setting {
    key: "SPOT_WORKER_MAX_FAILURES",
    default: 5,
    default_doc: None,
    doc: "handler failures before the poison queue (evictions never count; see [Delivery semantics](lifecycle.md#delivery-semantics))",
    secret: false,
};

/// The crash-loop guard.
pub const MAX_DELIVERIES: Setting<u32> = Setting {
    key: "SPOT_WORKER_MAX_DELIVERIES",
    default: 100,
    default_doc: None,
    doc: "crash-loop guard: deliveries without a recorded outcome before the poison queue",
    secret: false,
};

/// Longest pause between receives on an empty queue.
pub const IDLE_POLL_MAX: Setting<Duration> = Setting {
    key: "SPOT_WORKER_IDLE_POLL_MAX",
    default: seconds(1),
    default_doc: None,
    doc: "longest pause between receives on an empty queue (bounds release-to-redelivery)",
    secret: false,
};

/// How long a refusing store is waited out before intake pauses.
pub const STORAGE_REFUSAL_GRACE: Setting<Duration> = Setting {
    key: "SPOT_WORKER_STORAGE_REFUSAL_GRACE",
    default: seconds(30),
    default_doc: None,
    doc: "how long the checkpoint store may refuse one kind of request (401/403) or miss its container before the worker turns not ready and pauses intake; shorter refusals are waited out uncounted, like outages (see [Delivery semantics](lifecycle.md#delivery-semantics))",
    secret: false,
};

/// What a worker VM costs, for each job's cost in money.
pub const PRICE_PER_HOUR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_PRICE_PER_HOUR",
    default: None,
    default_doc: None,
    doc: "`status`: a Spot worker VM's price per hour in US dollars (a number, e.g. `0.0125`), shared by its `SPOT_WORKER_CONCURRENCY` slots; with it each job's time is also shown as money, storage requests included (see [Goodput](goodput.md)); a regular VM's is `SPOT_WORKER_REGULAR_PRICE_PER_HOUR`",
    secret: false,
};
