//! [`Container`]: the blob container operations the checkpoint and result
//! stores share — create if missing, the write probe of `prepare`, and
//! downloading a small blob — so each is done one way only.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::BlobContainerClient;
use azure_storage_blob::models::BlobClientUploadOptions;
use spot_worker_storage::StorageError;

use crate::error::{Operation, bounded, error_code, map_error};

/// Where `prepare` writes its probe blobs. The leading dot keeps them apart
/// from job keys and result names in listings.
pub const PROBE_PREFIX: &str = ".spot-worker/probe-";

/// Blob names may be up to 1024 characters.
pub(crate) const MAX_BLOB_NAME_LEN: usize = 1024;

/// One container of the account, named for messages.
#[derive(Clone)]
pub(crate) struct Container {
    pub(crate) name: String,
    pub(crate) client: Arc<BlobContainerClient>,
    /// Bound of every call, retries included ([`RetryConfig::call_deadline`]).
    ///
    /// [`RetryConfig::call_deadline`]: crate::RetryConfig::call_deadline
    pub(crate) deadline: Duration,
}

impl fmt::Debug for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the name: the client's URL could carry a SAS.
        f.debug_struct("Container")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A blob as downloaded: its bytes and its ETag, if the service sent one.
pub(crate) struct Downloaded {
    pub(crate) bytes: Bytes,
    pub(crate) etag: Option<Etag>,
}

impl Container {
    pub(crate) fn new(name: String, client: BlobContainerClient, deadline: Duration) -> Self {
        Container {
            name,
            client: Arc::new(client),
            deadline,
        }
    }

    /// Runs `call` within this container's deadline (see [`bounded`]).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        bounded(self.deadline, what, call).await
    }

    /// Creates the container if it does not exist yet.
    pub(crate) async fn create_if_missing(&self) -> Result<(), StorageError> {
        let what = self.what("container");
        self.bounded(&what, async {
            match self.client.create(None).await {
                Ok(_) => Ok(()),
                Err(e) if error_code(&e) == Some("ContainerAlreadyExists") => Ok(()),
                Err(e) => Err(map_error(e, Operation::Other(&what))),
            }
        })
        .await
    }

    /// Creates the container if it is missing, then writes and deletes a
    /// probe blob with a random name: the write proves this worker may
    /// create blobs here (the permission a job needs), which neither
    /// creating nor reading the container would.
    ///
    /// A role may be allowed to write blobs but not to create containers:
    /// then a refused create is not the answer, the probe is. If the probe
    /// finds the container missing, the refused create is the error, so
    /// the caller learns that this worker may not create it.
    pub(crate) async fn prepare(&self) -> Result<(), StorageError> {
        let create_refused = match self.create_if_missing().await {
            Ok(()) => None,
            Err(refused @ StorageError::Refused { .. }) => Some(refused),
            Err(error) => return Err(error),
        };
        match (self.write_probe().await, create_refused) {
            (Err(StorageError::MissingContainer { .. }), Some(refused)) => Err(refused),
            (result, _) => result,
        }
    }

    /// Writes and deletes a probe blob with a random name.
    async fn write_probe(&self) -> Result<(), StorageError> {
        let probe = format!("{PROBE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let blob = self.client.blob_client(&probe);
        let content: RequestContent<Bytes, _> = Bytes::from_static(b"spot-worker probe").into();
        let options = BlobClientUploadOptions {
            // A fresh random name never exists; refusing to overwrite makes
            // sure a probe can never clobber anything.
            if_none_match: Some(Etag::from("*")),
            ..Default::default()
        };
        let written = format!("write probe {}/{probe}", self.name);
        self.bounded(&written, async {
            blob.upload(content, Some(options))
                .await
                .map_err(|e| map_error(e, Operation::Other(&written)))
        })
        .await?;
        let deleted = format!("delete of probe {}/{probe}", self.name);
        self.bounded(&deleted, async {
            blob.delete(None)
                .await
                .map_err(|e| map_error(e, Operation::Other(&deleted)))
        })
        .await?;
        Ok(())
    }

    /// Downloads blob `name`; `None` if it does not exist. `what` names it
    /// in errors.
    pub(crate) async fn download(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<Downloaded>, StorageError> {
        // The body streams after the response headers; the deadline covers
        // both, since a connection can stall in either.
        self.bounded(what, async {
            let downloaded = match self.client.blob_client(name).download(None).await {
                Ok(downloaded) => downloaded,
                Err(e) if error_code(&e) == Some("BlobNotFound") => return Ok(None),
                Err(e) => return Err(map_error(e, Operation::Other(what))),
            };
            let etag = downloaded.properties.etag.clone();
            let bytes = downloaded
                .body
                .collect()
                .await
                .map_err(|e| map_error(e, Operation::Other(what)))?;
            Ok(Some(Downloaded { bytes, etag }))
        })
        .await
    }

    /// Deletes blob `name`; one that does not exist counts as deleted.
    /// `what` names it in errors.
    pub(crate) async fn delete(&self, name: &str, what: &str) -> Result<(), StorageError> {
        self.bounded(what, async {
            match self.client.blob_client(name).delete(None).await {
                Ok(_) => Ok(()),
                Err(e) if error_code(&e) == Some("BlobNotFound") => Ok(()),
                Err(e) => Err(map_error(e, Operation::Other(what))),
            }
        })
        .await
    }

    /// Something in this container, for error messages.
    pub(crate) fn what(&self, kind: &str) -> String {
        format!("{kind} {}", self.name)
    }
}

/// Blob names this crate accepts: 1 to 1024 characters, none of them a
/// control character, and no `/`-separated segment `.` or `..`: URLs
/// resolve those, so `a/../b` would read or write blob `b` and `..` the
/// container itself. `kind` names the caller's notion of a name.
pub(crate) fn validate_blob_name(name: &str, kind: &str) -> Result<(), StorageError> {
    if name.is_empty() || name.len() > MAX_BLOB_NAME_LEN || name.chars().any(char::is_control) {
        return Err(StorageError::InvalidArgument(format!(
            "{kind} must be 1 to {MAX_BLOB_NAME_LEN} characters without control characters"
        )));
    }
    if name.split('/').any(|segment| matches!(segment, "." | "..")) {
        return Err(StorageError::InvalidArgument(format!(
            "{kind} {name:?} must not be or contain a path segment `.` or `..` \
             (URLs resolve them, so another blob would be addressed)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_with_dot_segments_are_refused() {
        for ok in [
            "j1",
            "j1.json",
            ".spot-worker/probe-1",
            "a..b",
            "..a",
            "a/.b",
        ] {
            assert!(validate_blob_name(ok, "name").is_ok(), "{ok}");
        }
        for bad in [".", "..", "a/..", "../a", "a/./b", "", "a\nb"] {
            let err = validate_blob_name(bad, "checkpoint key").unwrap_err();
            assert!(err.to_string().contains("checkpoint key"), "{bad}: {err}");
        }
    }
}
