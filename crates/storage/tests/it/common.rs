//! What the store's integration tests share: saving a directory as a job's
//! checkpoint files.

use std::path::Path;

use spot_worker_storage::JobCheckpoint;
use spot_worker_storage::files::{CheckpointFiles, SaveFilesError, SaveStats};

/// Saves the files under `dir` as `checkpoint`'s.
pub async fn save_dir(
    checkpoint: &mut JobCheckpoint,
    dir: &Path,
) -> Result<SaveStats, SaveFilesError> {
    checkpoint.save_files(&CheckpointFiles::dir(dir)).await
}
