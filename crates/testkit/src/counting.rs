//! [`CountingStore`]: any [`CheckpointStore`] with a count of the requests
//! made to it, by kind (reads, creating and updating writes, deletes): what
//! a test asserts per job, and what a benchmark sets against the fewest the
//! protocol allows. Those on the fleet's interruption counts are counted
//! apart ([`StoreCalls::fleet`]): they are per worker-hour, not per job. [`CountingResults`] does the same for a [`ResultStore`].
//! The queue's counterpart is the record of
//! [`FaultyQueue`](crate::faulty::FaultyQueue).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use spot_worker_testkit::counting::CountingStore;
//! use spot_worker_storage::{Checkpoint, CheckpointStore, InMemoryCheckpointStore, WritePrecondition};
//!
//! let store = CountingStore::new(InMemoryCheckpointStore::new());
//! assert!(store.read("job").await.unwrap().is_none());
//! let done = Checkpoint::Completed { result: 42.into() };
//! store.write("job", &done, WritePrecondition::Create, None).await.unwrap();
//! assert_eq!((store.calls().reads(), store.calls().creates()), (1, 1));
//! # });
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use spot_worker_storage::files::ChunkStore;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, FleetLedger, PutOutcome, ResultStore, StorageError,
    StoredCheckpoint, WritePrecondition, async_trait,
};

/// The counts of one [`CountingStore`] (shared by clones). Every request is
/// counted when it is made, failed ones included.
#[derive(Debug, Default)]
pub struct StoreCalls {
    prepares: AtomicU64,
    reads: AtomicU64,
    creates: AtomicU64,
    updates: AtomicU64,
    deletes: AtomicU64,
    keys_read: Mutex<Vec<String>>,
    fleet: AtomicU64,
    chunk_puts: AtomicU64,
    chunk_bytes: AtomicU64,
    chunk_gets: AtomicU64,
    chunk_get_largest: AtomicU64,
    chunk_deletes: AtomicU64,
    chunk_touches: AtomicU64,
}

impl StoreCalls {
    /// `prepare` calls (container creation).
    pub fn prepares(&self) -> u64 {
        self.prepares.load(Ordering::SeqCst)
    }

    /// Reads.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Writes that create the checkpoint ([`WritePrecondition::Create`]).
    pub fn creates(&self) -> u64 {
        self.creates.load(Ordering::SeqCst)
    }

