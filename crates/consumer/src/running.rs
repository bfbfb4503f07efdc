//! Running the handler on one delivery: in its own task (a panic is the
//! handler's failure, not the worker's), with the store outage it waits
//! out, and aborted when the delivery is dropped.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;
use tracing::Instrument as _;

use super::*;
use crate::in_flight::{AbortOnDrop, Delivery};
use crate::panics::{HandlerPart, catching, panic_error};
use crate::settlement::Ending;
use spot_worker_storage::CheckpointNotes;
use spot_worker_storage::attempts::ReadAttempts;

impl Consumer {
    /// Runs the handler until it returns, the worker releases, or the lease
    /// is lost; `None` if it was dropped.
    pub(super) async fn run_handler<H: MessageHandler>(
        &self,
        handler: Arc<H>,
        job: Job,
        delivery: &Delivery,
        signals: &DrainSignals,
    ) -> Option<Result<(), HandlerError>> {
        // On a task of its own: a handler that never yields (blocking code
        // in an async fn) then holds only its own worker thread, and this
        // delivery can still be released. A panic is one more failed attempt
        // (see `panics`), whether it comes before the future is made or
        // inside it: left to unwind, it would end the delivery without
        // settling, and a crash-looping message would never reach the
        // poison queue.
        let span = tracing::Span::current();
        delivery.clock.handler_started();
        // The start of the handler time a delivery reports as redone if it
        // ends unsaved: a log reader (the chaos run's goodput check) needs
        // it for a delivery released before the handler said anything.
        tracing::debug!("handler started");
        let task = tokio::spawn(
            async move {
                let future = catching(HandlerPart::HandleStart, || handler.handle(job))?;
                AssertUnwindSafe(future)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(panic_error(HandlerPart::Handle, panic.as_ref())))
            }
            .instrument(span),
        );
        // Dropped on every way out: a handler still running is dropped (at
        // its next await; blocking code runs on, fenced).
        let _abort = AbortOnDrop(task.abort_handle());
        tokio::pin!(task);
        // The handler comes first so a result that is ready is kept even if
        // a release arrived at the same moment. Winding down only cancels
        // its token: it still gets to save progress.
        tokio::select! {
            biased;
            joined = &mut task => Some(match joined {
                Ok(result) => result,
                Err(error) if error.is_panic() => {
                    Err(panic_error(HandlerPart::Handle, error.into_panic().as_ref()))
                }
                Err(error) => Err(format!("the handler's task ended: {error}").into()),
            }),
            () = signals.release.cancelled() => None,
            () = delivery.lease.lost() => {
                delivery.job_token.cancel();
                None
            }
        }
    }

    /// Settles a delivery that could not reach a store before its handler
    /// ran (`error` says which and how): tried again after a backoff,
    /// uncounted.
    pub(super) async fn wait_out_store(
        &self,
        delivery: Delivery,
        signals: &DrainSignals,
        error: String,
        earlier: ReadAttempts,
    ) {
        let notes = CheckpointNotes::default();
        let _ = notes.unreachable.set(error.clone());
        let ending = Ending::Failed {
            error: &error,
            permanent: false,
        };
        self.finish(delivery, signals, ending, &notes, earlier)
            .await;
    }

    /// Settles a delivery whose handler code panicked before the handler
    /// ran (in `job_key` or `verify_completed`): a failure like any other.
    pub(super) async fn panicked(
        &self,
        delivery: Delivery,
        signals: &DrainSignals,
        panicked: &HandlerError,
    ) {
        let error = panicked.to_string();
        let ending = Ending::Failed {
            error: &error,
            permanent: false,
        };
        let notes = CheckpointNotes::default();
        self.finish(delivery, signals, ending, &notes, ReadAttempts::default())
            .await;
    }
}
