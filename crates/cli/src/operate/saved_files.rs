//! What `spot-worker run` saved for a job, said for a person: the
//! checkpoint file and the files of the checkpoint directory with their
//! sizes, a small file's text, never base64 or chunk lists. Both of the
//! runner's formats: the manifest (files inline or in chunks) and the
//! whole file in base64 that runners before it wrote.

use serde_json::Value;
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, FileEntry, Files};

use super::checkpoints::{compact, shorten};

/// How many bytes of a binary checkpoint file `show` prints, in hex.
const HEX_SHOWN: usize = 64;

/// The manifest root of `SPOT_WORKER_CHECKPOINT`.
const FILE_ROOT: &str = "file";

/// The manifest root of `SPOT_WORKER_CHECKPOINT_DIR`.
const DIR_ROOT: &str = "dir/";

/// A job's progress on one line of a table, at most `max` characters:
/// `checkpoint file 43 bytes, directory 3 files 131100 bytes` for what the
/// runner saved, the JSON itself for anything else.
pub fn one_line(progress: &Value, max: usize) -> String {
    let Some(saved) = Saved::of(progress) else {
        return compact(progress, max);
    };
    let mut parts = Vec::new();
    if let Some(size) = saved.file_size {
        parts.push(format!("checkpoint file {size} bytes"));
    }
    if saved.dir_files > 0 {
        parts.push(format!(
            "directory {} files {} bytes",
            saved.dir_files, saved.dir_bytes
        ));
    }
    if saved.in_a_blob {
        parts.push("files listed in a blob".to_owned());
    }
    if parts.is_empty() {
        parts.push("no checkpoint files".to_owned());
    }
    shorten(parts.join(", "), max)
}

/// What the runner saved, for `checkpoints show`: the checkpoint file as
/// text (or its first bytes in hex; its size if it is in chunks), then the
/// directory's files with their sizes. `None` if `progress` is not the
/// runner's.
pub fn describe(progress: &Value) -> Option<String> {
    let saved = Saved::of(progress)?;
    let mut out = Vec::new();
    if let Some(bytes) = &saved.file_bytes {
        out.push(describe_file(bytes));
    } else if let Some(size) = saved.file_size {
        out.push(format!(
            "checkpoint file of {size} byte(s) saved by `spot-worker run` in chunks"
        ));
    }
    if saved.dir_files > 0 {
        out.push(format!(
            "checkpoint directory of {} file(s), {} byte(s):",
            saved.dir_files, saved.dir_bytes
        ));
        for (path, size) in &saved.dir_listing {
            out.push(format!("  {path}  {size} byte(s)"));
        }
    }
    if saved.in_a_blob {
        out.push(
            "checkpoint files listed in a blob of their own (too many to list here)".to_owned(),
        );
    }
    if out.is_empty() {
        out.push("no checkpoint files saved by `spot-worker run`".to_owned());
    }
    Some(out.join("\n"))
}

/// What a progress value says the runner saved.
#[derive(Debug, Default)]
struct Saved {
    file_size: Option<u64>,
    /// The checkpoint file's bytes, if the document holds them.
    file_bytes: Option<Vec<u8>>,
    dir_files: usize,
    dir_bytes: u64,
    /// The directory's files, relative to it, with their sizes.
    dir_listing: Vec<(String, u64)>,
    /// The file table is in a blob (many files): not read here.
    in_a_blob: bool,
}

impl Saved {
    fn of(progress: &Value) -> Option<Saved> {
        let manifest = match Manifest::from_progress(progress) {
            Some(manifest) => manifest.ok()?,
            // An older runner's whole file in base64.
            None => {
                let bytes = spot_worker_command::from_progress(progress).ok()?;
                return Some(Saved {
                    file_size: Some(bytes.len() as u64),
                    file_bytes: Some(bytes),
                    ..Saved::default()
                });
            }
        };
        let mut saved = Saved::default();
        match &manifest.files {
            Files::Table(_) => saved.in_a_blob = true,
            Files::Listed(files) => files.iter().for_each(|file| saved.add(file)),
        }
        Some(saved)
    }

