//! Staging a save: every file of a [`Snapshot`] read once, cut into
//! chunks, and each chunk the job's last manifest does not name sent to
//! the [`ChunkStore`] (a bounded number at once), ending in the
//! [`Manifest`] that names them all, not yet written: committing it is
//! the fenced checkpoint write ([`JobCheckpoint::commit_files`]).
//!
//! [`JobCheckpoint::commit_files`]: crate::JobCheckpoint::commit_files

use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::chunker::{Piece, chunk_file};
use super::manifest::{
    ChunkKey, ChunkRef, Content, FileEntry, Files, Manifest, PageRef, encode_page, files_to_json,
};
use super::snapshot::{SnapFile, Snapshot};
use super::{
    CheckpointFiles, ChunkIndex, ChunkStore, INLINE_MAX, INLINE_TOTAL, LISTED_CHUNKS_MAX,
    LISTED_TABLE_MAX, PAGE_ENTRIES, SaveFilesError, TransferLimits,
};
use crate::error::StorageError;

/// What one save read and sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveStats {
    /// Files saved.
    pub files: usize,
    /// Their bytes, all read.
    pub bytes: u64,
    /// Chunks they are made of.
    pub chunks: usize,
    /// Blobs sent (chunks the last manifest did not name, pages, the file
    /// table).
    pub sent_blobs: usize,
    /// Bytes sent in them.
    pub sent_bytes: u64,
    /// From the first read to the last upload's answer.
    pub took: Duration,
}

/// A staged save: everything sent, the manifest ready to commit.
#[derive(Debug)]
pub struct Staged {
    pub(crate) manifest: Manifest,
    pub(crate) index: ChunkIndex,
    pub(crate) versions: Vec<(String, Metadata)>,
    pub(crate) skipped: Vec<String>,
    /// What was read and sent.
    pub stats: SaveStats,
}

impl Staged {
    /// The files saved, by manifest path (`root` or `root/relative`), each
    /// with the metadata of the version read: its identity, size, birth and
    /// modification times.
    pub fn versions(&self) -> &[(String, Metadata)] {
        &self.versions
    }

    /// What was passed over, each with the reason (a link, a FIFO, a
    /// device at a checkpoint path).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// Whether no file was found.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }
}

/// One save's staging.
pub(crate) struct Stager<'a> {
    pub(crate) store: Arc<dyn ChunkStore>,
    pub(crate) prefix: String,
    pub(crate) generation: u32,
    pub(crate) known: &'a ChunkIndex,
    pub(crate) limits: TransferLimits,
    /// The blobs this handle's earlier saves sent that no written manifest
    /// names yet (saves cut short, or that read files changing under them);
    /// then every blob this save sends, as its answer comes: whatever
    /// becomes of the save, the caller knows what to delete if no manifest
    /// names it, and the next save reuses them rather than send them again.
    pub(crate) sent: &'a mut Vec<ChunkKey>,
}

/// Uploads in flight.
struct Uploads {
    store: Arc<dyn ChunkStore>,
    prefix: String,
    slots: Arc<Semaphore>,
    running: JoinSet<Result<(ChunkKey, u64), StorageError>>,
}

impl Uploads {
    /// Starts sending `data` as `key` once a slot is free.
    async fn send(
        &mut self,
        key: ChunkKey,
        data: Bytes,
        held: Option<OwnedSemaphorePermit>,
        sent: &mut Vec<ChunkKey>,
        stats: &mut SaveStats,
    ) -> Result<(), StorageError> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| StorageError::InvalidArgument("the upload slots closed".to_owned()))?;
        let store = Arc::clone(&self.store);
        let name = super::manifest::name_of(&self.prefix, key);
        let len = data.len() as u64;
        self.running.spawn(async move {
            let _slot = slot;
            let _held = held;
            store.put(&name, data).await.map(|()| (key, len))
        });
        while let Some(done) = self.running.try_join_next() {
            Self::record(done, sent, stats)?;
        }
        Ok(())
    }

    /// Waits for every upload.
    async fn finish(
        &mut self,
        sent: &mut Vec<ChunkKey>,
        stats: &mut SaveStats,
    ) -> Result<(), StorageError> {
        while let Some(done) = self.running.join_next().await {
            Self::record(done, sent, stats)?;
        }
        Ok(())
    }

    fn record(
        done: Result<Result<(ChunkKey, u64), StorageError>, tokio::task::JoinError>,
        sent: &mut Vec<ChunkKey>,
        stats: &mut SaveStats,
    ) -> Result<(), StorageError> {
        let (key, len) = done.map_err(|e| StorageError::Unavailable {
            message: format!("an upload's task ended: {e}"),
        })??;
        sent.push(key);
        stats.sent_blobs += 1;
        stats.sent_bytes += len;
        Ok(())
    }
}

