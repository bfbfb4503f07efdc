//! [`BlobResultStore`]: the [`ResultStore`] trait on Azure Blob Storage. Each
//! result is a blob written with `If-None-Match: *`, so the first writer wins
//! and a later writer learns whether it agrees (same bytes) or conflicts.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::BlobContainerClient;
use azure_storage_blob::models::BlobClientUploadOptions;
use spot_worker_storage::{PutOutcome, ResultStore, StorageError};

use crate::container::{Container, validate_blob_name};
use crate::error::{Operation, map_error};

mod blocks;

/// Create-only results as blobs in one container. Build it with
/// [`AzureStorage::result_store`](crate::AzureStorage::result_store).
#[derive(Clone)]
pub struct BlobResultStore {
    pub(crate) container: Container,
    /// Blocks staged at once by [`ResultStore::put_new_file`].
    pub(crate) concurrency: usize,
}

impl fmt::Debug for BlobResultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("BlobResultStore")
            .field("container", &self.container.name)
            .finish_non_exhaustive()
    }
}

impl BlobResultStore {
    pub(crate) fn new(container: String, client: BlobContainerClient, deadline: Duration) -> Self {
        BlobResultStore {
            container: Container::new(container, client, deadline),
            concurrency: 8,
        }
    }

    /// Stages up to `concurrency` blocks at once when a large result is
    /// stored from its file (default 8; the bytes held stay under 16 MiB).
    pub fn with_transfer_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    pub(crate) fn what(&self, name: &str) -> String {
        format!("result {}/{name}", self.container.name)
    }

    /// Deletes blob `name`; one that does not exist counts as deleted. For
    /// operators only (`spot-worker poison requeue` removes a claim check
    /// once its original is back on the queue): results are otherwise
    /// never deleted.
    pub async fn delete(&self, name: &str) -> Result<(), StorageError> {
        validate_blob_name(name, "result name")?;
        self.container.delete(name, &self.what(name)).await
    }

    /// One create-only upload; `Conflict` if the blob exists.
    async fn create(&self, name: &str, body: &[u8]) -> Result<(), StorageError> {
        let options = BlobClientUploadOptions {
            if_none_match: Some(Etag::from("*")),
            blob_content_type: Some(content_type(name).to_owned()),
            ..Default::default()
        };
        let content: RequestContent<Bytes, _> = Bytes::copy_from_slice(body).into();
        let upload = async {
            self.container
                .client
                .blob_client(name)
                .upload(content, Some(options))
                .await
                .map(drop)
                .map_err(|e| map_error(e, Operation::ConditionalWrite(name)))
        };
        self.container.bounded(&self.what(name), upload).await
    }
}

/// Results are usually JSON documents; anything else is stored as bytes.
pub(crate) fn content_type(name: &str) -> &'static str {
    if name.ends_with(".json") {
        "application/json"
    } else {
        "application/octet-stream"
    }
}

#[async_trait]
impl ResultStore for BlobResultStore {
    fn name(&self) -> &str {
        &self.container.name
    }

    /// Creates the container if it is missing, then writes and deletes a
    /// probe blob `.spot-worker/probe-<random>` to prove write access.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.container.prepare().await
    }

    /// Uploads with `If-None-Match: *`; if the blob exists (409 or 412),
    /// reads it back and compares.
    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        validate_blob_name(name, "result name")?;
        spot_worker_storage::result_blocks::settle_create_only(
            name,
            || self.create(name, body),
            || async { Ok(self.get(name).await?.map(|stored| stored == body)) },
        )
        .await
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        validate_blob_name(name, "result name")?;
        let downloaded = self.container.download(name, &self.what(name)).await?;
        Ok(downloaded.map(|blob| blob.bytes.to_vec()))
    }

    /// One Put Blob for a result of one block or less; a larger one is
    /// streamed in blocks (see `result/blocks.rs`).
    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        validate_blob_name(name, "result name")?;
        if len <= blocks::BLOCK {
            let body = spot_worker_storage::read_whole(file, len).await?;
            return self.put_new(name, &body).await;
        }
        self.put_new_in_blocks(name, file, len).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_results_are_labelled_as_json() {
        assert_eq!(content_type("j1.json"), "application/json");
        assert_eq!(content_type("j1.bin"), "application/octet-stream");
    }
}
