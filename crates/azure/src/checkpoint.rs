//! [`BlobCheckpointStore`]: the [`CheckpointStore`] trait on Azure Blob
//! Storage, one small JSON blob per job, every write fenced with
//! `If-None-Match: *` (create) or `If-Match` (update).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::BlobContainerClient;
use azure_storage_blob::models::BlobClientUploadOptions;
use spot_worker_storage::{Checkpoint, CheckpointStore, ETag, StorageError, WritePrecondition};

use crate::error::{Operation, error_code, map_error};

/// Blob names may be up to 1024 characters.
const MAX_KEY_LEN: usize = 1024;

/// Checkpoints as blobs named by job key in one container. Build it with
/// [`AzureStorage::checkpoint_store`](crate::AzureStorage::checkpoint_store).
#[derive(Clone)]
pub struct BlobCheckpointStore {
    container: String,
    client: Arc<BlobContainerClient>,
}

impl fmt::Debug for BlobCheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("BlobCheckpointStore")
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

impl BlobCheckpointStore {
    pub(crate) fn new(container: String, client: BlobContainerClient) -> Self {
        BlobCheckpointStore {
            container,
            client: Arc::new(client),
        }
    }

    /// Creates the container if it does not exist yet.
    pub async fn create_container_if_missing(&self) -> Result<(), StorageError> {
        match self.client.create(None).await {
            Ok(_) => Ok(()),
            Err(e) if error_code(&e) == Some("ContainerAlreadyExists") => Ok(()),
            Err(e) => Err(map_error(e, Operation::Other(&self.container))),
        }
    }

    fn what(&self, key: &str) -> String {
        format!("checkpoint {}/{key}", self.container)
    }
}

fn validate_key(key: &str) -> Result<(), StorageError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.chars().any(char::is_control) {
        return Err(StorageError::InvalidArgument(format!(
            "checkpoint key must be 1 to {MAX_KEY_LEN} characters without control characters"
        )));
    }
    Ok(())
}

#[async_trait]
impl CheckpointStore for BlobCheckpointStore {
    async fn read(&self, key: &str) -> Result<Option<(Checkpoint, ETag)>, StorageError> {
        validate_key(key)?;
        let blob = self.client.blob_client(key);
        let downloaded = match blob.download(None).await {
            Ok(downloaded) => downloaded,
            Err(e) if error_code(&e) == Some("BlobNotFound") => return Ok(None),
            Err(e) => return Err(map_error(e, Operation::Other(&self.what(key)))),
        };
        let etag = downloaded
            .properties
            .etag
            .clone()
            .ok_or_else(|| StorageError::InvalidData {
                what: self.what(key),
                reason: "the download response has no ETag".to_owned(),
            })?;
        let bytes = downloaded
            .body
            .collect()
            .await
            .map_err(|e| map_error(e, Operation::Other(&self.what(key))))?;
        let checkpoint = Checkpoint::from_json_bytes(&bytes, &self.what(key))?;
        Ok(Some((checkpoint, ETag::new(etag.to_string()))))
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
    ) -> Result<ETag, StorageError> {
        validate_key(key)?;
        let json = checkpoint.to_json_bytes()?;
        let mut options = BlobClientUploadOptions {
            blob_content_type: Some("application/json".to_owned()),
            ..Default::default()
        };
        match precondition {
            WritePrecondition::Create => options.if_none_match = Some(Etag::from("*")),
            WritePrecondition::IfMatch(etag) => options.if_match = Some(Etag::from(etag.as_str())),
        }
        let content: RequestContent<Bytes, _> = Bytes::from(json).into();
        let uploaded = self
            .client
            .blob_client(key)
            .upload(content, Some(options))
            .await
            .map_err(|e| map_error(e, Operation::CheckpointWrite(key)))?;
        uploaded
            .etag
            .map(|etag| ETag::new(etag.to_string()))
            .ok_or_else(|| StorageError::InvalidData {
                what: self.what(key),
                reason: "the upload response has no ETag".to_owned(),
            })
    }
}