fn short(hash: &[u8; 32]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash[..16]);
    out
}

impl Stager<'_> {
    /// Stages `files`, at most `limit` bytes of them.
    pub(crate) async fn stage(
        self,
        files: &CheckpointFiles,
        limit: u64,
    ) -> Result<Staged, SaveFilesError> {
        let started = Instant::now();
        let roots = files.clone();
        let snapshot = tokio::task::spawn_blocking(move || Snapshot::take(&roots))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
        let listed = snapshot.stamps.clone();
        let size = snapshot.size();
        if size > limit {
            return Err(SaveFilesError::TooBig { size, limit });
        }
        let Stager {
            store,
            prefix,
            generation,
            known,
            limits,
            sent,
        } = self;
        let earlier = sent.iter().copied().collect();
        let mut run = Run {
            uploads: Uploads {
                store,
                prefix: prefix.clone(),
                slots: Arc::new(Semaphore::new(limits.concurrency.max(1))),
                running: JoinSet::new(),
            },
            generation,
            known,
            earlier,
            budget: Arc::new(Semaphore::new(limits.budget())),
            sending: HashSet::new(),
            chunk_keys: Vec::new(),
            blob_keys: Vec::new(),
            stats: SaveStats::default(),
            sent,
        };
        let mut entries = Vec::with_capacity(snapshot.files.len());
        let mut inline_total = 0;
        for file in snapshot.files.iter() {
            let len = file.meta.len();
            let opened = Arc::new(open(file).await?);
            let content = if len <= INLINE_MAX && inline_total + len <= INLINE_TOTAL {
                inline_total += len;
                Content::Inline(read_small(&opened, len).await?)
            } else {
                run.chunks_of(&opened, len).await?
            };
            held_still(&opened, &file.meta)?;
            run.stats.bytes += len;
            entries.push(FileEntry {
                path: file.path.clone(),
                size: len,
                content,
            });
        }
        run.uploads.finish(run.sent, &mut run.stats).await?;
        let roots = files.clone();
        let now = tokio::task::spawn_blocking(move || Snapshot::stamps_now(&roots))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
        // A single file is one version if it was the one looked at and held
        // still while read (checked above): a file renamed over it
        // meanwhile is the next save's. A directory's files are one
        // version only together: none may have appeared, gone or changed
        // while they were read.
        let in_dirs = |stamps: &[super::snapshot::Stamp]| {
            stamps
                .iter()
                .filter(|stamp| files.is_in_dir(&stamp.0))
                .cloned()
                .collect::<Vec<_>>()
        };
        if in_dirs(&now) != in_dirs(&listed) {
            return Err(SaveFilesError::Unstable);
        }
        let table = files_to_json(&entries);
        let listed = serde_json::to_vec(&table).map_err(|e| {
            StorageError::InvalidArgument(format!("the file table does not serialize: {e}"))
        })?;
        let files = if listed.len() > LISTED_TABLE_MAX {
            Files::Table(run.blob(Bytes::from(listed)).await?)
        } else {
            Files::Listed(entries)
        };
        run.uploads.finish(run.sent, &mut run.stats).await?;
        run.stats.files = snapshot.files.len();
        run.stats.took = started.elapsed();
        Ok(Staged {
            manifest: Manifest {
                prefix: prefix.clone(),
                files,
            },
            index: ChunkIndex::new(prefix, run.chunk_keys, run.blob_keys),
            versions: snapshot
                .files
                .into_iter()
                .map(|file| (file.path, file.meta))
                .collect(),
            skipped: snapshot.skipped,
            stats: run.stats,
        })
    }
}

/// The state of one staging run.
struct Run<'a> {
    uploads: Uploads,
    generation: u32,
    known: &'a ChunkIndex,
    /// What earlier saves sent that no manifest names yet, by hash.
    earlier: HashMap<[u8; 16], u32>,
    budget: Arc<Semaphore>,
    /// Chunks sent (or being sent) by this save, by hash.
    sending: HashSet<[u8; 16]>,
    chunk_keys: Vec<ChunkKey>,
    blob_keys: Vec<ChunkKey>,
    stats: SaveStats,
    sent: &'a mut Vec<ChunkKey>,
}

