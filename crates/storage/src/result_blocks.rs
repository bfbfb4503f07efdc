//! Large results written the way blob storage writes them: staged as
//! blocks, then committed create-only by their list of ids, so a result
//! appears whole or not at all. [`BlockBlobs`] is that API (Put Blob, Put
//! Block, Put Block List, Get Blob), [`BlockResults`] the [`ResultStore`]
//! built on it, and [`block_ids`] the ids every upload names its blocks
//! with (the blob store in `spot-worker-azure` uses the same ones).
//!
//! Why the ids matter: uncommitted blocks belong to the blob, not to the
//! upload that staged them. Two holders of one job writing its result with
//! the same ids overwrite each other's blocks, and the first commit stores
//! a mixture and reports it created (issue 37 item 6). Each upload's ids
//! carry a prefix of its own, so the first commit stores exactly its
//! writer's bytes and discards the other's blocks; the other commit finds
//! the blob there (or a block of its list gone) and settles by comparing.

use async_trait::async_trait;

use crate::error::StorageError;
use crate::result::{PutOutcome, ResultStore, read_whole};

/// The ids of `count` blocks staged by one upload: a prefix drawn for this
/// upload, then the block's index. Every id of a blob has the same length
/// (Azure wants that, 64 bytes at most), so both parts have fixed widths.
pub fn block_ids(count: u64) -> Vec<String> {
    let upload = uuid::Uuid::new_v4().simple();
    (0..count).map(|i| format!("{upload}-{i:010}")).collect()
}

/// A container of block blobs, as blob storage has them. Uncommitted
/// blocks belong to the blob; a successful Put Blob or commit discards the
/// blob's uncommitted blocks.
#[async_trait]
pub trait BlockBlobs: Send + Sync + 'static {
    /// The container's name, for logs.
    fn container(&self) -> &str;

    /// Makes the container ready (see [`ResultStore::prepare`]).
    async fn prepare_container(&self) -> Result<(), StorageError>;

    /// The size of each block (the last may be shorter) of a result of
    /// `len` bytes; a result of one block or less is put whole.
    fn block_size(&self, len: u64) -> u64;

    /// Put Blob with `If-None-Match: *`: [`StorageError::Conflict`] if the
    /// blob exists.
    async fn put_blob_new(&self, name: &str, body: &[u8]) -> Result<(), StorageError>;

    /// Put Block: stages `block` as `id` of the blob `name`, replacing an
    /// uncommitted block of that id (whoever staged it).
    async fn stage_block(&self, name: &str, id: &str, block: &[u8]) -> Result<(), StorageError>;

    /// Put Block List with `If-None-Match: *`: the blob becomes the
    /// blocks `ids` in order. [`StorageError::Conflict`] if it exists or a
    /// block of the list is not staged (another commit discarded it).
    async fn commit_blocks_new(&self, name: &str, ids: &[String]) -> Result<(), StorageError>;

    /// Get Blob: its committed bytes, `None` if there is no such blob.
    async fn get_blob(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError>;
}

/// The [`ResultStore`] on `B`: [`put_new`] and [`put_new_file`], with
/// `B`'s calls one by one (so a test double can fault each).
#[derive(Clone, Debug)]
pub struct BlockResults<B>(pub B);

#[async_trait]
impl<B: BlockBlobs> ResultStore for BlockResults<B> {
    fn name(&self) -> &str {
        self.0.container()
    }

    async fn prepare(&self) -> Result<(), StorageError> {
        self.0.prepare_container().await
    }

    async fn put_new(&self, name: &str, body: &[u8]) -> Result<PutOutcome, StorageError> {
        put_new(&self.0, name, body).await
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.0.get_blob(name).await
    }

    async fn put_new_file(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<PutOutcome, StorageError> {
        put_new_file(&self.0, name, file, len).await
    }
}

/// [`ResultStore::put_new`] on `blobs`: one create-only Put Blob.
pub async fn put_new<B: BlockBlobs + ?Sized>(
    blobs: &B,
    name: &str,
    body: &[u8],
) -> Result<PutOutcome, StorageError> {
    settle(blobs, name, body, || blobs.put_blob_new(name, body)).await
}

/// [`ResultStore::put_new_file`] on `blobs`: a result of one block or
/// less put whole, a larger one staged block by block under this
/// upload's [`block_ids`] and committed create-only.
pub async fn put_new_file<B: BlockBlobs + ?Sized>(
    blobs: &B,
    name: &str,
    file: std::fs::File,
    len: u64,
) -> Result<PutOutcome, StorageError> {
    let body = read_whole(file, len).await?;
    let block = blobs.block_size(len).max(1);
    if len <= block {
        return put_new(blobs, name, &body).await;
    }
    settle(blobs, name, &body, || async {
        let ids = block_ids(len.div_ceil(block));
        for (id, chunk) in ids.iter().zip(body.chunks(block as usize)) {
            blobs.stage_block(name, id, chunk).await?;
        }
        blobs.commit_blocks_new(name, &ids).await
    })
    .await
}

/// Runs `create`; if the result exists, compares it with `body`.
async fn settle<B, F, Fut>(
    blobs: &B,
    name: &str,
    body: &[u8],
    create: F,
) -> Result<PutOutcome, StorageError>
where
    B: BlockBlobs + ?Sized,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), StorageError>>,
{
    let same = || async { Ok(blobs.get_blob(name).await?.map(|stored| stored == body)) };
    settle_create_only(name, create, same).await
}

/// How every result store settles a create-only write: runs `create`;
/// if the result exists ([`StorageError::Conflict`]), asks `same` whether
/// what is stored is these bytes (`None`: it is gone). Two attempts: the
/// second only runs if the result that made the first one conflict was
/// gone before it could be compared.
pub async fn settle_create_only<F, Fut, S, SFut>(
    name: &str,
    create: F,
    same: S,
) -> Result<PutOutcome, StorageError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), StorageError>>,
    S: Fn() -> SFut,
    SFut: Future<Output = Result<Option<bool>, StorageError>>,
{
    for _ in 0..2 {
        match create().await {
            Ok(()) => return Ok(PutOutcome::Created),
            Err(StorageError::Conflict { .. }) => {}
            Err(other) => return Err(other),
        }
        match same().await? {
            Some(true) => return Ok(PutOutcome::AlreadyExistsIdentical),
            Some(false) => break,
            None => continue,
        }
    }
    Err(StorageError::Conflict {
        key: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two uploads of one blob never share a block id, and every id of
    /// one upload has the same length, within Azure's 64 bytes.
    #[test]
    fn each_upload_names_its_blocks_alone() {
        let (first, second) = (block_ids(50_000), block_ids(3));
        assert_eq!(first.len(), 50_000);
        let len = first[0].len();
        assert!(len <= 64, "{len}");
        assert!(first.iter().chain(&second).all(|id| id.len() == len));
        let first: std::collections::HashSet<_> = first.into_iter().collect();
        assert_eq!(first.len(), 50_000, "ids within an upload are distinct");
        assert!(second.iter().all(|id| !first.contains(id)));
    }
}
