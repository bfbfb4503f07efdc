//! Cutting a file into content-defined chunks (FastCDC) and hashing each
//! (BLAKE3), on a blocking thread, streamed: the file is read once, front
//! to back, and no more of it is held than the byte budget allows.
//!
//! Memory: the chunker's own buffer is [`MAX_CHUNK`] (4 MiB); each chunk
//! it cuts is copied out of it, and that copy is paid for from the shared
//! byte budget (a [`Semaphore`] of bytes) before it is cut: [`MAX_CHUNK`]
//! permits are taken, and what the chunk does not need handed back at
//! once. The copy keeps its permits until its upload is done (or it is
//! found already stored). So chunks held at once, cut but not yet sent,
//! never add up to more than the budget: with the default 16 MiB budget
//! and 8 uploads in flight, a file of any size costs at most 4 MiB + 16
//! MiB of buffers.

use std::fs::File;

use bytes::Bytes;
use fastcdc::v2020::{ChunkData, StreamCDC};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use std::sync::Arc;

/// The least chunk FastCDC cuts (except a file's last).
pub const MIN_CHUNK: usize = 256 * 1024;
/// The chunk size FastCDC aims at: a 1 GB file is about 1000 chunks, and a
/// change costs about its own size plus a chunk or two around it.
pub const AVG_CHUNK: usize = 1024 * 1024;
/// The largest chunk FastCDC cuts.
pub const MAX_CHUNK: usize = 4 * 1024 * 1024;

/// One chunk of a file, hashed, holding its share of the byte budget.
#[derive(Debug)]
pub(crate) struct Piece {
    pub(crate) offset: u64,
    pub(crate) hash: [u8; 32],
    pub(crate) data: Bytes,
    pub(crate) permit: OwnedSemaphorePermit,
}

/// Chunks `file` on a blocking thread, from its start; the pieces arrive
/// in order on the returned channel, then the channel closes (after an
/// error, if reading failed). Dropping the receiver stops the thread at
/// its next chunk. `budget` must hold at least [`MAX_CHUNK`] permits.
pub(crate) fn chunk_file(
    file: Arc<File>,
    budget: Arc<Semaphore>,
) -> mpsc::Receiver<std::io::Result<Piece>> {
    let (sender, receiver) = mpsc::channel(2);
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut chunks: Box<dyn Iterator<Item = Result<ChunkData, fastcdc::v2020::Error>>> =
            match read_small(&file) {
                Ok(Some(data)) if data.is_empty() => return,
                Ok(Some(data)) => Box::new(std::iter::once(Ok(ChunkData {
                    hash: 0,
                    offset: 0,
                    length: data.len(),
                    data,
                }))),
                Ok(None) => Box::new(StreamCDC::new(
                    ReadAt::new(&file),
                    MIN_CHUNK,
                    AVG_CHUNK,
                    MAX_CHUNK,
                )),
                Err(error) => {
                    let _ = sender.blocking_send(Err(error));
                    return;
                }
            };
        loop {
            let Ok(mut permit) =
                runtime.block_on(Arc::clone(&budget).acquire_many_owned(MAX_CHUNK as u32))
            else {
                return;
            };
            let chunk = match chunks.next() {
                None => return,
                Some(Ok(chunk)) => chunk,
                Some(Err(error)) => {
                    let error = match error {
                        fastcdc::v2020::Error::IoError(error) => error,
                        other => std::io::Error::other(other.to_string()),
                    };
                    let _ = sender.blocking_send(Err(error));
                    return;
                }
            };
            // Hand back what this chunk does not hold.
            drop(permit.split(MAX_CHUNK - chunk.length.max(1)));
            let hash = *blake3::hash(&chunk.data).as_bytes();
            let piece = Piece {
                offset: chunk.offset,
                hash,
                data: Bytes::from(chunk.data),
                permit,
            };
            if sender.blocking_send(Ok(piece)).is_err() {
                return;
            }
        }
    });
    receiver
}

/// The whole of `file` if it is no longer than [`MIN_CHUNK`] (one chunk,
/// as FastCDC would cut it), `None` if it is longer.
fn read_small(file: &File) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let len = file.metadata()?.len();
    if len > MIN_CHUNK as u64 {
        return Ok(None);
    }
    // It may have grown since: one byte more than a chunk says so. Room
    // for all of it and that byte at once: grown from empty, the buffer
    // took a dozen reads of a 50 KiB file.
    let mut data = Vec::with_capacity(len as usize + 1);
    ReadAt::new(file)
        .take(MIN_CHUNK as u64 + 1)
        .read_to_end(&mut data)?;
    Ok((data.len() <= MIN_CHUNK).then_some(data))
}

/// Reads a file from its start by position (`pread`), whatever its
/// cursor: the same open file may be read more than once.
pub(crate) struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl<'a> ReadAt<'a> {
    pub(crate) fn new(file: &'a File) -> Self {
        ReadAt { file, at: 0 }
    }
}

impl std::io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let read = self.file.read_at(buf, self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use spot_worker_testkit::contract::pseudo_random;

    use super::*;

    async fn cut(bytes: &[u8]) -> Vec<(u64, [u8; 32], usize)> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        let budget = Arc::new(Semaphore::new(2 * MAX_CHUNK));
        let mut pieces = chunk_file(Arc::new(file), budget);
        let mut out = Vec::new();
        while let Some(piece) = pieces.recv().await {
            let piece = piece.unwrap();
            out.push((piece.offset, piece.hash, piece.data.len()));
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_in_the_middle_changes_only_the_chunks_around_it() {
        let mut bytes = pseudo_random(12 * AVG_CHUNK, 1);
        let before = cut(&bytes).await;
        assert_eq!(
            before.iter().map(|(_, _, len)| len).sum::<usize>(),
            bytes.len()
        );
        assert!(before.len() > 4, "{} chunks", before.len());
        // Insert 100 bytes in the middle: later chunks shift but are cut
        // at the same content, so their hashes are unchanged.
        let middle = bytes.len() / 2;
        bytes.splice(middle..middle, std::iter::repeat_n(7u8, 100));
        let after = cut(&bytes).await;
        let old: std::collections::HashSet<_> = before.iter().map(|(_, hash, _)| *hash).collect();
        let new_chunks = after
            .iter()
            .filter(|(_, hash, _)| !old.contains(hash))
            .count();
        assert!(
            new_chunks <= 2,
            "{new_chunks} of {} chunks new",
            after.len()
        );
    }

    /// Read whole or through FastCDC, a file cuts the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_file_is_one_chunk_as_fastcdc_cuts_it() {
        for len in [1, 4096, MIN_CHUNK - 1, MIN_CHUNK, MIN_CHUNK + 1] {
            let bytes = pseudo_random(len, len as u64);
            let cdc: Vec<_> = StreamCDC::new(&bytes[..], MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
                .map(|chunk| {
                    let chunk = chunk.unwrap();
                    let hash = *blake3::hash(&chunk.data).as_bytes();
                    (chunk.offset, hash, chunk.length)
                })
                .collect();
            assert_eq!(cut(&bytes).await, cdc, "{len} bytes");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_file_has_no_chunks() {
        assert!(cut(b"").await.is_empty());
    }
}