impl Run<'_> {
    /// The chunks of `file` (`len` bytes), each sent unless stored
    /// already.
    async fn chunks_of(&mut self, file: &Arc<File>, len: u64) -> Result<Content, SaveFilesError> {
        let mut pieces = chunk_file(Arc::clone(file), Arc::clone(&self.budget));
        let (mut listed, mut pages) = (Vec::new(), Vec::new());
        let mut read = 0u64;
        while let Some(piece) = pieces.recv().await {
            let Piece {
                offset,
                hash,
                data,
                permit,
            } = piece?;
            if offset != read {
                return Err(SaveFilesError::Unstable);
            }
            read += data.len() as u64;
            let chunk = self.chunk(hash, data, permit).await?;
            listed.push(chunk);
            if listed.len() == PAGE_ENTRIES {
                pages.push(self.page(&listed).await?);
                listed.clear();
            }
        }
        if read != len {
            return Err(SaveFilesError::Unstable);
        }
        if pages.is_empty() && listed.len() <= LISTED_CHUNKS_MAX {
            return Ok(Content::Chunks(listed));
        }
        if !listed.is_empty() {
            pages.push(self.page(&listed).await?);
        }
        Ok(Content::Pages(pages))
    }

    /// One chunk: named after the stored copy if the last manifest or an
    /// earlier save names one (or this save sends one), sent otherwise.
    async fn chunk(
        &mut self,
        hash: [u8; 32],
        data: Bytes,
        permit: OwnedSemaphorePermit,
    ) -> Result<ChunkRef, StorageError> {
        let short = short(&hash);
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let stored = self.known.generation_of(&short);
        let generation = match stored.or_else(|| self.earlier.get(&short).copied()) {
            Some(stored) => stored,
            None => {
                if self.sending.insert(short) {
                    let key = (short, self.generation);
                    self.uploads
                        .send(key, data, Some(permit), self.sent, &mut self.stats)
                        .await?;
                }
                self.generation
            }
        };
        self.stats.chunks += 1;
        self.chunk_keys.push((short, generation));
        Ok(ChunkRef {
            hash,
            len,
            generation,
        })
    }

    /// A page of chunk references, stored unless the last manifest has the
    /// same page.
    async fn page(&mut self, chunks: &[ChunkRef]) -> Result<PageRef, StorageError> {
        let chunk = self.blob(Bytes::from(encode_page(chunks))).await?;
        Ok(PageRef {
            chunk,
            count: u32::try_from(chunks.len()).unwrap_or(u32::MAX),
        })
    }

    /// A page or file table, stored unless the last manifest has it.
    async fn blob(&mut self, bytes: Bytes) -> Result<ChunkRef, StorageError> {
        let hash = *blake3::hash(&bytes).as_bytes();
        let short = short(&hash);
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let stored = self.known.blob_generation(&short);
        let generation = match stored.or_else(|| self.earlier.get(&short).copied()) {
            Some(stored) => stored,
            None => {
                self.uploads
                    .send(
                        (short, self.generation),
                        bytes,
                        None,
                        self.sent,
                        &mut self.stats,
                    )
                    .await?;
                self.generation
            }
        };
        self.blob_keys.push((short, generation));
        Ok(ChunkRef {
            hash,
            len,
            generation,
        })
    }
}

/// Opens `file` on a blocking thread, if it is still the version looked at.
async fn open(file: &SnapFile) -> Result<File, SaveFilesError> {
    let file = file.clone();
    tokio::task::spawn_blocking(move || file.open())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// A small file (`len` bytes), whole.
async fn read_small(file: &Arc<File>, len: u64) -> Result<Vec<u8>, SaveFilesError> {
    let handle = Arc::clone(file);
    let bytes = tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        super::chunker::ReadAt::new(&handle)
            .take(len.saturating_add(1))
            .read_to_end(&mut bytes)?;
        Ok::<_, std::io::Error>(bytes)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    if bytes.len() as u64 != len {
        return Err(SaveFilesError::Unstable);
    }
    Ok(bytes)
}

/// Whether the open file still has the size and modification time it had
/// when looked at (`meta`): else it was written while read.
fn held_still(file: &File, meta: &Metadata) -> Result<(), SaveFilesError> {
    let now = file.metadata()?;
    let same = now.len() == meta.len()
        && (now.mtime(), now.mtime_nsec()) == (meta.mtime(), meta.mtime_nsec());
    if same {
        Ok(())
    } else {
        Err(SaveFilesError::Unstable)
    }
}
