//! [`ChunkIndex`]: the chunks a manifest names, by what their names are
//! made of, kept compact (20 bytes a chunk, sorted) so a save can ask
//! "is this content stored already?" and, once a newer manifest is
//! written, list what the older one alone named.

use std::collections::HashSet;

use super::manifest::{ChunkKey, name_of};

/// The chunks, pages and file table one manifest names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChunkIndex {
    pub(crate) prefix: String,
    /// Chunks, sorted.
    chunks: Vec<ChunkKey>,
    /// Pages and the file table.
    blobs: Vec<ChunkKey>,
}

impl ChunkIndex {
    pub(crate) fn new(prefix: String, mut chunks: Vec<ChunkKey>, blobs: Vec<ChunkKey>) -> Self {
        chunks.sort_unstable();
        chunks.dedup();
        ChunkIndex {
            prefix,
            chunks,
            blobs,
        }
    }

    /// The save that stored content whose hash starts with `short`, if
    /// this manifest names it.
    pub(crate) fn generation_of(&self, short: &[u8; 16]) -> Option<u32> {
        let at = self.chunks.partition_point(|(key, _)| key < short);
        self.chunks
            .get(at)
            .filter(|(key, _)| key == short)
            .map(|(_, generation)| *generation)
    }

    /// The page or table blob with this hash, if this manifest names one.
    pub(crate) fn blob_generation(&self, short: &[u8; 16]) -> Option<u32> {
        self.blobs
            .iter()
            .find(|(key, _)| key == short)
            .map(|(_, generation)| *generation)
    }

    /// Every name this manifest uses.
    pub(crate) fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.chunks
            .iter()
            .chain(&self.blobs)
            .map(|key| name_of(&self.prefix, *key))
    }

    /// The names `self` uses that `newer` does not (under the same prefix).
    pub(crate) fn dropped_by(&self, newer: &ChunkIndex) -> Vec<String> {
        if self.prefix != newer.prefix {
            return self.names().collect();
        }
        let kept: HashSet<&ChunkKey> = newer.blobs.iter().collect();
        self.chunks
            .iter()
            .filter(|key| newer.chunks.binary_search(key).is_err())
            .chain(self.blobs.iter().filter(|key| !kept.contains(key)))
            .map(|key| name_of(&self.prefix, *key))
            .collect()
    }

    /// Whether `key` is one of its names.
    pub(crate) fn names_key(&self, key: &ChunkKey) -> bool {
        self.chunks.binary_search(key).is_ok() || self.blobs.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_older_manifest_alone_named() {
        let old = ChunkIndex::new(
            "p".into(),
            vec![([1; 16], 1), ([2; 16], 1)],
            vec![([9; 16], 1)],
        );
        let new = ChunkIndex::new(
            "p".into(),
            vec![([2; 16], 1), ([3; 16], 2)],
            vec![([8; 16], 2)],
        );
        assert_eq!(old.generation_of(&[2; 16]), Some(1));
        assert_eq!(old.generation_of(&[3; 16]), None);
        let dropped = old.dropped_by(&new);
        assert_eq!(
            dropped,
            [name_of("p", ([1; 16], 1)), name_of("p", ([9; 16], 1))]
        );
        assert!(new.names_key(&([3; 16], 2)));
    }
}
