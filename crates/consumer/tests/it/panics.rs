//! A handler that panics anywhere (its job key, its completion marker, its
//! completed-job check, the call that makes its future, or the future)
//! fails like any other: the failure is recorded, retried, and poisoned
//! after `max_failures`, with a reason that says it panicked and where.
//! In-memory queue, tokio's paused clock.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use spot_worker_consumer::{ConsumerConfig, HandlerError, Job, MessageHandler, PoisonRecord};
use spot_worker_storage::{InMemoryCheckpointStore, MessageQueue};

use crate::common::*;

/// Where [`PanicsIn`] panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    JobKey,
    CompletionMarker,
    VerifyCompleted,
    HandleStart,
    Handle,
}

/// Panics in one part, on every delivery; counts the futures it ran.
struct PanicsIn {
    part: Part,
    runs: Arc<AtomicU32>,
}

impl MessageHandler for PanicsIn {
    fn handle(&self, job: Job) -> impl Future<Output = Result<(), HandlerError>> + Send {
        assert!(
            self.part != Part::HandleStart,
            "no future for delivery {}",
            job.dequeue_count()
        );
        let (part, runs) = (self.part, Arc::clone(&self.runs));
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            assert!(
                part != Part::Handle,
                "mid-job on delivery {}",
                job.dequeue_count()
            );
            Ok(())
        }
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        let key = String::from_utf8(body.to_vec()).ok()?;
        assert!(self.part != Part::JobKey, "cannot key {key}");
        Some(key)
    }

    fn completion_marker(&self, body: &[u8]) -> Option<spot_worker_consumer::ResultMarker> {
        assert!(
            self.part != Part::CompletionMarker,
            "cannot name the result of {}",
            String::from_utf8_lossy(body)
        );
        None
    }

    fn verify_completed(
        &self,
        _body: &[u8],
        result: &serde_json::Value,
    ) -> Result<(), HandlerError> {
        assert!(
            self.part != Part::VerifyCompleted,
            "cannot read the result {result}"
        );
        Ok(())
    }
}

// Issue 16, item 2: before the fix a panic outside the handler's future
// (job_key, verify_completed, the synchronous part of handle) ended the
// delivery's task unsettled, so the message came back after every
// visibility timeout and was never poisoned.
#[tokio::test(start_paused = true)]
async fn a_panic_anywhere_in_handler_code_is_a_failure_poisoned_after_max_failures() {
    // (where it panics, the poison record's last error, futures run)
    let rows = [
        (
            Part::JobKey,
            "handler panicked in job_key: cannot key job-1",
            0,
        ),
        (
            Part::CompletionMarker,
            "handler panicked in completion_marker: cannot name the result of job-1",
            0,
        ),
        (
            Part::VerifyCompleted,
            "handler panicked in verify_completed: cannot read the result 42",
            0,
        ),
        (
            Part::HandleStart,
            "handler panicked in handle (before returning its future): no future for delivery 2",
            0,
        ),
        (
            Part::Handle,
            "handler panicked in handle: mid-job on delivery 2",
            2,
        ),
    ];
    for (part, reason, futures_run) in rows {
        let (queue, poison) = queues();
        let id = queue.send("job-1", Duration::ZERO).await.unwrap();
        let store = InMemoryCheckpointStore::new();
        if part == Part::VerifyCompleted {
            write_completed(&store, "job-1", json!(42)).await;
        }
        let runs = Arc::new(AtomicU32::new(0));
        let handler = PanicsIn {
            part,
            runs: Arc::clone(&runs),
        };
        let config = ConsumerConfig {
            max_failures: 2,
            ..config()
        };
        let consumer = consumer(&queue, &poison, config).with_checkpoints(Arc::new(store));
        let running = Running::start(consumer, handler);
        running.wait_for("poisoned", |s| s.poisoned == 1).await;
        let stats = running.stop().await;
        assert_eq!(
            (stats.retried, stats.succeeded, stats.skipped_completed),
            (1, 0, 0),
            "{part:?}: {stats:?}"
        );
        assert!(queue.is_empty(), "{part:?}");
        let record: PoisonRecord = serde_json::from_str(&poison.messages()[0].body).unwrap();
        assert_eq!(record.original_id, id.as_str());
        assert_eq!(
            (record.dequeue_count, record.failures),
            (2, 2),
            "{part:?}: poisoned after 2 deliveries"
        );
        assert_eq!(
            record.last_error,
            format!("the handler failed 2 times (max_failures 2); last error: {reason}"),
        );
        assert_eq!(runs.load(Ordering::SeqCst), futures_run, "{part:?}");
    }
}
