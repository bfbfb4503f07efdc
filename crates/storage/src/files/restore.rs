//! Restoring the files a [`Manifest`] names: each chunk downloaded (a
//! bounded number and bytes at once), checked against its BLAKE3 hash and
//! written at its offset, so a file of any size is restored through a
//! fixed amount of memory. Nothing is written outside the caller's roots,
//! and no link is followed on the way there.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::manifest::{
    ChunkKey, ChunkRef, Content, FileEntry, Files, Manifest, PageRef, decode_page, files_from_json,
};
use super::{CheckpointFiles, ChunkIndex, ChunkStore, TransferLimits};
use crate::error::StorageError;

/// What a restore wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Files written.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The chunks downloaded for them (0: every file was kept whole in
    /// the manifest), so a caller can tell the chunked path was walked.
    pub chunks: usize,
    /// How long it took.
    pub took: Duration,
}

/// The largest file table read (about 200,000 files), and so the largest
/// blob a manifest may name at all (chunks are at most
/// [`MAX_CHUNK`](super::MAX_CHUNK), pages 320 KiB).
const MAX_TABLE: u32 = 64 * 1024 * 1024;

fn invalid(reason: String) -> StorageError {
    StorageError::InvalidData {
        what: "checkpoint files".to_owned(),
        reason,
    }
}

/// Downloads the blob `chunk` names and checks it is what it should be.
async fn fetch(
    store: &dyn ChunkStore,
    prefix: &str,
    chunk: &ChunkRef,
) -> Result<bytes::Bytes, StorageError> {
    let name = chunk.name(prefix);
    // Whatever names it (a corrupt manifest too), no larger blob is asked
    // for, so nothing larger is ever allocated for it.
    if chunk.len > MAX_TABLE {
        return Err(invalid(format!(
            "the checkpoint names a blob {name} of {} bytes, more than the {MAX_TABLE} any may have",
            chunk.len
        )));
    }
    let bytes = store
        .get(&name, chunk.len as usize)
        .await?
        .ok_or_else(|| {
            invalid(format!(
                "the chunk {name} the checkpoint names is missing (deleted by hand, or by a retention rule shorter than the job)"
            ))
        })?;
    if blake3::hash(&bytes).as_bytes() != &chunk.hash {
        return Err(invalid(format!(
            "the chunk {name} does not hold what its hash says"
        )));
    }
    Ok(bytes)
}

/// The file table blob `table` names, read and checked: its size bounded
/// before it is fetched. Every path that reads a manifest's table (a
/// restore, a save's index of what is stored) reads it here.
pub(crate) async fn fetch_table(
    store: &dyn ChunkStore,
    prefix: &str,
    table: &ChunkRef,
) -> Result<Vec<FileEntry>, StorageError> {
    if table.len > MAX_TABLE {
        return Err(invalid(format!("a file table of {} bytes", table.len)));
    }
    let bytes = fetch(store, prefix, table).await?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("the file table does not parse: {e}")))?;
    files_from_json(&value)
}

/// The chunks of the page blob `page` names, read and checked: its count
/// and size bounded before it is fetched. Every path that reads a
/// manifest's pages reads them here.
pub(crate) async fn fetch_page(
    store: &dyn ChunkStore,
    prefix: &str,
    page: &PageRef,
) -> Result<Vec<ChunkRef>, StorageError> {
    let page_len = 8 + page.count as usize * super::manifest::PAGE_ENTRY_LEN;
    if page.count as usize > super::PAGE_ENTRIES || page.chunk.len as usize != page_len {
        return Err(invalid(format!("a page of {} chunks", page.count)));
    }
    let bytes = fetch(store, prefix, &page.chunk).await?;
    decode_page(&bytes, page.count)
}

/// Writes the files of `manifest` under `roots`; returns what it wrote and
/// the chunks it names.
pub(crate) async fn restore(
    store: Arc<dyn ChunkStore>,
    manifest: &Manifest,
    roots: &CheckpointFiles,
    limits: TransferLimits,
) -> Result<(Restored, ChunkIndex), StorageError> {
    let started = Instant::now();
    let prefix = manifest.prefix.clone();
    let mut blobs: Vec<ChunkKey> = Vec::new();
    let entries = match &manifest.files {
        Files::Listed(entries) => entries.clone(),
        Files::Table(table) => {
            blobs.push(table.key());
            fetch_table(store.as_ref(), &prefix, table).await?
        }
    };
    let mut chunks: Vec<ChunkKey> = Vec::new();
    let mut restored = Restored::default();
    let downloads = Downloads {
        store,
        prefix: prefix.clone(),
        slots: Arc::new(Semaphore::new(limits.concurrency.max(1))),
        budget: Arc::new(Semaphore::new(limits.budget())),
    };
    // A restore that fails takes back the files it made: none of them is
    // the checkpoint (the caller may restore a newer one in their place).
    let mut made: Vec<PathBuf> = Vec::new();
    for entry in &entries {
        let written = async {
            let target = roots.target(&entry.path).ok_or_else(|| {
                invalid(format!(
                    "the checkpoint holds {}, which is under none of the roots it is restored to",
                    entry.path
                ))
            })?;
            let file = Arc::new(create(&target, roots)?);
            made.push(target);
            downloads.write(entry, &file, &mut chunks, &mut blobs).await
        }
        .await;
        if let Err(error) = written {
            for path in &made {
                let _ = std::fs::remove_file(path);
            }
            return Err(error);
        }
        restored.files += 1;
        restored.bytes += entry.size;
    }
    restored.chunks = chunks.len();
    restored.took = started.elapsed();
    Ok((restored, ChunkIndex::new(prefix, chunks, blobs)))
}

