//! The invariants a fault search checks, read straight from the store
//! doubles (beneath the faults): what is stored is what a fleet's
//! operator would see.

use std::sync::{Mutex, PoisonError};

use serde_json::Value;
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::{Checkpoint, InMemoryCheckpointStore};

/// Invariant (a): every chunk the stored manifest of `key` names exists
/// (a manifest whose file table is a blob of its own: that blob exists).
pub fn manifest_chunks_exist(store: &InMemoryCheckpointStore, key: &str) -> Result<(), String> {
    let Some(Checkpoint::InProgress { progress }) = store.get(key) else {
        return Ok(());
    };
    let names = stored_names(&progress, key)?;
    chunks_exist(store, key, &names)
}

/// Invariant (a) as [`manifest_chunks_exist`] checks it, for a check run
/// after every store call: the names a stored manifest holds are read
/// again only when the manifest changed (parsing it was most of a
/// check's time, a tenth of a seed's), and every name is looked up in
/// the chunk store every time, as before.
pub struct ManifestChunksExist {
    store: InMemoryCheckpointStore,
    key: String,
    /// The manifest last read, and what it holds.
    last: Mutex<Option<(Value, Names)>>,
}

/// The names a stored manifest holds, or why it does not read.
type Names = Result<Vec<String>, String>;

impl ManifestChunksExist {
    /// Checks the stored manifest of `key` in `store`.
    pub fn new(store: InMemoryCheckpointStore, key: impl Into<String>) -> Self {
        ManifestChunksExist {
            store,
            key: key.into(),
            last: Mutex::new(None),
        }
    }

    /// `Err` names the chunks gone, or says the manifest does not read.
    pub fn check(&self) -> Result<(), String> {
        let Some(Checkpoint::InProgress { progress }) = self.store.get(&self.key) else {
            return Ok(());
        };
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let names = match last.as_ref() {
            Some((read, names)) if *read == progress => names,
            _ => {
                let names = stored_names(&progress, &self.key);
                &last.insert((progress, names)).1
            }
        };
        chunks_exist(
            &self.store,
            &self.key,
            names.as_ref().map_err(Clone::clone)?,
        )
    }
}

/// The names the manifest in `progress` holds (none if it is not a
/// manifest).
fn stored_names(progress: &Value, key: &str) -> Names {
    match Manifest::from_progress(progress) {
        None => Ok(Vec::new()),
        Some(Ok(manifest)) => Ok(named_chunks(&manifest)),
        Some(Err(error)) => Err(format!(
            "the stored manifest of {key} is unreadable: {error}"
        )),
    }
}

/// `Err` if any of `names` is not in `store`'s chunk store.
fn chunks_exist(
    store: &InMemoryCheckpointStore,
    key: &str,
    names: &[String],
) -> Result<(), String> {
    // One look-up a name, not a copy of every name stored: this runs
    // after every store call of every seed.
    let stored = store.chunk_store();
    let missing = names
        .iter()
        .filter(|name| stored.modified(name).is_none())
        .collect::<Vec<_>>();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "(a) the stored manifest of {key} names {} chunk(s) that are gone, first {}",
            missing.len(),
            missing[0]
        ))
    }
}

/// The chunk (and page, and table) names `manifest` names directly.
pub fn named_chunks(manifest: &Manifest) -> Vec<String> {
    let prefix = &manifest.prefix;
    match &manifest.files {
        Files::Table(table) => vec![table.name(prefix)],
        Files::Listed(entries) => entries
            .iter()
            .flat_map(|entry| match &entry.content {
                Content::Inline(_) => Vec::new(),
                Content::Chunks(chunks) => chunks.iter().map(|c| c.name(prefix)).collect(),
                Content::Pages(pages) => pages.iter().map(|p| p.chunk.name(prefix)).collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spot_worker_storage::JobCheckpoint;
    use spot_worker_storage::files::CheckpointFiles;
    use spot_worker_storage::files::ChunkStore;

    use super::*;

    /// The names of the chunks the stored manifest of `key` holds.
    fn stored_chunks(memory: &InMemoryCheckpointStore, key: &str) -> Vec<String> {
        let Some(Checkpoint::InProgress { progress }) = memory.get(key) else {
            panic!("no manifest stored");
        };
        named_chunks(&Manifest::from_progress(&progress).unwrap().unwrap())
    }

    /// The cached check sees a chunk deleted while the manifest stays the
    /// same, and a manifest changed since it last read one.
    #[test]
    fn the_cached_check_sees_every_change() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let memory = InMemoryCheckpointStore::new();
            let check = ManifestChunksExist::new(memory.clone(), "job");
            assert_eq!(check.check(), Ok(()));
            let dir = tempfile::tempdir().unwrap();
            let mut handle = JobCheckpoint::load(Arc::new(memory.clone()), "job")
                .await
                .unwrap();
            let mut seen = Vec::new();
            for value in [7u8, 8] {
                std::fs::write(dir.path().join("a"), vec![value; 60 * 1024]).unwrap();
                handle
                    .save_files(&CheckpointFiles::dir(dir.path()))
                    .await
                    .unwrap();
                assert_eq!(check.check(), Ok(()));
                let names = stored_chunks(&memory, "job");
                assert_eq!(names.len(), 1, "{names:?}");
                assert!(!seen.contains(&names[0]), "{names:?} {seen:?}");
                seen.push(names[0].clone());
            }
            // The manifest is the one the check read last; its chunk goes.
            let name = &seen[1];
            memory.chunk_store().delete(name).await.unwrap();
            let broken = check.check().unwrap_err();
            assert!(broken.contains(name.as_str()), "{broken}");
            assert_eq!(Err(broken), manifest_chunks_exist(&memory, "job"));
        });
    }
}
