//! [`BlobChunkStore`]: the chunks of large checkpoints as blobs under
//! `.spot-worker/chunks/` of the checkpoint container, so they live under
//! the same credentials and retention rule as the manifests naming them.
//! One Put Blob per chunk (a chunk is at most 4 MiB, one request), read
//! back into a buffer of exactly the length the manifest gives.

use std::num::NonZero;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::RequestContent;
use azure_storage_blob::models::{BlobClientDownloadOptions, BlobClientUploadOptions};
use spot_worker_storage::StorageError;
use spot_worker_storage::files::ChunkStore;

use crate::container::{Container, validate_blob_name};
use crate::error::{Operation, error_code, map_error};

/// Where chunks go in the checkpoint container.
pub const CHUNK_PREFIX: &str = ".spot-worker/chunks/";

/// The chunk store of a [`BlobCheckpointStore`](crate::BlobCheckpointStore).
#[derive(Clone, Debug)]
pub struct BlobChunkStore {
    container: Container,
}

impl BlobChunkStore {
    pub(crate) fn new(container: Container) -> Self {
        BlobChunkStore { container }
    }

    fn blob(&self, name: &str) -> Result<String, StorageError> {
        let blob = format!("{CHUNK_PREFIX}{name}");
        validate_blob_name(&blob, "chunk name")?;
        Ok(blob)
    }

    fn what(&self, blob: &str) -> String {
        format!("chunk {}/{blob}", self.container.name)
    }
}

fn one() -> NonZero<usize> {
    NonZero::<usize>::MIN
}

#[async_trait]
impl ChunkStore for BlobChunkStore {
    async fn put(&self, name: &str, chunk: Bytes) -> Result<(), StorageError> {
        let blob = self.blob(name)?;
        let what = self.what(&blob);
        let options = BlobClientUploadOptions {
            blob_content_type: Some("application/octet-stream".to_owned()),
            // One request whatever the size (a chunk is at most 4 MiB).
            parallel: Some(one()),
            partition_size: NonZero::new((chunk.len() as u64).max(1)),
            ..Default::default()
        };
        let content: RequestContent<Bytes, _> = chunk.into();
        self.container
            .bounded(&what, async {
                self.container
                    .client
                    .blob_client(&blob)
                    .upload(content, Some(options))
                    .await
                    .map(drop)
                    .map_err(|e| map_error(e, Operation::Other(&what)))
            })
            .await
    }

    async fn get(&self, name: &str, len: usize) -> Result<Option<Bytes>, StorageError> {
        let blob = self.blob(name)?;
        let what = self.what(&blob);
        if len == 0 {
            return self.get_empty(&blob, &what).await;
        }
        let mut buffer = vec![0u8; len];
        let options = BlobClientDownloadOptions {
            parallel: Some(one()),
            partition_size: NonZero::new(len.max(1)),
            ..Default::default()
        };
        let read = self
            .container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(&blob)
                    .download_into(&mut buffer, Some(options))
                    .await
                {
                    Ok(read) => Ok(Some(read.len)),
                    Err(e) if error_code(&e) == Some("BlobNotFound") => Ok(None),
                    // A blob longer than the buffer: not the chunk asked for.
                    Err(e) if matches!(e.kind(), azure_core::error::ErrorKind::Io) => {
                        Err(StorageError::InvalidData {
                            what: what.clone(),
                            reason: format!("longer than the {len} bytes expected ({e})"),
                        })
                    }
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await?;
        match read {
            None => Ok(None),
            Some(read) if read == len => Ok(Some(Bytes::from(buffer))),
            Some(read) => Err(StorageError::InvalidData {
                what,
                reason: format!("{read} bytes, not the {len} expected"),
            }),
        }
    }

    /// Set Blob Metadata (`touched`): a write, so it moves the blob's
    /// Last-Modified date, which the lifecycle rule's
    /// `daysAfterModificationGreaterThan` measures; the bytes stay where
    /// they are, and the worker's `w` permission covers it.
    async fn touch(&self, name: &str) -> Result<bool, StorageError> {
        let blob = self.blob(name)?;
        let what = self.what(&blob);
        let metadata = std::collections::HashMap::from([(
            "touched".to_owned(),
            "by-a-save-that-reuses-it".to_owned(),
        )]);
        self.container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(&blob)
                    .set_metadata(&metadata, None)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(e) if error_code(&e) == Some("BlobNotFound") => Ok(false),
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        let blob = self.blob(name)?;
        self.container.delete(&blob, &self.what(&blob)).await
    }
}

impl BlobChunkStore {
    /// An empty chunk: its properties say whether it is there and empty
    /// (a ranged download of an empty blob has no range to answer with).
    async fn get_empty(&self, blob: &str, what: &str) -> Result<Option<Bytes>, StorageError> {
        use azure_storage_blob::models::BlobClientGetPropertiesResultHeaders as _;
        self.container
            .bounded(what, async {
                match self
                    .container
                    .client
                    .blob_client(blob)
                    .get_properties(None)
                    .await
                {
                    Ok(properties) => match properties.content_length() {
                        Ok(Some(0)) => Ok(Some(Bytes::new())),
                        Ok(length) => Err(StorageError::InvalidData {
                            what: what.to_owned(),
                            reason: format!("{length:?} bytes, not the 0 expected"),
                        }),
                        Err(e) => Err(map_error(e, Operation::Other(what))),
                    },
                    Err(e) if e.http_status() == Some(azure_core::http::StatusCode::NotFound) => {
                        Ok(None)
                    }
                    Err(e) => Err(map_error(e, Operation::Other(what))),
                }
            })
            .await
    }
}