    /// Writes that update an existing checkpoint
    /// ([`WritePrecondition::IfMatch`]).
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::SeqCst)
    }

    /// Writes of either kind.
    pub fn writes(&self) -> u64 {
        self.creates() + self.updates()
    }

    /// Deletes.
    pub fn deletes(&self) -> u64 {
        self.deletes.load(Ordering::SeqCst)
    }

    /// Requests on the fleet's interruption counts
    /// ([`FleetLedger::PREFIX`]), counted apart from all the others: a worker
    /// makes them per hour it runs, not per job.
    pub fn fleet(&self) -> u64 {
        self.fleet.load(Ordering::SeqCst)
    }

    /// Chunks of checkpoint files sent ([`ChunkStore::put`]).
    pub fn chunk_puts(&self) -> u64 {
        self.chunk_puts.load(Ordering::SeqCst)
    }

    /// Bytes sent in them.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes.load(Ordering::SeqCst)
    }

    /// Chunks read.
    pub fn chunk_gets(&self) -> u64 {
        self.chunk_gets.load(Ordering::SeqCst)
    }

    /// The largest length a chunk read asked for (what a reader may
    /// allocate for it).
    pub fn chunk_get_largest(&self) -> u64 {
        self.chunk_get_largest.load(Ordering::SeqCst)
    }

    /// Chunks deleted.
    pub fn chunk_deletes(&self) -> u64 {
        self.chunk_deletes.load(Ordering::SeqCst)
    }

    /// Chunks touched (their date refreshed, see `ChunkStore::touch`).
    pub fn chunk_touches(&self) -> u64 {
        self.chunk_touches.load(Ordering::SeqCst)
    }

    /// The keys read, in order.
    pub fn keys_read(&self) -> Vec<String> {
        self.keys_read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// `S`, counting every request made to it.
#[derive(Clone, Debug)]
pub struct CountingStore<S> {
    inner: S,
    calls: Arc<StoreCalls>,
}

impl<S: CheckpointStore> CountingStore<S> {
    /// `inner`, with every count at zero.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            calls: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn calls(&self) -> &Arc<StoreCalls> {
        &self.calls
    }

    /// The store itself, for requests that must not be counted (another
    /// holder of a job, in a test).
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: CheckpointStore> CheckpointStore for CountingStore<S> {
    async fn prepare(&self) -> Result<(), StorageError> {
        StoreCalls::count(&self.calls.prepares);
        self.inner.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        if key.starts_with(FleetLedger::PREFIX) {
            StoreCalls::count(&self.calls.fleet);
            return self.inner.read(key).await;
        }
        StoreCalls::count(&self.calls.reads);
        self.calls
            .keys_read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(key.to_owned());
        self.inner.read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        if key.starts_with(FleetLedger::PREFIX) {
            StoreCalls::count(&self.calls.fleet);
            return self.inner.write(key, checkpoint, precondition, stamp).await;
        }
        StoreCalls::count(match precondition {
            WritePrecondition::Create => &self.calls.creates,
            WritePrecondition::IfMatch(_) => &self.calls.updates,
        });
        self.inner.write(key, checkpoint, precondition, stamp).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        StoreCalls::count(if key.starts_with(FleetLedger::PREFIX) {
            &self.calls.fleet
        } else {
            &self.calls.deletes
        });
        self.inner.delete(key).await
    }

    /// Only the fleet's records are listed: a fleet call.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        StoreCalls::count(&self.calls.fleet);
        self.inner.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        let inner = self.inner.chunks()?;
        Some(Arc::new(CountingChunks {
            inner,
            calls: Arc::clone(&self.calls),
        }))
    }
}

/// The chunk store of a [`CountingStore`], counting into its calls.
struct CountingChunks {
    inner: Arc<dyn ChunkStore>,
    calls: Arc<StoreCalls>,
}

#[async_trait]
impl ChunkStore for CountingChunks {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        StoreCalls::count(&self.calls.chunk_puts);
        self.calls
            .chunk_bytes
            .fetch_add(chunk.len() as u64, Ordering::SeqCst);
        self.inner.put(name, chunk).await
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        StoreCalls::count(&self.calls.chunk_gets);
        self.calls
            .chunk_get_largest
            .fetch_max(len as u64, Ordering::SeqCst);
        self.inner.get(name, len).await
    }

    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        StoreCalls::count(&self.calls.chunk_touches);
        self.inner.touch(name).await
    }

    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        StoreCalls::count(&self.calls.chunk_deletes);
        self.inner.delete(name).await
    }
}

/// The counts of one [`CountingResults`] (shared by clones).
#[derive(Debug, Default)]
pub struct ResultCalls {
    puts: AtomicU64,
    gets: AtomicU64,
}

impl ResultCalls {
    /// Create-only writes (`put_new`): one Put Blob each, and a Get Blob
    /// more on Azure when the result exists already.
    pub fn puts(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }

    /// Reads (`get`).
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }
}

/// `R`, counting every write and read made to it (`prepare` is not
/// counted: once per worker, not per job).
#[derive(Clone, Debug)]
pub struct CountingResults<R> {
    inner: R,
    calls: Arc<ResultCalls>,
}

impl<R: ResultStore> CountingResults<R> {
    /// `inner`, with every count at zero.
    pub fn new(inner: R) -> Self {
        CountingResults {
            inner,
            calls: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn calls(&self) -> &Arc<ResultCalls> {
        &self.calls
    }

    /// The store itself, for requests that must not be counted.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

#[async_trait]
impl<R: ResultStore> ResultStore for CountingResults<R> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.inner.prepare().await
    }

    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        StoreCalls::count(&self.calls.puts);
        self.inner.put_new(name, body).await
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        StoreCalls::count(&self.calls.gets);
        self.inner.get(name).await
    }

    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        StoreCalls::count(&self.calls.puts);
        self.inner.put_new_file(name, file, len).await
    }
}
