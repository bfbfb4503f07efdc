//! [`ConsumerConfig`]: how the consumer receives, leases and settles
//! messages, and the limits the queue service imposes on those settings.

use std::time::Duration;

use spot_worker_storage::MAX_RECEIVE_BATCH;
use spot_worker_storage::MessageEncoding;
use spot_worker_storage::StorageError;

/// How the consumer receives, leases and settles messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Messages asked for per receive call, 1 to 32.
    pub batch_size: u8,
    /// Most messages being handled at once.
    pub max_in_flight: usize,
    /// How long a received message stays hidden, 5 s to 7 days (Azure
    /// counts whole seconds). Renewed every third of it while its handler
    /// runs (a job of N minutes costs about 3·N / timeout renewals); if no
    /// renewal gets through before it runs out
    /// (a storage outage), the lease counts as lost and the handler is
    /// dropped, because another consumer may have the message by then.
    pub visibility_timeout: Duration,
    /// After a receive that returned a full batch (a backlog), the longest
    /// wait for more slots to free before receiving again, so that one
    /// receive fetches a whole batch instead of one message per freed slot.
    /// It ends as soon as the batch is complete, or when no slot has freed
    /// for 100 ms (long jobs); an idle or draining queue is asked at once.
    /// At most 1 s; zero receives as soon as one slot is free.
    pub receive_fill_wait: Duration,
    /// First delay after an empty receive.
    pub idle_backoff_floor: Duration,
    /// Longest delay between receives while the queue stays empty.
    pub idle_backoff_max: Duration,
    /// Delay before the first retry of a failed message; doubles per
    /// recorded failure (and per wait for another holder of the same job).
    pub retry_backoff_base: Duration,
    /// Longest delay before a retry.
    pub retry_backoff_max: Duration,
    /// A message whose handler has failed this many times goes to
    /// `<queue>-poison`. Only handler failures count: a delivery released on
    /// shutdown (a Spot eviction), cancelled by it, or handed back unstarted
    /// does not, however often it happens. Failures are kept in an attempt
    /// record per message (see the crate's "Delivery semantics").
    pub max_failures: u32,
    /// Crash-loop guard: a message delivered more than this many times
    /// without a recorded outcome (no failure, wait for a peer or release
    /// on shutdown: the process died, its lease was lost, it waited for the
    /// checkpoint store, or its release could not be recorded within 1 s)
    /// goes to the poison queue. Evictions are recorded as releases, so
    /// they do not count here.
    pub max_deliveries: u32,
    /// How message text encodes the body.
    pub encoding: MessageEncoding,
    /// Deadline of each settle call (delete, retry, poison, release). It is
    /// separate from the shutdown token on purpose: settling must still
    /// happen after shutdown was requested.
    pub settle_timeout: Duration,
    /// How long the checkpoint store may refuse one kind of request
    /// (401/403) or miss its container (404 `ContainerNotFound`), with none
    /// of that kind answered in between, before the consumer pauses its
    /// intake and reports itself not healthy ([`Consumer::store_health`]).
    /// Shorter refusals are waited out like outages: uncounted. Zero pauses
    /// at the first refusal.
    ///
    /// [`Consumer::store_health`]: crate::Consumer::store_health
    pub refusal_grace: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            batch_size: 16,
            max_in_flight: 16,
            visibility_timeout: Duration::from_secs(30),
            receive_fill_wait: Duration::from_secs(1),
            idle_backoff_floor: Duration::from_millis(200),
            idle_backoff_max: Duration::from_secs(10),
            retry_backoff_base: Duration::from_secs(5),
            retry_backoff_max: Duration::from_secs(300),
            max_failures: 5,
            max_deliveries: 100,
            encoding: MessageEncoding::Text,
            settle_timeout: Duration::from_secs(10),
            refusal_grace: DEFAULT_REFUSAL_GRACE,
        }
    }
}

/// The default [`ConsumerConfig::refusal_grace`]: long enough to ride out a
/// credential being rotated or a token refreshed, short enough that a
/// removed role assignment stops the churn within a minute.
pub const DEFAULT_REFUSAL_GRACE: Duration = Duration::from_secs(30);

/// The shortest lease [`ConsumerConfig::validate`] accepts.
const MIN_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest [`ConsumerConfig::receive_fill_wait`] accepted.
const MAX_RECEIVE_FILL_WAIT: Duration = Duration::from_secs(1);
/// The longest visibility timeout the queue service accepts.
const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl ConsumerConfig {
    /// Checks the limits the queue service imposes.
    pub fn validate(&self) -> Result<(), StorageError> {
        let invalid = |reason: &str| Err(StorageError::InvalidArgument(reason.to_owned()));
        if self.batch_size == 0 || self.batch_size > MAX_RECEIVE_BATCH {
            return invalid("batch_size must be between 1 and 32");
        }
        if self.max_in_flight == 0 {
            return invalid("max_in_flight must be at least 1");
        }
        // Below 5 s a renewal has too little time to get through before the
        // lease runs out; 7 days is the queue service's own limit.
        if self.visibility_timeout < MIN_VISIBILITY_TIMEOUT
            || self.visibility_timeout > MAX_VISIBILITY_TIMEOUT
        {
            return invalid("visibility_timeout must be between 5 seconds and 7 days");
        }
        if self.max_failures == 0 {
            return invalid("max_failures must be at least 1");
        }
        if self.max_deliveries == 0 {
            return invalid("max_deliveries must be at least 1");
        }
        if self.idle_backoff_floor.is_zero() || self.idle_backoff_max < self.idle_backoff_floor {
            return invalid("idle backoff needs 0 < floor <= max");
        }
        // Longer would delay a backlog's next receive by more than an idle
        // peer waits for a released message.
        if self.receive_fill_wait > MAX_RECEIVE_FILL_WAIT {
            return invalid("receive_fill_wait must be at most 1 second");
        }
        if self.settle_timeout.is_zero() {
            return invalid("settle_timeout must be positive");
        }
        Ok(())
    }
}
