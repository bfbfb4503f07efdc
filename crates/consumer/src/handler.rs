//! What a user writes: a [`MessageHandler`] (or an async closure through
//! [`handler_fn`]) that gets one [`Job`] per delivery and returns `Ok`, a
//! failure worth retrying, or a [`Permanent`] one.

use std::future::Future;
use std::sync::Arc;

use super::job::Job;
use super::marker::ResultMarker;

/// What a handler's failure carries; its text becomes the poison record's
/// `last_error`. Wrap it with [`permanent`] when retrying cannot help.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure that retrying cannot fix (a body that is not a job, an invalid
/// range, a different result already stored): the message goes to the
/// poison queue at once, with this error as the reason. Build it with
/// [`permanent`].
///
/// ```
/// use spot_worker_consumer::{HandlerError, Permanent, permanent};
///
/// let error: HandlerError = permanent("the body is not a job");
/// assert!(Permanent::is_in(error.as_ref()));
/// assert_eq!(error.to_string(), "the body is not a job");
/// let transient: HandlerError = "connection reset".into();
/// assert!(!Permanent::is_in(transient.as_ref()));
/// ```
#[derive(Debug)]
pub struct Permanent(HandlerError);

impl std::fmt::Display for Permanent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Permanent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl Permanent {
    /// True if `error`, or any error in its `source()` chain, was marked
    /// permanent.
    pub fn is_in(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut current = Some(error);
        while let Some(e) = current {
            if e.is::<Permanent>() {
                return true;
            }
            current = e.source();
        }
        false
    }
}

/// Marks `error` as permanent: the message is poisoned at once instead of
/// being retried.
pub fn permanent(error: impl Into<HandlerError>) -> HandlerError {
    Box::new(Permanent(error.into()))
}

