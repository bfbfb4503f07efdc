//! The one home of the ETag-fenced read-modify-write of a small JSON
//! document kept in the checkpoint store as an in-progress checkpoint:
//! the attempt records, the lanes' records and the fleet's documents
//! ([`FleetDocument`](crate::FleetDocument), which the fleet ledger and the
//! lanes' switch cost use) all read their document with its ETag here and
//! write it back fenced by that ETag (create-only where there was none),
//! so that a concurrent writer's change is a
//! [`StorageError::Conflict`], never lost.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::checkpoint::{Checkpoint, CheckpointStore, ETag, StoredCheckpoint, WritePrecondition};
use crate::error::StorageError;

/// What a fenced JSON document is, for errors about it.
#[derive(Clone, Copy, Debug)]
pub struct FencedJson<'a> {
    /// Its checkpoint key.
    pub key: &'a str,
    /// What it is, before its key in errors ("attempt record").
    pub what: &'a str,
    /// What a completed checkpoint under the key is not ("an attempt
    /// record").
    pub kind: &'a str,
}

impl FencedJson<'_> {
    /// The document as `T` with the ETag its next write is fenced by;
    /// `None` if there is none. A completed checkpoint or JSON that is not
    /// a `T` is [`StorageError::InvalidData`] naming the key.
    pub async fn read<T: DeserializeOwned>(
        &self,
        store: &dyn CheckpointStore,
    ) -> Result<Option<(T, ETag)>, StorageError> {
        let Some(StoredCheckpoint {
            checkpoint, etag, ..
        }) = store.read(self.key).await?
        else {
            return Ok(None);
        };
        let invalid = |reason: String| StorageError::InvalidData {
            what: format!("{} {}", self.what, self.key),
            reason,
        };
        let Checkpoint::InProgress { progress } = checkpoint else {
            return Err(invalid(format!(
                "a completed checkpoint, not {}",
                self.kind
            )));
        };
        let value = serde_json::from_value(progress).map_err(|e| invalid(e.to_string()))?;
        Ok(Some((value, etag)))
    }

    /// Writes `value` as the document, fenced by `etag` (create-only if
    /// `None`: there was none when it was read); a concurrent change is
    /// [`StorageError::Conflict`]. Returns the new ETag.
    pub async fn write<T: Serialize + ?Sized>(
        &self,
        store: &dyn CheckpointStore,
        etag: Option<&ETag>,
        value: &T,
    ) -> Result<ETag, StorageError> {
        let progress = serde_json::to_value(value)
            .map_err(|e| StorageError::InvalidArgument(e.to_string()))?;
        let precondition = match etag {
            Some(etag) => WritePrecondition::IfMatch(etag.clone()),
            None => WritePrecondition::Create,
        };
        store
            .write(
                self.key,
                &Checkpoint::InProgress { progress },
                precondition,
                None,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::InMemoryCheckpointStore;

    const DOC: FencedJson<'static> = FencedJson {
        key: "doc",
        what: "test document",
        kind: "a test document",
    };

    #[tokio::test]
    async fn a_write_fenced_by_a_stale_etag_conflicts_and_changes_nothing() {
        let store = InMemoryCheckpointStore::new();
        assert!(DOC.read::<u32>(&store).await.unwrap().is_none());
        let first = DOC.write(&store, None, &1u32).await.unwrap();
        assert!(matches!(
            DOC.write(&store, None, &9u32).await,
            Err(StorageError::Conflict { .. })
        ));
        let (one, etag) = DOC.read::<u32>(&store).await.unwrap().unwrap();
        assert_eq!((one, &etag), (1, &first));
        DOC.write(&store, Some(&etag), &2u32).await.unwrap();
        assert!(matches!(
            DOC.write(&store, Some(&first), &9u32).await,
            Err(StorageError::Conflict { .. })
        ));
        assert_eq!(DOC.read::<u32>(&store).await.unwrap().unwrap().0, 2);
    }

    #[tokio::test]
    async fn a_completed_checkpoint_or_other_json_is_invalid_data_naming_the_key() {
        let store = InMemoryCheckpointStore::new();
        store
            .write(
                "doc",
                &Checkpoint::Completed {
                    result: serde_json::Value::Null,
                },
                WritePrecondition::Create,
                None,
            )
            .await
            .unwrap();
        let Err(StorageError::InvalidData { what, reason }) = DOC.read::<u32>(&store).await else {
            panic!("a completed checkpoint read as a document");
        };
        assert_eq!(what, "test document doc");
        assert_eq!(reason, "a completed checkpoint, not a test document");
        let other = FencedJson {
            key: "other",
            ..DOC
        };
        other.write(&store, None, &"text").await.unwrap();
        assert!(matches!(
            other.read::<u32>(&store).await,
            Err(StorageError::InvalidData { .. })
        ));
    }
}
