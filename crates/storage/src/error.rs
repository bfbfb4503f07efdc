//! The one error type every storage operation returns, so the consumer can
//! decide between "retry later", "lease lost" and "give up" without knowing
//! which backend produced it.

use crate::message_id::MessageId;

/// What went wrong talking to a queue or a checkpoint store.
///
/// Backends must never put secrets (account keys, SAS signatures) into the
/// messages carried here: they are logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The message's pop receipt no longer matches: another consumer received
    /// it after our visibility timeout ran out, or it was deleted. Whatever we
    /// were doing with it must stop without writing anything further.
    #[error("lease on message {message_id} was lost: its pop receipt no longer matches")]
    LeaseLost {
        /// The message whose lease was lost.
        message_id: MessageId,
    },
    /// A conditional write lost to another writer: a checkpoint's ETag
    /// precondition failed (someone else wrote newer progress, or created it
    /// first), or a create-only result already exists with different
    /// content. The job must stop.
    #[error("{key} was written by another writer first (write precondition failed)")]
    Conflict {
        /// The checkpoint key or result name.
        key: String,
    },
    /// A queue, container or blob does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// The job's lease was lost or its message released, so its writes
    /// (checkpoints, and results through `FencedResults`) are refused
    /// before they reach storage.
    #[error("job {key} was cancelled; refusing to write for it")]
    JobCancelled {
        /// The checkpoint key of the cancelled job.
        key: String,
    },
    /// A transient failure (connection refused, timeout, throttling, 5xx)
    /// that survived the backend's own bounded retries. Worth retrying later.
    #[error("storage unavailable: {message}")]
    Unavailable {
        /// A description, with secrets redacted.
        message: String,
    },
    /// The service rejected the request for a reason retrying will not fix.
    #[error("storage request rejected (status {status}): {message}")]
    Rejected {
        /// HTTP status code, or 0 when there was none.
        status: u16,
        /// A description, with secrets redacted.
        message: String,
    },
    /// The service refused this worker's credentials or their permissions
    /// (HTTP 401/403: `AuthorizationPermissionMismatch`,
    /// `AuthenticationFailed`, a role assignment removed). Waiting does not
    /// fix it, but an operator may: the consumer pauses its intake while it
    /// persists and resumes when the store answers again.
    #[error("storage refused the request (status {status}): {message}")]
    Refused {
        /// HTTP status code.
        status: u16,
        /// A description, with secrets redacted.
        message: String,
    },
    /// The blob container the request addressed does not exist (HTTP 404
    /// `ContainerNotFound`): it was deleted, or never created. Re-created
    /// by [`CheckpointStore::prepare`](crate::CheckpointStore::prepare)
    /// where the worker's role allows it.
    #[error("the container of {what} is missing: {message}")]
    MissingContainer {
        /// What was addressed (it names the container).
        what: String,
        /// A description, with secrets redacted.
        message: String,
    },
    /// Stored data could not be understood (for example a checkpoint blob
    /// that is not the JSON this crate writes).
    #[error("invalid data in {what}: {reason}")]
    InvalidData {
        /// Where the data came from.
        what: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The caller passed something the backend cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl StorageError {
    /// True for failures that may go away by themselves (network, throttling,
    /// server errors); false for lost leases, conflicts and bad requests.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Unavailable { .. })
    }
}
