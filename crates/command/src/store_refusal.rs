//! What a save does when the store fails it: a refusal no retry can
//! change (the store rejects a chunk's or the manifest's path or size: an
//! HTTP 4xx other than 401/403/404/409, or a name it cannot take) ends the
//! delivery as a failure with the store's reason, as a checkpoint
//! directory over its limits does, so the attempt record, `spot-worker
//! status` (under `failing`) and at last the poison record say why; any
//! other error (the store unavailable, credentials refused, a container
//! missing: what clears by itself or by an operator's hand) leaves the last
//! complete checkpoint standing and the next look tries again.

use spot_worker_storage::StorageError;

/// What a save failed by the store leads to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterStoreError {
    /// Saved at the next look; the last complete checkpoint stands.
    TryLater,
    /// The delivery fails with this reason.
    Fail(String),
}

/// The rule, from the error alone.
pub(crate) fn after_store_error(error: &StorageError) -> AfterStoreError {
    match error {
        StorageError::Rejected { .. } | StorageError::InvalidArgument(_) => {
            AfterStoreError::Fail(format!(
                "the store refused the checkpoint, which no retry can change ({error}); nothing was saved"
            ))
        }
        _ => AfterStoreError::TryLater,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_no_retry_can_change_fails_the_delivery() {
        let message = || "m".to_owned();
        let table = [
            (
                StorageError::Rejected {
                    status: 413,
                    message: "RequestBodyTooLarge".to_owned(),
                },
                true,
            ),
            (
                StorageError::InvalidArgument("a blob name".to_owned()),
                true,
            ),
            (StorageError::Unavailable { message: message() }, false),
            (
                StorageError::Refused {
                    status: 403,
                    message: message(),
                },
                false,
            ),
            (
                StorageError::MissingContainer {
                    what: "checkpoints".to_owned(),
                    message: message(),
                },
                false,
            ),
        ];
        for (error, fails) in table {
            let after = after_store_error(&error);
            match (&after, fails) {
                (AfterStoreError::Fail(reason), true) => {
                    assert!(reason.contains(&error.to_string()), "{reason}");
                    assert!(reason.contains("nothing was saved"), "{reason}");
                }
                (AfterStoreError::TryLater, false) => {}
                _ => panic!("{error}: {after:?}"),
            }
        }
    }
}
