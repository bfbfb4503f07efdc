//! [`Faulty`]: one fault-injecting layer for every store trait (queue,
//! checkpoint documents, checkpoint chunks, results, leases), each call
//! decided by the run's [`FaultPlan`]: applied, failed before it applies,
//! applied with its answer lost, or delayed; and every invariant checked
//! after it applies.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spot_worker_storage::files::ChunkStore;
use spot_worker_storage::{
    BlockBlobs, Checkpoint, CheckpointStore, ETag, LeaseId, LeaseStore, MessageId, MessageQueue,
    PopReceipt, PutOutcome, QueueMessage, ResultStore, StorageError, StoredCheckpoint,
    VisibleMessage, WritePrecondition, async_trait,
};

use super::plan::{Fault, FaultPlan};

/// `S` with every call decided by `plan`; `label` names the store in the
/// trace. Clones share the plan.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    plan: FaultPlan,
    label: String,
}

impl<S> Faulty<S> {
    /// `inner`, faulted by `plan`.
    pub fn new(inner: S, plan: &FaultPlan, label: impl Into<String>) -> Self {
        Faulty {
            inner,
            plan: plan.clone(),
            label: label.into(),
        }
    }

    /// The store beneath, without faults (for a check's read).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Runs `call` (not yet started) as the plan decides for `op`.
    async fn call<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let what = format!("{} {op}", self.label);
        match self.plan.decide(&what) {
            Fault::FailBefore => Err(unavailable(&what, "not applied")),
            Fault::LoseAnswer => {
                let _ = call.await;
                self.plan.after_step();
                Err(unavailable(&what, "applied, answer lost"))
            }
            Fault::Delay(delay) => {
                tokio::time::sleep(delay).await;
                let answer = call.await;
                self.plan.after_step();
                answer
            }
            Fault::None => {
                let answer = call.await;
                self.plan.after_step();
                answer
            }
        }
    }
}

fn unavailable(what: &str, how: &str) -> StorageError {
    StorageError::Unavailable {
        message: format!("simulated fault: {what} ({how})"),
    }
}

#[async_trait]
impl<Q: MessageQueue> MessageQueue for Faulty<Q> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn receive(
        &self,
        max: u8,
        visibility: Duration,
    ) -> Result<Vec<QueueMessage>, StorageError> {
        self.call("receive", self.inner.receive(max, visibility))
            .await
    }

    async fn update_visibility(
        &self,
        id: &MessageId,
        receipt: &PopReceipt,
        visibility: Duration,
    ) -> Result<PopReceipt, StorageError> {
        let op = format!("update_visibility {}s", visibility.as_secs());
        self.call(&op, self.inner.update_visibility(id, receipt, visibility))
            .await
    }

    async fn delete(&self, id: &MessageId, receipt: &PopReceipt) -> Result<(), StorageError> {
        self.call("delete", self.inner.delete(id, receipt)).await
    }

    async fn send(&self, body: &str, delay: Duration) -> Result<MessageId, StorageError> {
        self.call("send", self.inner.send(body, delay)).await
    }

    async fn peek(&self, max: u8) -> Result<Vec<VisibleMessage>, StorageError> {
        self.call("peek", self.inner.peek(max)).await
    }
}

#[async_trait]
impl<C: CheckpointStore> CheckpointStore for Faulty<C> {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.call(&format!("read {key}"), self.inner.read(key))
            .await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        let op = format!("write {key}");
        self.call(&op, self.inner.write(key, checkpoint, precondition, stamp))
            .await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.call(&format!("delete {key}"), self.inner.delete(key))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.call(&format!("list {prefix}"), self.inner.list(prefix))
            .await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        let chunks = self.inner.chunks()?;
        Some(Arc::new(Faulty::new(
            chunks,
            &self.plan,
            format!("{} chunks", self.label),
        )))
    }
}

#[async_trait]
impl ChunkStore for Faulty<Arc<dyn ChunkStore>> {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        self.call(&format!("put {}", short(name)), self.inner.put(name, chunk))
            .await
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        self.call(&format!("get {}", short(name)), self.inner.get(name, len))
            .await
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        self.call(&format!("touch {}", short(name)), self.inner.touch(name))
            .await
    }

    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        self.call(&format!("delete {}", short(name)), self.inner.delete(name))
            .await
    }
}

/// A chunk's name in the trace: the start of its content's hash. The
/// save's generation in the name is random per run (the library draws
/// it), so the trace leaves it out and stays the same on every replay.
fn short(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.get(..8).unwrap_or(last)
}

#[async_trait]
impl<R: ResultStore> ResultStore for Faulty<R> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        self.call(&format!("put_new {name}"), self.inner.put_new(name, body))
            .await
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.call(&format!("get {name}"), self.inner.get(name))
            .await
    }
}

#[async_trait]
impl<L: LeaseStore> LeaseStore for Faulty<L> {
    async fn acquire(
        &self,
        name: &str,
        duration: Duration,
    ) -> Result<Option<LeaseId>, StorageError> {
        self.call(
            &format!("acquire {name}"),
            self.inner.acquire(name, duration),
        )
        .await
    }

    async fn renew(&self, name: &str, lease: &LeaseId) -> Result<bool, StorageError> {
        self.call(&format!("renew {name}"), self.inner.renew(name, lease))
            .await
    }

    async fn release(&self, name: &str, lease: &LeaseId) -> Result<(), StorageError> {
        self.call(&format!("release {name}"), self.inner.release(name, lease))
            .await
    }
}

/// Every block call yields first, so two uploads under way interleave
/// call by call (on the run's one thread, in an order the seed fixes).
#[async_trait]
impl<B: BlockBlobs> BlockBlobs for Faulty<B> {
    fn container(&self) -> &str {
        self.inner.container()
    }

    async fn prepare_container(&self) -> Result<(), StorageError> {
        self.inner.prepare_container().await
    }

    fn block_size(&self, len: u64) -> u64 {
        self.inner.block_size(len)
    }

    async fn put_blob_new(&self, name: &str, body: &[u8]) -> Result<(), StorageError> {
        tokio::task::yield_now().await;
        let op = format!("put_blob_new {name}");
        self.call(&op, self.inner.put_blob_new(name, body)).await
    }

    async fn stage_block(&self, name: &str, id: &str, block: &[u8]) -> Result<(), StorageError> {
        tokio::task::yield_now().await;
        // The block's index: the upload's prefix is random per run.
        let index = id.rsplit('-').next().unwrap_or(id);
        let op = format!("stage_block {name} {index}");
        self.call(&op, self.inner.stage_block(name, id, block))
            .await
    }

    async fn commit_blocks_new(&self, name: &str, ids: &[String]) -> Result<(), StorageError> {
        tokio::task::yield_now().await;
        let op = format!("commit_blocks_new {name} ({} blocks)", ids.len());
        self.call(&op, self.inner.commit_blocks_new(name, ids))
            .await
    }

    async fn get_blob(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        tokio::task::yield_now().await;
        self.call(&format!("get {name}"), self.inner.get_blob(name))
            .await
    }
}
