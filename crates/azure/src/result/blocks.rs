//! A result of any size, streamed: read from its file block by block (4
//! MiB, more for results over 195 GiB so that 50,000 blocks hold them),
//! each staged as it is read with a few in flight and a bounded number of
//! bytes held, then committed create-only (`If-None-Match: *` on Put
//! Block List): the result appears whole or not at all. If one exists
//! already, it is compared with the file range by range.
//!
//! Uncommitted blocks belong to the blob, not to the upload that staged
//! them, so every upload names its blocks with a prefix of its own
//! ([`block_ids`], shared with the in-memory store): two holders of one job writing its result at once
//! never overwrite each other's blocks, and the first commit stores
//! exactly its writer's bytes. The other commit finds the blob there (or,
//! its blocks discarded by that commit, an invalid list) and settles by
//! comparing, as [`ResultStore::put_new`](spot_worker_storage::ResultStore::put_new) says.

use std::fs::File;
use std::num::NonZero;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use azure_core::Bytes;
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::models::{
    BlobClientDownloadOptions, BlobClientGetPropertiesResultHeaders as _,
    BlockBlobClientCommitBlockListOptions, BlockLookupList,
};
use futures_util::StreamExt as _;
use spot_worker_storage::{PutOutcome, StorageError};

use super::BlobResultStore;
use crate::error::{Operation, error_code, map_error};

/// The block size of results up to 195 GiB.
pub(crate) const BLOCK: u64 = 4 * 1024 * 1024;
/// Blocks a blob may commit.
const MAX_BLOCKS: u64 = 50_000;
/// Bytes of blocks held at once (read and not yet sent).
const IN_FLIGHT_BYTES: u64 = 16 * 1024 * 1024;

/// The block size for a result of `len` bytes (whole MiB).
pub(crate) fn block_size(len: u64) -> u64 {
    let least = len.div_ceil(MAX_BLOCKS);
    least.div_ceil(1024 * 1024).max(4) * 1024 * 1024
}

/// The ids of `count` blocks staged by one upload, unique to it
/// ([`spot_worker_storage::result_blocks::block_ids`]: the in-memory
/// store's model of blob storage, which the fault search runs, uses the
/// same ones).
fn block_ids(count: u64) -> Vec<Vec<u8>> {
    spot_worker_storage::result_blocks::block_ids(count)
        .into_iter()
        .map(String::into_bytes)
        .collect()
}

fn io_error(what: &str, error: impl std::fmt::Display) -> StorageError {
    StorageError::InvalidArgument(format!("{what}: reading the result file: {error}"))
}

/// Reads `len` bytes of `file` at `offset` on a blocking thread.
async fn read_at(
    file: &Arc<File>,
    offset: u64,
    len: u64,
    what: &str,
) -> Result<Bytes, StorageError> {
    let file = Arc::clone(file);
    let read = tokio::task::spawn_blocking(move || {
        let mut buffer = vec![0u8; len as usize];
        file.read_exact_at(&mut buffer, offset).map(|()| buffer)
    })
    .await
    .map_err(|e| io_error(what, e))?;
    read.map(Bytes::from).map_err(|e| io_error(what, e))
}

impl BlobResultStore {
    /// Stages and commits `len` bytes of `file` as `name`, create-only.
    pub(crate) async fn create_in_blocks(
        &self,
        name: &str,
        file: &Arc<File>,
        len: u64,
    ) -> Result<(), StorageError> {
        let what = self.what(name);
        let block = block_size(len);
        let count = len.div_ceil(block);
        let at_once = (IN_FLIGHT_BYTES / block).clamp(1, self.concurrency as u64) as usize;
        let client = self.container.client.blob_client(name).block_blob_client();
        let ids = block_ids(count);
        {
            let staged = futures_util::stream::iter(0..count)
                .map(|index| {
                    let (client, what, id) = (&client, &what, ids[index as usize].clone());
                    async move {
                        let offset = index * block;
                        let size = block.min(len - offset);
                        let bytes = read_at(file, offset, size, what).await?;
                        let content: RequestContent<Bytes, _> = bytes.into();
                        self.container
                            .bounded(what, async {
                                client
                                    .stage_block(&id, size, content, None)
                                    .await
                                    .map(drop)
                                    .map_err(|e| map_error(e, Operation::Other(what)))
                            })
                            .await
                    }
                })
                .buffer_unordered(at_once);
            futures_util::pin_mut!(staged);
            while let Some(done) = staged.next().await {
                done?;
            }
        }
        let list = BlockLookupList {
            latest: Some(ids),
            ..Default::default()
        };
        let options = BlockBlobClientCommitBlockListOptions {
            if_none_match: Some(Etag::from("*")),
            blob_content_type: Some(super::content_type(name).to_owned()),
            ..Default::default()
        };
        let list: RequestContent<BlockLookupList, _> = list
            .try_into()
            .map_err(|e: azure_core::Error| map_error(e, Operation::Other(&what)))?;
        self.container
            .bounded(&what, async {
                client
                    .commit_block_list(list, Some(options))
                    .await
                    .map(drop)
                    .map_err(|e| commit_error(e, name))
            })
            .await
    }
}

