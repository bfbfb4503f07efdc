//! The manifest: what a saved set of checkpoint files is, kept as the
//! job's (small, ETag-fenced) checkpoint document. Each file is its path,
//! its size and its content: inline if small, else the list of its
//! content-defined chunks, in order; a long list is kept in pages, blobs
//! of their own, so the document stays a few hundred bytes whatever the
//! size (a 1 GB file is about 1000 chunks, one page of 40 KB; 100 GB a
//! hundred pages, still one line each in the document). A manifest of
//! many files keeps its file table in a blob too.
//!
//! A chunk is named by the job's prefix, the first 128 bits of its BLAKE3
//! hash, and the save that sent it (`gen`): the hash makes it found again
//! by the next save (unchanged content is not sent again), and the save
//! makes every upload's name new, so deleting a chunk no manifest names
//! any more can never remove one a later save sent again.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StorageError;

/// The `format` of a manifest document.
pub const FORMAT: &str = "spot-worker-files/1";

/// One chunk (or page, or file table) as stored: its BLAKE3 hash, its
/// length, and the save that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkRef {
    /// BLAKE3 of its bytes.
    pub hash: [u8; 32],
    /// Its length in bytes.
    pub len: u32,
    /// The save that sent it (random per save).
    pub generation: u32,
}

/// What a chunk's name is made from besides the job's prefix: the first
/// 128 bits of its hash and its save.
pub type ChunkKey = ([u8; 16], u32);

impl ChunkRef {
    /// Its name under the job's chunk `prefix`.
    pub fn name(&self, prefix: &str) -> String {
        name_of(prefix, self.key())
    }

    /// What its name is made from.
    pub fn key(&self) -> ChunkKey {
        let mut short = [0u8; 16];
        short.copy_from_slice(&self.hash[..16]);
        (short, self.generation)
    }

    fn to_json(self) -> Value {
        Value::Array(vec![
            Value::String(hex(&self.hash)),
            self.len.into(),
            self.generation.into(),
        ])
    }

    fn from_json(value: &Value) -> Option<Self> {
        let parts = value.as_array()?;
        let hash = unhex32(parts.first()?.as_str()?)?;
        let len = u32::try_from(parts.get(1)?.as_u64()?).ok()?;
        let generation = u32::try_from(parts.get(2)?.as_u64()?).ok()?;
        Some(ChunkRef {
            hash,
            len,
            generation,
        })
    }
}

/// A chunk's name from its `key` under `prefix`.
pub fn name_of(prefix: &str, (short, generation): ChunkKey) -> String {
    format!("{prefix}/{}-{generation:08x}", hex(&short))
}

/// The chunk prefix of the job `key`: 128 bits of its BLAKE3 hash, in hex
/// (job keys may be up to 1024 characters, and hold anything a blob name
/// may).
pub fn job_prefix(key: &str) -> String {
    hex(&blake3::hash(key.as_bytes()).as_bytes()[..16])
}

/// A page of a long chunk list: the page's blob, and how many chunk
/// references it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRef {
    /// The page as a chunk.
    pub chunk: ChunkRef,
    /// Chunk references in it.
    pub count: u32,
}

/// A file's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Kept in the document itself (small files).
    Inline(Vec<u8>),
    /// Its chunks, in order.
    Chunks(Vec<ChunkRef>),
    /// Its chunks, in order, listed by pages.
    Pages(Vec<PageRef>),
}

/// One file of a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// `root` or `root/relative/path` ([`validate_path`]).
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its content.
    pub content: Content,
}

/// The files of one save, as the job's checkpoint document holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The job's chunk prefix ([`job_prefix`]) the chunks are under.
    pub prefix: String,
    /// The files, or the blob that lists them.
    pub files: Files,
}

/// A manifest's file table: in the document, or in a blob of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Files {
    /// In the document.
    Listed(Vec<FileEntry>),
    /// In a blob (a JSON array of file entries).
    Table(ChunkRef),
}

/// How many bytes one page entry takes: hash, length, save.
pub const PAGE_ENTRY_LEN: usize = 32 + 4 + 4;

/// The first bytes of a page blob.
const PAGE_MAGIC: &[u8; 4] = b"SWP1";

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::InvalidData {
        what: "checkpoint manifest".to_owned(),
        reason: reason.into(),
    }
}

