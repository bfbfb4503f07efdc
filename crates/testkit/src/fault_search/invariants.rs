//! The invariants a fault search checks, read straight from the store
//! doubles (beneath the faults): what is stored is what a fleet's
//! operator would see.

use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::{Content, Files};
use spot_worker_storage::{Checkpoint, InMemoryCheckpointStore};

/// Invariant (a): every chunk the stored manifest of `key` names exists
/// (a manifest whose file table is a blob of its own: that blob exists).
pub fn manifest_chunks_exist(store: &InMemoryCheckpointStore, key: &str) -> Result<(), String> {
    let Some(Checkpoint::InProgress { progress }) = store.get(key) else {
        return Ok(());
    };
    let manifest = match Manifest::from_progress(&progress) {
        None => return Ok(()),
        Some(Ok(manifest)) => manifest,
        Some(Err(error)) => {
            return Err(format!(
                "the stored manifest of {key} is unreadable: {error}"
            ));
        }
    };
    // One look-up a name, not a copy of every name stored: this runs
    // after every store call of every seed.
    let stored = store.chunk_store();
    let missing = named_chunks(&manifest)
        .into_iter()
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