/// User code that processes one message. Returning `Ok` deletes the message;
/// returning `Err` (or panicking anywhere in this trait's methods, unless
/// built with `panic = "abort"`) retries it later and poisons it after `max_failures` failures; a
/// [`permanent`] error poisons it at once. The future is dropped if the
/// lease is lost or the worker shuts down, so keep work between awaits
/// restartable.
///
/// Implement it with a plain `async fn` (no macro):
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
/// use spot_worker_consumer::{Consumer, ConsumerConfig, HandlerError, Job, MessageHandler};
/// use spot_worker_storage::{InMemoryQueue, MessageQueue};
/// use tokio_util::sync::CancellationToken;
///
/// struct CountWords {
///     words: AtomicUsize,
///     stop: CancellationToken,
/// }
///
/// impl MessageHandler for CountWords {
///     async fn handle(&self, job: Job) -> Result<(), HandlerError> {
///         let words = job.text()?.split_whitespace().count();
///         tokio::task::yield_now().await; // any await, as in real work
///         self.words.fetch_add(words, Ordering::SeqCst);
///         self.stop.cancel(); // one message is enough for this example
///         Ok(())
///     }
/// }
///
/// let queue = InMemoryQueue::new("jobs");
/// queue.send("three small words", Duration::ZERO).await.unwrap();
/// let consumer = Consumer::new(
///     Arc::new(queue.clone()),
///     Arc::new(InMemoryQueue::new("jobs-poison")),
///     ConsumerConfig::default(),
/// )
/// .unwrap();
/// let stop = CancellationToken::new();
/// let handler = Arc::new(CountWords { words: AtomicUsize::new(0), stop: stop.clone() });
/// let stats = consumer.run(Arc::clone(&handler), stop).await;
/// assert_eq!(stats.succeeded, 1);
/// assert_eq!(handler.words.load(Ordering::SeqCst), 3);
/// # });
/// ```
///
/// Write results through [`Job::results`], never straight to a
/// [`ResultStore`](spot_worker_storage::ResultStore): a handler that
/// ignores its cancellation (blocking code on the blocking pool, a loop that never awaits) is abandoned when its
/// message is released, and may run on until the process exits; the fenced
/// store refuses its late writes, so it cannot race the worker that took
/// the message next. Checkpoints ([`Job::checkpoint`]) are fenced the same
/// way.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use spot_worker_consumer::{HandlerError, Job, MessageHandler};
/// use spot_worker_storage::ResultStore;
///
/// struct Upper {
///     results: Arc<dyn ResultStore>,
/// }
///
/// impl MessageHandler for Upper {
///     async fn handle(&self, job: Job) -> Result<(), HandlerError> {
///         let upper = job.text()?.to_uppercase();
///         // Refused once this delivery is no longer ours.
///         let results = job.results(Arc::clone(&self.results));
///         results.put_new(&format!("{}.txt", job.key()), upper.as_bytes()).await?;
///         Ok(())
///     }
/// }
/// # let _ = Upper { results: Arc::new(spot_worker_storage::InMemoryResultStore::new("r")) };
/// # });
/// ```
///
/// The consumer runs each handler on a task of its own (so one that never
/// yields cannot hold up the release of its message while the runtime has
/// another worker thread), so the future must be `Send`: holding something
/// that is not (an `Rc`, a `RefCell` borrow, a `std::sync::MutexGuard`)
/// across an `.await` does not compile.
///
/// ```compile_fail
/// use std::rc::Rc;
/// use spot_worker_consumer::{HandlerError, Job, MessageHandler};
///
/// struct NotSend;
///
/// impl MessageHandler for NotSend {
///     async fn handle(&self, job: Job) -> Result<(), HandlerError> {
///         let shared = Rc::new(job.dequeue_count());
///         tokio::task::yield_now().await;
///         assert!(*shared > 0);
///         Ok(())
///     }
/// }
/// ```
pub trait MessageHandler: Send + Sync + 'static {
    /// Processes one message; write it as
    /// `async fn handle(&self, job: Job) -> Result<(), HandlerError>`.
    fn handle(&self, job: Job) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// The key of the job `body` asks for, if it names one (for example a
    /// `job_id` field); `None` (the default) uses the message id. It keys
    /// [`Job::checkpoint`], and the consumer checks that checkpoint for
    /// completion before running the handler, so a job finished by another
    /// message (a duplicate) or whose delete was cut short is deleted
    /// instead of run again, and never poisoned. With the message id as the
    /// key, a first delivery skips that read: nobody can have written a
    /// checkpoint under the id of a message nobody has received; so does a
    /// first delivery of a handler with a [`completion_marker`](MessageHandler::completion_marker).
    fn job_key(&self, body: &[u8]) -> Option<String> {
        let _ = body;
        None
    }

    /// Where the job `body` asks for writes its result create-only when it
    /// is done, if that result is itself the job's completion marker; `None`
    /// (the default) when completion is a completed checkpoint
    /// ([`JobCheckpoint::complete`]).
    ///
    /// With a marker a job costs fewer requests: it needs no completed
    /// checkpoint write (the handler just writes its result, create-only),
    /// and its first delivery no checkpoint read, since its writes cannot
    /// overwrite anything: the first checkpoint write is create-only and
    /// conflicts with a peer's progress, and a create-only result is
    /// either new, identical, or a conflict. A redelivery reads the
    /// checkpoint and then the marker; an existing marker (a JSON document)
    /// goes through [`verify_completed`](MessageHandler::verify_completed)
    /// and the message is deleted without running. A duplicate message on
    /// its first delivery does run: a handler with long jobs should look
    /// for its result before its first progress write.
    fn completion_marker(&self, body: &[u8]) -> Option<ResultMarker> {
        let _ = body;
        None
    }

    /// Whether the completed job whose checkpoint (or result marker) holds
    /// `result` is the job `body` asks for. The default says yes, and the message is deleted
    /// without running the handler. Return a [`permanent`] error when the
    /// message asks for something else under the same key (say, a job id
    /// re-used for another range): it is then poisoned with that reason
    /// instead of silently skipped.
    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        let _ = (body, result);
        Ok(())
    }
}

/// A shared handler is a handler: a worker that runs its consumer more than
/// once (intake resumed after a cancelled event) hands it the same one.
/// Everything is forwarded, so the job key and the completed-job check are
/// never lost on the way.
impl<H: MessageHandler> MessageHandler for Arc<H> {
    fn handle(&self, job: Job) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (**self).handle(job)
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        (**self).job_key(body)
    }

    fn completion_marker(&self, body: &[u8]) -> Option<ResultMarker> {
        (**self).completion_marker(body)
    }

    fn verify_completed(
        &self,
        body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        (**self).verify_completed(body, result)
    }
}

/// A [`MessageHandler`] made from an async closure; see [`handler_fn`].
pub struct FnHandler<F>(F);

/// Wraps an async closure as a [`MessageHandler`].
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    FnHandler(f)
}

impl<F, Fut> MessageHandler for FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn handle(&self, job: Job) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (self.0)(job)
    }
}