/// A failed commit of `name`'s block list as the caller decides by. A list
/// naming blocks that are gone (`InvalidBlockList`) means another upload
/// committed first and its commit discarded this one's uncommitted blocks:
/// like 409/412, a `Conflict`, which the caller settles by comparing with
/// what is stored (and, if nothing is, by uploading again).
fn commit_error(error: azure_core::Error, name: &str) -> StorageError {
    if error_code(&error) == Some("InvalidBlockList") {
        return StorageError::Conflict {
            key: name.to_owned(),
        };
    }
    map_error(error, Operation::ConditionalWrite(name))
}

impl BlobResultStore {
    /// Whether the stored result `name` holds exactly `len` bytes of
    /// `file`: its length, then range by range; `None` if it is gone.
    pub(crate) async fn same_as_file(
        &self,
        name: &str,
        file: &Arc<File>,
        len: u64,
    ) -> Result<Option<bool>, StorageError> {
        let what = self.what(name);
        let blob = self.container.client.blob_client(name);
        let stored = self
            .container
            .bounded(&what, async {
                match blob.get_properties(None).await {
                    Ok(properties) => properties
                        .content_length()
                        .map_err(|e| map_error(e, Operation::Other(&what))),
                    Err(e) if e.http_status() == Some(azure_core::http::StatusCode::NotFound) => {
                        Ok(None)
                    }
                    Err(e) => Err(map_error(e, Operation::Other(&what))),
                }
            })
            .await?;
        let Some(stored) = stored else {
            return Ok(None);
        };
        if stored != len {
            return Ok(Some(false));
        }
        let mut offset = 0;
        while offset < len {
            let size = BLOCK.min(len - offset);
            let mine = read_at(file, offset, size, &what).await?;
            let mut theirs = vec![0u8; size as usize];
            let options = BlobClientDownloadOptions {
                range: Some((offset..offset + size).into()),
                parallel: Some(NonZero::<usize>::MIN),
                partition_size: NonZero::new(size as usize),
                ..Default::default()
            };
            self.container
                .bounded(&what, async {
                    blob.download_into(&mut theirs, Some(options))
                        .await
                        .map(drop)
                        .map_err(|e| map_error(e, Operation::Other(&what)))
                })
                .await?;
            if theirs != mine {
                return Ok(Some(false));
            }
            offset += size;
        }
        Ok(Some(true))
    }

    /// [`ResultStore::put_new_file`](spot_worker_storage::ResultStore::put_new_file)
    /// of a result bigger than one block.
    pub(crate) async fn put_new_in_blocks(
        &self,
        name: &str,
        file: File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        let file = Arc::new(file);
        spot_worker_storage::result_blocks::settle_create_only(
            name,
            || self.create_in_blocks(name, &file, len),
            || self.same_as_file(name, &file, len),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_grow_only_past_fifty_thousand() {
        assert_eq!(block_size(1), BLOCK);
        assert_eq!(block_size(50_000 * BLOCK), BLOCK);
        assert_eq!(block_size(50_000 * BLOCK + 1), 5 * 1024 * 1024);
        let tib = 1u64 << 40;
        assert!(tib.div_ceil(block_size(tib)) <= 50_000);
    }

    /// The loser of a race learns it lost however the service says so;
    /// anything else keeps its own meaning.
    #[test]
    fn a_commit_that_lost_the_race_is_a_conflict() {
        use crate::error::http;
        use azure_core::http::StatusCode;
        for (status, code, conflict) in [
            (StatusCode::Conflict, "BlobAlreadyExists", true),
            (StatusCode::PreconditionFailed, "ConditionNotMet", true),
            (StatusCode::BadRequest, "InvalidBlockList", true),
            (StatusCode::BadRequest, "InvalidHeaderValue", false),
            (StatusCode::ServiceUnavailable, "ServerBusy", false),
        ] {
            let error = commit_error(http(status, code), "r.bin");
            assert_eq!(
                matches!(&error, StorageError::Conflict { key } if key == "r.bin"),
                conflict,
                "{code}: {error:?}"
            );
        }
    }
}