struct Downloads {
    store: Arc<dyn ChunkStore>,
    prefix: String,
    slots: Arc<Semaphore>,
    budget: Arc<Semaphore>,
}

impl Downloads {
    /// Writes one file's content into `file`.
    async fn write(
        &self,
        entry: &FileEntry,
        file: &Arc<File>,
        chunks: &mut Vec<ChunkKey>,
        blobs: &mut Vec<ChunkKey>,
    ) -> Result<(), StorageError> {
        let io = |e: std::io::Error| invalid(format!("writing {}: {e}", entry.path));
        let mut running: JoinSet<Result<(), StorageError>> = JoinSet::new();
        let mut offset = 0u64;
        match &entry.content {
            Content::Inline(bytes) => {
                file.write_all_at(bytes, 0).map_err(io)?;
                offset = bytes.len() as u64;
            }
            Content::Chunks(list) => {
                for chunk in list {
                    self.start(chunk, offset, file, &mut running).await?;
                    chunks.push(chunk.key());
                    offset += u64::from(chunk.len);
                }
            }
            Content::Pages(pages) => {
                for page in pages {
                    blobs.push(page.chunk.key());
                    for chunk in fetch_page(self.store.as_ref(), &self.prefix, page).await? {
                        self.start(&chunk, offset, file, &mut running).await?;
                        chunks.push(chunk.key());
                        offset += u64::from(chunk.len);
                    }
                }
            }
        }
        while let Some(done) = running.join_next().await {
            done.map_err(|e| invalid(format!("a download's task ended: {e}")))??;
        }
        if offset != entry.size {
            return Err(invalid(format!(
                "{} is {} bytes by its chunks, but {} by the manifest",
                entry.path, offset, entry.size
            )));
        }
        file.set_len(entry.size).map_err(io)?;
        Ok(())
    }

    /// Starts downloading `chunk` to `offset` of `file` once a slot and
    /// its bytes are free.
    async fn start(
        &self,
        chunk: &ChunkRef,
        offset: u64,
        file: &Arc<File>,
        running: &mut JoinSet<Result<(), StorageError>>,
    ) -> Result<(), StorageError> {
        let closed = |_| StorageError::InvalidArgument("the download slots closed".to_owned());
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(closed)?;
        if chunk.len as usize > super::MAX_CHUNK {
            return Err(invalid(format!(
                "a chunk of {} bytes, more than the {} a chunk may have",
                chunk.len,
                super::MAX_CHUNK
            )));
        }
        let held = Arc::clone(&self.budget)
            .acquire_many_owned(chunk.len.max(1))
            .await
            .map_err(closed)?;
        let (store, prefix, chunk, file) = (
            Arc::clone(&self.store),
            self.prefix.clone(),
            *chunk,
            Arc::clone(file),
        );
        running.spawn(async move {
            let _slot = slot;
            let _held = held;
            let bytes = fetch(store.as_ref(), &prefix, &chunk).await?;
            tokio::task::spawn_blocking(move || file.write_all_at(&bytes, offset))
                .await
                .map_err(|e| invalid(format!("a write's task ended: {e}")))?
                .map_err(|e| invalid(format!("writing a restored file: {e}")))
        });
        while let Some(done) = running.try_join_next() {
            done.map_err(|e| invalid(format!("a download's task ended: {e}")))??;
        }
        Ok(())
    }
}

/// Creates (or truncates) the file at `target`, making the directories
/// below its root as needed; no link on the way is followed.
fn create(target: &Path, roots: &CheckpointFiles) -> Result<File, StorageError> {
    let io = |e: std::io::Error| invalid(format!("creating {}: {e}", target.display()));
    let root = roots
        .roots()
        .map(|(_, path, _)| path)
        .filter(|root| target.starts_with(root))
        .max_by_key(|root| root.as_os_str().len())
        .ok_or_else(|| invalid(format!("{} is under no root", target.display())))?;
    if let Some(parent) = target.parent() {
        let mut at = PathBuf::new();
        for part in parent.components() {
            at.push(part);
            if !at.starts_with(root) || at.as_os_str().len() < root.as_os_str().len() {
                continue;
            }
            match std::fs::symlink_metadata(&at) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(invalid(format!(
                        "{} is in the way of a restored file (not a directory; links are not followed)",
                        at.display()
                    )));
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&at)
                        .map_err(io)?;
                }
                Err(error) => return Err(io(error)),
            }
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(target)
        .map_err(io)
}

use std::os::unix::fs::DirBuilderExt;

#[cfg(test)]
mod bad_input;
