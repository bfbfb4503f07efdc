//! [`LeaseStore`] on Blob Storage: a lease is Lease Blob on a small blob of
//! the checkpoint container named after it, created when first needed.
//! The service grants 15 to 60 s, lets only the lease id renew or release
//! it, and frees it when it runs out unrenewed
//! (<https://learn.microsoft.com/rest/api/storageservices/lease-blob>).

use std::time::Duration;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseResultHeaders as _, BlobClientUploadOptions,
};
use spot_worker_storage::{LeaseId, LeaseStore, MAX_LEASE, MIN_LEASE, StorageError};

use crate::checkpoint::BlobCheckpointStore;
use crate::container::validate_blob_name;
use crate::error::{Operation, error_code, map_error};

impl BlobCheckpointStore {
    /// Creates the blob a lease is taken on, if it is missing.
    async fn create_lease_blob(&self, name: &str) -> Result<(), StorageError> {
        let what = self.container.what(&format!("lease blob {name} of"));
        let options = BlobClientUploadOptions {
            if_none_match: Some(Etag::from("*")),
            ..Default::default()
        };
        let content: RequestContent<Bytes, _> = Bytes::from_static(b"spot-worker lease").into();
        self.container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(name)
                    .upload(content, Some(options))
                    .await
                {
                    Ok(_) => Ok(()),
                    // There already (a leased one answers 412 too).
                    Err(e)
                        if matches!(
                            error_code(&e),
                            Some("BlobAlreadyExists" | "ConditionNotMet" | "LeaseIdMissing")
                        ) =>
                    {
                        Ok(())
                    }
                    Err(e)
                        if e.http_status()
                            .is_some_and(|s| u16::from(s) == 409 || u16::from(s) == 412) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await
    }
}

#[async_trait]
impl LeaseStore for BlobCheckpointStore {
    async fn acquire(
        &self,
        name: &str,
        duration: Duration,
    ) -> Result<Option<LeaseId>, StorageError> {
        validate_blob_name(name, "lease name")?;
        if !(MIN_LEASE..=MAX_LEASE).contains(&duration) {
            return Err(StorageError::InvalidArgument(format!(
                "a lease lasts {MIN_LEASE:?} to {MAX_LEASE:?}, not {duration:?}"
            )));
        }
        self.create_lease_blob(name).await?;
        let what = self.container.what(&format!("lease on {name} in"));
        let seconds = i32::try_from(duration.as_secs()).unwrap_or(60);
        self.container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(name)
                    .acquire_lease(seconds, None)
                    .await
                {
                    Ok(response) => {
                        let id = response
                            .lease_id()
                            .map_err(|e| map_error(e, Operation::Other(&what)))?
                            .ok_or_else(|| StorageError::InvalidData {
                                what: what.clone(),
                                reason: "the response names no lease id".to_owned(),
                            })?;
                        Ok(Some(LeaseId::new(id)))
                    }
                    Err(e) if error_code(&e) == Some("LeaseAlreadyPresent") => Ok(None),
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await
    }

    async fn renew(&self, name: &str, lease: &LeaseId) -> Result<bool, StorageError> {
        validate_blob_name(name, "lease name")?;
        let what = self.container.what(&format!("lease on {name} in"));
        self.container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(name)
                    .renew_lease(lease.as_str().to_owned(), None)
                    .await
                {
                    Ok(_) => Ok(true),
                    // Another holder's now, or the blob is gone.
                    Err(e)
                        if e.http_status()
                            .is_some_and(|s| matches!(u16::from(s), 404 | 409)) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await
    }

    async fn release(&self, name: &str, lease: &LeaseId) -> Result<(), StorageError> {
        validate_blob_name(name, "lease name")?;
        let what = self.container.what(&format!("lease on {name} in"));
        self.container
            .bounded(&what, async {
                match self
                    .container
                    .client
                    .blob_client(name)
                    .release_lease(lease.as_str().to_owned(), None)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e)
                        if e.http_status()
                            .is_some_and(|s| matches!(u16::from(s), 404 | 409)) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await
    }
}
