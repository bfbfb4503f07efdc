//! The one home of what the worker's decorators pass through unchanged.
//!
//! The worker wraps its handler and its checkpoint store in decorators
//! (metrics, busy time, the pod's activity), each of which acts on one
//! call and forwards the rest. A decorator that forgot to forward one
//! would change the worker silently (a handler that loses its job key
//! loses the completed-job check), so the forwarding is written here once
//! and each decorator writes only what it adds.

/// Inside `impl MessageHandler for Decorator<H>` (a decorator whose
/// wrapped handler is `self.inner`): the methods that forward what the
/// wrapped handler knows about its jobs (its job key, completion marker
/// and completed-job check), or the consumer would lose them.
macro_rules! forward_job_knowledge {
    () => {
        fn job_key(&self, body: &[u8]) -> Option<String> {
            self.inner.job_key(body)
        }

        fn completion_marker(&self, body: &[u8]) -> Option<spot_worker_consumer::ResultMarker> {
            self.inner.completion_marker(body)
        }

        fn verify_completed(
            &self,
            body: &[u8],
            result: &serde_json::Value,
        ) -> Result<(), spot_worker_consumer::HandlerError> {
            self.inner.verify_completed(body, result)
        }
    };
}

/// `impl CheckpointStore for $store` (a decorator whose wrapped store is
/// `self.inner: Arc<dyn CheckpointStore>`) that forwards every call and
/// tells the store's own `fn written(&self, key: &str, result:
/// &Result<ETag, StorageError>, started: std::time::Instant)` of each
/// write once it has answered: the one call the worker's decorators act on
/// (a save's outcome and latency, a held job's save).
macro_rules! checkpoint_writes_decorator {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl spot_worker_storage::CheckpointStore for $store {
            async fn prepare(&self) -> Result<(), spot_worker_storage::StorageError> {
                self.inner.prepare().await
            }

            async fn read(
                &self,
                key: &str,
            ) -> Result<
                Option<spot_worker_storage::StoredCheckpoint>,
                spot_worker_storage::StorageError,
            > {
                self.inner.read(key).await
            }

            async fn write(
                &self,
                key: &str,
                checkpoint: &spot_worker_storage::Checkpoint,
                precondition: spot_worker_storage::WritePrecondition,
                stamp: Option<&str>,
            ) -> Result<spot_worker_storage::ETag, spot_worker_storage::StorageError> {
                let started = std::time::Instant::now();
                let result = self.inner.write(key, checkpoint, precondition, stamp).await;
                self.written(key, &result, started);
                result
            }

            async fn delete(&self, key: &str) -> Result<(), spot_worker_storage::StorageError> {
                self.inner.delete(key).await
            }

            async fn list(
                &self,
                prefix: &str,
            ) -> Result<Vec<String>, spot_worker_storage::StorageError> {
                self.inner.list(prefix).await
            }

            fn chunks(&self) -> Option<std::sync::Arc<dyn spot_worker_storage::files::ChunkStore>> {
                self.inner.chunks()
            }
        }
    };
}

pub(crate) use {checkpoint_writes_decorator, forward_job_knowledge};
