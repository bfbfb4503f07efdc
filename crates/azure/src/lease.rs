//! [`LeaseStore`] on Blob Storage: a lease is Lease Blob on a small blob of
//! the checkpoint container named after it, created when first needed.
//! The service grants 15 to 60 s, lets only the lease id renew or release
//! it, and frees it when it runs out unrenewed
//! (<https://learn.microsoft.com/rest/api/storageservices/lease-blob>).

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::BlobClient;
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
        // There already (a leased one answers 412 too).
        let there_already = |e: &azure_core::Error| {
            matches!(
                error_code(e),
                Some("BlobAlreadyExists" | "ConditionNotMet" | "LeaseIdMissing")
            ) || e
                .http_status()
                .is_some_and(|s| u16::from(s) == 409 || u16::from(s) == 412)
        };
        self.blob_call(name, &what, there_already, |blob| async move {
            blob.upload(content, Some(options)).await
        })
        .await
        .map(|_| ())
    }

    /// `call` on the blob of the lease `name`, within the call deadline:
    /// `None` if the lease is another holder's now or its blob is gone
    /// (404 or 409).
    async fn on_lease<T, F>(
        &self,
        name: &str,
        call: impl FnOnce(BlobClient) -> F,
    ) -> Result<Option<T>, StorageError>
    where
        F: Future<Output = azure_core::Result<T>>,
    {
        validate_blob_name(name, "lease name")?;
        let what = self.container.what(&format!("lease on {name} in"));
        let gone = |e: &azure_core::Error| {
            e.http_status()
                .is_some_and(|s| matches!(u16::from(s), 404 | 409))
        };
        self.blob_call(name, &what, gone, call).await
    }

    /// `call` on the blob `name`, within the call deadline, `what` naming
    /// it in errors: `None` if it fails as `expected` says is no error
    /// (the lease or blob is not as asked, which the caller answers).
    async fn blob_call<T, F>(
        &self,
        name: &str,
        what: &str,
        expected: impl Fn(&azure_core::Error) -> bool,
        call: impl FnOnce(BlobClient) -> F,
    ) -> Result<Option<T>, StorageError>
    where
        F: Future<Output = azure_core::Result<T>>,
    {
        let blob = self.container.client.blob_client(name);
        self.container
            .bounded(what, async {
                match call(blob).await {
                    Ok(answer) => Ok(Some(answer)),
                    Err(e) if expected(&e) => Ok(None),
                    Err(e) => Err(map_error(e, Operation::Other(what))),
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
        let held_by_another = |e: &azure_core::Error| error_code(e) == Some("LeaseAlreadyPresent");
        let Some(response) = self
            .blob_call(name, &what, held_by_another, |blob| async move {
                blob.acquire_lease(seconds, None).await
            })
            .await?
        else {
            return Ok(None);
        };
        let id = response
            .lease_id()
            .map_err(|e| map_error(e, Operation::Other(&what)))?
            .ok_or_else(|| StorageError::InvalidData {
                what: what.clone(),
                reason: "the response names no lease id".to_owned(),
            })?;
        Ok(Some(LeaseId::new(id)))
    }

    async fn renew(&self, name: &str, lease: &LeaseId) -> Result<bool, StorageError> {
        let renewed = self
            .on_lease(name, |blob| async move {
                blob.renew_lease(lease.as_str().to_owned(), None).await
            })
            .await?;
        Ok(renewed.is_some())
    }

    async fn release(&self, name: &str, lease: &LeaseId) -> Result<(), StorageError> {
        self.on_lease(name, |blob| async move {
            blob.release_lease(lease.as_str().to_owned(), None).await
        })
        .await
        .map(|_| ())
    }
}
