//! [`BlobCheckpointStore`]: the [`CheckpointStore`] trait on Azure Blob
//! Storage, one small JSON blob per job, every write fenced with
//! `If-None-Match: *` (create) or `If-Match` (update). Writes through
//! [`JobCheckpoint`](spot_worker_storage::JobCheckpoint) carry a write stamp
//! in the document (`written_by`), which is how a handle recognises its own
//! retried write after a conflict.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::BlobContainerClient;
use azure_storage_blob::models::BlobClientUploadOptions;
use spot_worker_storage::{
    Checkpoint, CheckpointStore, ETag, StorageError, StoredCheckpoint, WritePrecondition,
};

use spot_worker_storage::files::ChunkStore;

use crate::chunks::BlobChunkStore;
use crate::container::{Container, validate_blob_name};
use crate::error::{Operation, map_error};

/// Checkpoints as blobs named by job key in one container. Build it with
/// [`AzureStorage::checkpoint_store`](crate::AzureStorage::checkpoint_store).
#[derive(Clone)]
pub struct BlobCheckpointStore {
    pub(crate) container: Container,
    chunks: Arc<BlobChunkStore>,
}

impl fmt::Debug for BlobCheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("BlobCheckpointStore")
            .field("container", &self.container.name)
            .finish_non_exhaustive()
    }
}

impl BlobCheckpointStore {
    pub(crate) fn new(container: String, client: BlobContainerClient, deadline: Duration) -> Self {
        let container = Container::new(container, client, deadline);
        BlobCheckpointStore {
            chunks: Arc::new(BlobChunkStore::new(container.clone())),
            container,
        }
    }

    /// Creates the container if it does not exist yet (without the write
    /// probe of [`CheckpointStore::prepare`]).
    pub async fn create_container_if_missing(&self) -> Result<(), StorageError> {
        self.container.create_if_missing().await
    }

    /// Every blob in the container, for operators (`spot-worker
    /// checkpoints`): job checkpoints, and under `.spot-worker/` the
    /// worker's own records (attempt records, write probes). Needs the
    /// list permission of [`StorageConfig::for_operator`](crate::StorageConfig::for_operator).
    pub async fn list(&self) -> Result<Vec<crate::StoredBlob>, StorageError> {
        self.container.list("").await
    }

    fn what(&self, key: &str) -> String {
        format!("checkpoint {}/{key}", self.container.name)
    }
}

fn validate_key(key: &str) -> Result<(), StorageError> {
    validate_blob_name(key, "checkpoint key")
}

#[async_trait]
impl CheckpointStore for BlobCheckpointStore {
    /// Creates the container if it is missing, then writes and deletes a
    /// probe blob `.spot-worker/probe-<random>` to prove write access.
    async fn prepare(&self) -> Result<(), StorageError> {
        self.container.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        validate_key(key)?;
        let what = self.what(key);
        let Some(downloaded) = self.container.download(key, &what).await? else {
            return Ok(None);
        };
        let etag = downloaded.etag.ok_or_else(|| StorageError::InvalidData {
            what: what.clone(),
            reason: "the download response has no ETag".to_owned(),
        })?;
        let (checkpoint, stamp) = Checkpoint::from_json_bytes_stamped(&downloaded.bytes, &what)?;
        Ok(Some(StoredCheckpoint {
            checkpoint,
            etag: ETag::new(etag.to_string()),
            stamp,
        }))
    }

    /// The stamp goes into the JSON document itself (`written_by`), so it is
    /// replaced atomically with the checkpoint by the same fenced upload.
    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        validate_key(key)?;
        let document = match stamp {
            Some(stamp) => checkpoint.to_json_bytes_stamped(stamp)?,
            None => checkpoint.to_json_bytes()?,
        };
        self.upload(key, document, precondition).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        validate_key(key)?;
        self.container.delete(key, &self.what(key)).await
    }

    /// The blobs named `prefix…`, every page (5,000 names a request).
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let blobs = self.container.list(prefix).await?;
        Ok(blobs.into_iter().map(|blob| blob.name).collect())
    }

    /// The container's `.spot-worker/chunks/` ([`BlobChunkStore`]).
    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        Some(Arc::clone(&self.chunks) as Arc<dyn ChunkStore>)
    }
}

impl BlobCheckpointStore {
    /// One upload of `json`, fenced by `precondition`, within the call
    /// deadline.
    async fn upload(
        &self,
        key: &str,
        json: Vec<u8>,
        precondition: WritePrecondition,
    ) -> Result<ETag, StorageError> {
        let mut options = BlobClientUploadOptions {
            blob_content_type: Some("application/json".to_owned()),
            ..Default::default()
        };
        match precondition {
            WritePrecondition::Create => options.if_none_match = Some(Etag::from("*")),
            WritePrecondition::IfMatch(etag) => options.if_match = Some(Etag::from(etag.as_str())),
        }
        let what = self.what(key);
        let content: RequestContent<Bytes, _> = Bytes::from(json).into();
        let upload = async {
            self.container
                .client
                .blob_client(key)
                .upload(content, Some(options))
                .await
                .map_err(|e| map_error(e, Operation::ConditionalWrite(key)))
        };
        let uploaded = self.container.bounded(&what, upload).await?;
        uploaded
            .etag
            .map(|etag| ETag::new(etag.to_string()))
            .ok_or_else(|| StorageError::InvalidData {
                what,
                reason: "the upload response has no ETag".to_owned(),
            })
    }
}
