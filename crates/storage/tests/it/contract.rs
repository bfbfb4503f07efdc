//! The in-memory stores against the storage contracts every backend must
//! meet (`spot_worker_testkit::contract`; the blob stores run the same
//! contracts on a real Azurite in `spot-worker-azure`'s tests).

use std::sync::Arc;

use spot_worker_storage::{InMemoryCheckpointStore, InMemoryResultStore, ResultStore};
use spot_worker_testkit::contract;

#[tokio::test]
async fn the_in_memory_checkpoint_store_meets_the_contract() {
    contract::checkpoint_store(Arc::new(InMemoryCheckpointStore::new())).await;
}

#[tokio::test]
async fn the_in_memory_result_store_meets_the_contract() {
    let store = InMemoryResultStore::new("results");
    assert_eq!(ResultStore::name(&store), "results");
    // A clone shares the results: another worker's handle on the store.
    contract::result_store(&store, &store.clone()).await;
    assert_eq!(store.names(), ["batch/7/empty", "j1.json"]);
}

#[tokio::test]
async fn the_in_memory_chunk_store_meets_the_contract() {
    contract::chunk_store(&spot_worker_storage::InMemoryChunkStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_checkpoint_files_meet_the_contract() {
    contract::checkpoint_files(Arc::new(InMemoryCheckpointStore::new())).await;
}