    fn add(&mut self, file: &FileEntry) {
        if file.path == FILE_ROOT {
            self.file_size = Some(file.size);
            if let Content::Inline(bytes) = &file.content {
                self.file_bytes = Some(bytes.clone());
            }
        } else if let Some(relative) = file.path.strip_prefix(DIR_ROOT) {
            self.dir_files += 1;
            self.dir_bytes += file.size;
            self.dir_listing.push((relative.to_owned(), file.size));
        }
    }
}

/// A checkpoint file, for a person: its text if it is UTF-8, else its size
/// and its first bytes in hex.
fn describe_file(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!(
            "checkpoint file of {} byte(s) saved by `spot-worker run`, as text:\n{text}",
            bytes.len()
        ),
        Err(_) => {
            let shown = &bytes[..bytes.len().min(HEX_SHOWN)];
            let mut out = format!(
                "checkpoint file of {} byte(s) saved by `spot-worker run`, not UTF-8 text; {}:",
                bytes.len(),
                if shown.len() < bytes.len() {
                    format!("its first {} in hex", shown.len())
                } else {
                    "in hex".to_owned()
                }
            );
            for (row, chunk) in shown.chunks(16).enumerate() {
                let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
                out.push_str(&format!("\n{:08x}  {}", row * 16, hex.join(" ")));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use spot_worker_storage::files::manifest::ChunkRef;

    use super::*;

    fn manifest(files: Vec<FileEntry>) -> Value {
        Manifest {
            prefix: "0".repeat(32),
            files: Files::Listed(files),
        }
        .to_progress()
    }

    fn entry(path: &str, content: Content) -> FileEntry {
        let size = match &content {
            Content::Inline(bytes) => bytes.len() as u64,
            _ => 5 << 20,
        };
        FileEntry {
            path: path.to_owned(),
            size,
            content,
        }
    }

    #[test]
    fn a_saved_checkpoint_file_is_shown_as_text_or_hex() {
        let text = describe_file(b"cursor=10\n");
        assert!(text.ends_with("as text:\ncursor=10\n"), "{text}");
        assert!(text.contains("10 byte(s)"), "{text}");
        let binary = describe_file(&[0xff, 0x00, 0x41]);
        assert!(binary.contains("3 byte(s)"), "{binary}");
        assert!(binary.contains("not UTF-8 text; in hex:"), "{binary}");
        assert!(binary.ends_with("00000000  ff 00 41"), "{binary}");
        let long = describe_file(&[0x80; 100]);
        assert!(long.contains("its first 64 in hex"), "{long}");
        assert_eq!(long.lines().count(), 5, "{long}");
    }

    #[test]
    fn the_runners_checkpoints_are_said_in_words() {
        let chunk = ChunkRef {
            hash: [1; 32],
            len: 5 << 20,
            generation: 7,
        };
        let rows = [
            (
                manifest(vec![entry("file", Content::Inline(b"n=1\n".to_vec()))]),
                "checkpoint file 4 bytes",
                "checkpoint file of 4 byte(s) saved by `spot-worker run`, as text:\nn=1\n",
            ),
            (
                manifest(vec![
                    entry("dir/a/b", Content::Inline(b"xy".to_vec())),
                    entry("file", Content::Chunks(vec![chunk])),
                ]),
                "checkpoint file 5242880 bytes, directory 1 files 2 bytes",
                "checkpoint file of 5242880 byte(s) saved by `spot-worker run` in chunks\n\
                 checkpoint directory of 1 file(s), 2 byte(s):\n  a/b  2 byte(s)",
            ),
            (
                spot_worker_command::to_progress(b"old"),
                "checkpoint file 3 bytes",
                "checkpoint file of 3 byte(s) saved by `spot-worker run`, as text:\nold",
            ),
        ];
        for (progress, line, shown) in rows {
            assert_eq!(one_line(&progress, 80), line);
            assert_eq!(describe(&progress).unwrap(), shown);
        }
        let theirs = json!({"cursor": 12});
        assert_eq!(one_line(&theirs, 80), "{\"cursor\":12}");
        assert!(describe(&theirs).is_none());
        let cut = one_line(
            &manifest(vec![entry("file", Content::Inline(vec![0; 9]))]),
            10,
        );
        assert_eq!(cut, "checkpoint…");
    }
}
