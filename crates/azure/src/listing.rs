//! Listing a container's blobs: the operator's whole container
//! (`spot-worker checkpoints`, `status`), and a worker's one prefix (the
//! fleet's Spot sightings, [`CheckpointStore::list`](spot_worker_storage::CheckpointStore::list)),
//! every page of 5,000 names.

use futures_util::TryStreamExt as _;
use time::OffsetDateTime;

use azure_storage_blob::models::BlobContainerClientListBlobsOptions;
use spot_worker_storage::StorageError;

use crate::container::Container;
use crate::error::{Operation, error_code, map_error};

/// One blob as a listing shows it, without its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlob {
    /// The blob's name in its container.
    pub name: String,
    /// Its size in bytes.
    pub len: u64,
    /// When it was last written.
    pub last_modified: Option<OffsetDateTime>,
}

impl Container {
    /// Every blob whose name starts with `prefix`, in name order, all
    /// pages. A container that does not exist yet lists nothing.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<StoredBlob>, StorageError> {
        let what = self.what("listing of container");
        let options = BlobContainerClientListBlobsOptions {
            prefix: (!prefix.is_empty()).then(|| prefix.to_owned()),
            ..Default::default()
        };
        // Each page is one request; the deadline bounds each, so a large
        // container is not cut short by a deadline meant for one call.
        let mut pages = self
            .client
            .list_blobs(Some(options))
            .map_err(|e| map_error(e, Operation::Other(&what)))?
            .into_pages();
        let mut blobs = Vec::new();
        loop {
            let page = match self
                .bounded(&what, async {
                    match pages.try_next().await {
                        Ok(page) => Ok(page),
                        Err(e) if error_code(&e) == Some("ContainerNotFound") => Ok(None),
                        Err(e) => Err(map_error(e, Operation::Other(&what))),
                    }
                })
                .await?
            {
                Some(page) => page,
                None => return Ok(blobs),
            };
            let page = page
                .into_model()
                .map_err(|e| map_error(e, Operation::Other(&what)))?;
            blobs.extend(page.blob_items.into_iter().filter_map(|item| {
                let properties = item.properties.unwrap_or_default();
                Some(StoredBlob {
                    name: item.name?,
                    len: properties.content_length.unwrap_or(0),
                    last_modified: properties.last_modified,
                })
            }));
        }
    }
}