impl Manifest {
    /// The manifest in a checkpoint's progress, if it is one (`None` for
    /// progress of any other shape); an error if it says it is one but
    /// does not parse.
    pub fn from_progress(progress: &Value) -> Option<Result<Manifest, StorageError>> {
        if progress.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return None;
        }
        Some(Self::parse(progress))
    }

    fn parse(progress: &Value) -> Result<Manifest, StorageError> {
        let prefix = progress
            .get("chunks_under")
            .and_then(Value::as_str)
            .filter(|p| p.len() == 32 && p.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| invalid("no chunk prefix (`chunks_under`)"))?
            .to_owned();
        let files = match (progress.get("files"), progress.get("table")) {
            (Some(files), None) => Files::Listed(files_from_json(files)?),
            (None, Some(table)) => Files::Table(
                ChunkRef::from_json(table).ok_or_else(|| invalid("a malformed `table`"))?,
            ),
            _ => return Err(invalid("neither `files` nor `table`")),
        };
        Ok(Manifest { prefix, files })
    }

    /// The checkpoint progress that holds this manifest.
    pub fn to_progress(&self) -> Value {
        let mut document = serde_json::Map::new();
        document.insert("format".into(), FORMAT.into());
        document.insert("chunks_under".into(), self.prefix.clone().into());
        match &self.files {
            Files::Listed(files) => {
                document.insert("files".into(), files_to_json(files));
            }
            Files::Table(table) => {
                document.insert("table".into(), table.to_json());
            }
        }
        Value::Object(document)
    }

    /// The total size of its files, if listed here.
    pub fn listed_size(&self) -> Option<u64> {
        match &self.files {
            Files::Listed(files) => Some(files.iter().map(|f| f.size).sum()),
            Files::Table(_) => None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct FileJson {
    path: String,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pages: Option<Vec<Value>>,
}

/// The file table as JSON.
pub fn files_to_json(files: &[FileEntry]) -> Value {
    let entries: Vec<Value> = files
        .iter()
        .map(|file| {
            let mut json = FileJson {
                path: file.path.clone(),
                size: file.size,
                inline: None,
                chunks: None,
                pages: None,
            };
            match &file.content {
                Content::Inline(bytes) => json.inline = Some(STANDARD.encode(bytes)),
                Content::Chunks(chunks) => {
                    json.chunks = Some(chunks.iter().map(|c| c.to_json()).collect());
                }
                Content::Pages(pages) => {
                    json.pages = Some(
                        pages
                            .iter()
                            .map(|page| {
                                let mut value = page.chunk.to_json();
                                if let Value::Array(parts) = &mut value {
                                    parts.push(page.count.into());
                                }
                                value
                            })
                            .collect(),
                    );
                }
            }
            serde_json::to_value(json).unwrap_or(Value::Null)
        })
        .collect();
    Value::Array(entries)
}

/// The file table from JSON, every path validated.
pub fn files_from_json(value: &Value) -> Result<Vec<FileEntry>, StorageError> {
    let entries: Vec<FileJson> = serde_json::from_value(value.clone())
        .map_err(|e| invalid(format!("a malformed file table: {e}")))?;
    entries
        .into_iter()
        .map(|json| {
            validate_path(&json.path)?;
            let content = match (json.inline, json.chunks, json.pages) {
                (Some(text), None, None) => {
                    Content::Inline(STANDARD.decode(text).map_err(|_| {
                        invalid(format!("{}: inline content is not base64", json.path))
                    })?)
                }
                (None, Some(chunks), None) => Content::Chunks(
                    chunks
                        .iter()
                        .map(ChunkRef::from_json)
                        .collect::<Option<_>>()
                        .ok_or_else(|| invalid(format!("{}: a malformed chunk", json.path)))?,
                ),
                (None, None, Some(pages)) => Content::Pages(
                    pages
                        .iter()
                        .map(|page| {
                            let count =
                                page.get(3)?.as_u64().and_then(|c| u32::try_from(c).ok())?;
                            Some(PageRef {
                                chunk: ChunkRef::from_json(page)?,
                                count,
                            })
                        })
                        .collect::<Option<_>>()
                        .ok_or_else(|| invalid(format!("{}: a malformed page", json.path)))?,
                ),
                _ => {
                    return Err(invalid(format!(
                        "{}: not exactly one of `inline`, `chunks`, `pages`",
                        json.path
                    )));
                }
            };
            Ok(FileEntry {
                path: json.path,
                size: json.size,
                content,
            })
        })
        .collect()
}

/// A page blob holding `chunks`.
pub fn encode_page(chunks: &[ChunkRef]) -> Vec<u8> {
    let mut page = Vec::with_capacity(8 + chunks.len() * PAGE_ENTRY_LEN);
    page.extend_from_slice(PAGE_MAGIC);
    page.extend_from_slice(
        &u32::try_from(chunks.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for chunk in chunks {
        page.extend_from_slice(&chunk.hash);
        page.extend_from_slice(&chunk.len.to_le_bytes());
        page.extend_from_slice(&chunk.generation.to_le_bytes());
    }
    page
}

/// The chunk references of a page blob, which must hold `count`.
pub fn decode_page(page: &[u8], count: u32) -> Result<Vec<ChunkRef>, StorageError> {
    let expected = 8 + count as usize * PAGE_ENTRY_LEN;
    if page.len() != expected || &page[..4] != PAGE_MAGIC || page[4..8] != count.to_le_bytes() {
        return Err(invalid("a page that does not hold what its manifest says"));
    }
    Ok(page[8..]
        .chunks_exact(PAGE_ENTRY_LEN)
        .map(|entry| {
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&entry[..32]);
            let word = |at: usize| {
                u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
            };
            ChunkRef {
                hash,
                len: word(32),
                generation: word(36),
            }
        })
        .collect())
}

/// The longest manifest path (`root/relative`, in bytes) a restore
/// accepts; a save refuses a longer one rather than store what could
/// never be restored.
pub const MAX_PATH_LEN: usize = 4096;

/// Checks a manifest path: a root name, then optionally `/` and a path
/// relative to it, no part of which is empty, `.` or `..`, and no NUL: a
/// restored file always lands under its root.
pub fn validate_path(path: &str) -> Result<(), StorageError> {
    let bad = |why: &str| Err(invalid(format!("the path {path:?} {why}")));
    if path.is_empty() || path.len() > MAX_PATH_LEN {
        return bad("is empty or longer than 4096 bytes");
    }
    if path.contains('\0') {
        return bad("holds a NUL");
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("is absolute, or has an empty, `.` or `..` part");
    }
    Ok(())
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod bad_input;

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: u8) -> ChunkRef {
        ChunkRef {
            hash: [n; 32],
            len: 1000 + u32::from(n),
            generation: 7,
        }
    }

    #[test]
    fn manifests_round_trip_through_the_document() {
        let manifest = Manifest {
            prefix: job_prefix("job-1"),
            files: Files::Listed(vec![
                FileEntry {
                    path: "file".into(),
                    size: 3,
                    content: Content::Inline(b"abc".to_vec()),
                },
                FileEntry {
                    path: "dir/a/b.bin".into(),
                    size: 2001,
                    content: Content::Chunks(vec![chunk(1), chunk(2)]),
                },
                FileEntry {
                    path: "dir/big".into(),
                    size: 9,
                    content: Content::Pages(vec![PageRef {
                        chunk: chunk(3),
                        count: 2,
                    }]),
                },
            ]),
        };
        let progress = manifest.to_progress();
        assert_eq!(
            Manifest::from_progress(&progress).unwrap().unwrap(),
            manifest
        );
        let table = Manifest {
            prefix: manifest.prefix.clone(),
            files: Files::Table(chunk(4)),
        };
        assert_eq!(
            Manifest::from_progress(&table.to_progress())
                .unwrap()
                .unwrap(),
            table
        );
        assert!(Manifest::from_progress(&serde_json::json!({"file_base64": ""})).is_none());
    }

    #[test]
    fn paths_stay_under_their_root() {
        for ok in ["file", "dir/a", "dir/a/b.c", "dir/..a", "dir/.hidden"] {
            validate_path(ok).unwrap();
        }
        for bad in [
            "",
            "/etc/passwd",
            "dir/../x",
            "dir//x",
            "dir/./x",
            "..",
            "dir/",
            "a\0b",
        ] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        let progress = serde_json::json!({
            "format": FORMAT, "chunks_under": job_prefix("j"),
            "files": [{"path": "dir/../../etc/cron.d/x", "size": 1, "inline": "eA=="}]
        });
        let error = Manifest::from_progress(&progress).unwrap().unwrap_err();
        assert!(error.to_string().contains(".."), "{error}");
    }

    #[test]
    fn pages_round_trip_and_refuse_what_they_do_not_hold() {
        let chunks = [chunk(1), chunk(2), chunk(3)];
        let page = encode_page(&chunks);
        assert_eq!(page.len(), 8 + 3 * PAGE_ENTRY_LEN);
        assert_eq!(decode_page(&page, 3).unwrap(), chunks);
        assert!(decode_page(&page, 2).is_err());
        assert!(decode_page(&page[..page.len() - 1], 3).is_err());
    }

    #[test]
    fn names_carry_the_prefix_the_hash_and_the_save() {
        let name = chunk(0xab).name("p");
        assert_eq!(name, format!("p/{}-00000007", "ab".repeat(16)));
        assert_eq!(job_prefix("job-1").len(), 32);
        assert_ne!(job_prefix("job-1"), job_prefix("job-2"));
    }
}
