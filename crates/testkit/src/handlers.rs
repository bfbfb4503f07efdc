//! Message handlers that several crates' tests run the consumer with, so
//! that the in-memory tests and their Azurite twins run the same handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use spot_worker_consumer::{HandlerError, Job, MessageHandler, handler_fn};

/// A handler an eviction interrupts: it counts its runs, then waits for its
/// cancellation and returns "interrupted" (as `primes` does), except once
/// `finish` is set: then it succeeds at once.
pub fn evictable(runs: Arc<AtomicU32>, finish: Arc<AtomicBool>) -> impl MessageHandler {
    handler_fn(move |job: Job| {
        let (runs, finish) = (runs.clone(), finish.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if finish.load(Ordering::SeqCst) {
                return Ok(());
            }
            job.cancellation().cancelled().await;
            Err::<(), HandlerError>("interrupted".into())
        }
    })
}
