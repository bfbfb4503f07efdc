//! One save, on its own task: stage the checkpoint's chunks (live SQLite
//! databases as consistent copies), weigh the commit marker and what the
//! save costs the program, then commit its manifest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use spot_worker_storage::files::{CheckpointFiles, SaveFilesError, SaveStats};
use spot_worker_storage::{Blocking, Committed, JobCheckpoint, StorageError};
use tokio::time::Instant;

use crate::settle::{AtMarker, MarkerStamp, at_marker, database_copy_changed};
use crate::store_refusal::{AfterStoreError, after_store_error};
use crate::trouble::kind_of;
use crate::version_files::SavedFiles;
use crate::write_time::{Unmeasured, version_modified, written_at};
use spot_worker_storage::SaveTroubleKind;

use super::{Done, Marker, Save, SaveContext};
use crate::version_files::FileVersion;

/// One save: stage the checkpoint's chunks, then commit its manifest.
pub(super) async fn save_once(
    checkpoint: &mut JobCheckpoint,
    context: &SaveContext,
    key: &str,
) -> Result<Done, String> {
    let started = std::time::Instant::now();
    let later = |skipped, trouble: Option<(SaveTroubleKind, String)>| Done {
        save: Save::Later,
        file: None,
        marker: None,
        files: None,
        skipped,
        stats: SaveStats::default(),
        // Store errors come with their secrets removed by the backend
        // (`StorageError`'s messages are redacted where they are made).
        trouble,
    };
    let unsettled = Done {
        save: Save::Unsettled,
        ..later(Vec::new(), None)
    };
    let unchanged = Done {
        save: Save::Unchanged,
        ..later(Vec::new(), None)
    };
    // With a commit marker, nothing is read until the program has written
    // a new one.
    if let Some(marker) = &context.marker {
        let now = tokio::fs::symlink_metadata(&marker.path)
            .await
            .ok()
            .map(|meta| MarkerStamp::of(&meta));
        if now.is_none() || now == marker.saved {
            return Ok(unchanged);
        }
    }
    // A live database is read from a consistent copy; the copies go
    // when this save is done with them.
    let (roots, copies) = match consistent_databases(context).await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(job_key = %key, %error, "a SQLite database in the checkpoint directory could not be backed up, so the checkpoint is not saved this time; trying again later");
            return Ok(later(
                Vec::new(),
                Some((SaveTroubleKind::Unreadable, error)),
            ));
        }
    };
    let staged = match checkpoint.stage_files(&roots, context.limit).await {
        Ok(staged) => staged,
        Err(error @ SaveFilesError::TooBig { .. }) => {
            return Err(format!("{error} (SPOT_WORKER_CHECKPOINT_MAX_BYTES)"));
        }
        Err(error @ (SaveFilesError::TooMany { .. } | SaveFilesError::BadPath { .. })) => {
            return Err(error.to_string());
        }
        Err(SaveFilesError::Unstable) => {
            tracing::debug!(job_key = %key, "the checkpoint changed while it was read; read again shortly");
            return Ok(unsettled);
        }
        Err(SaveFilesError::Storage(error)) => {
            if let AfterStoreError::Fail(reason) = after_store_error(&error) {
                return Err(reason);
            }
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            return Ok(later(
                Vec::new(),
                Some((kind_of(&error), error.to_string())),
            ));
        }
        Err(error) => {
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            return Ok(later(
                Vec::new(),
                Some((SaveTroubleKind::Unreadable, error.to_string())),
            ));
        }
    };
    let skipped = staged.skipped().to_vec();
    let marker = match &context.marker {
        None => None,
        Some(marker) => match marker_rule(&staged, marker, &copies.as_of) {
            AtMarker::Take(stamp) => Some(stamp),
            AtMarker::NoMarker | AtMarker::Unchanged => return Ok(unchanged),
            AtMarker::WrittenSince(path) => {
                tracing::debug!(job_key = %key, %path, "the checkpoint directory was written after its commit marker; read again shortly");
                return Ok(unsettled);
            }
        },
    };
    if staged.is_empty() {
        return Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker: None,
            files: None,
            skipped,
            stats: staged.stats,
            trouble: None,
        });
    }
    let file = staged
        .versions()
        .iter()
        .find(|(path, _)| path == "file")
        .map(|(_, meta)| FileVersion::of(meta));
    let files = SavedFiles::of(staged.versions());
    let mut blocking = blocking(&staged, context).await;
    if context.awaited {
        blocking.written_before += started.elapsed();
    }
    // Both clocks at once, to put the version's modification time on the
    // monotonic one.
    let clocks = (std::time::SystemTime::now(), Instant::now());
    let written = version_written_at(&staged, context.written_after, clocks);
    let after_stop = context.written_after.is_some()
        || matches!((written, context.stopped_at), (Some(written), Some(stopped)) if written >= stopped);
    let written_at = crate::kept_until::kept_until(context.awaited, after_stop, written, clocks.1);
    let stats = staged.stats;
    match checkpoint.commit_files(staged, blocking, written_at).await {
        Ok(Committed::Saved(stats)) => {
            tracing::debug!(job_key = %key, bytes = stats.bytes, sent_bytes = stats.sent_bytes, sent_blobs = stats.sent_blobs, took_ms = stats.took.as_millis() as u64, written_in = ?blocking.written_before, "checkpoint saved");
            Ok(Done {
                save: Save::Saved,
                file,
                marker,
                files: Some(files),
                skipped,
                stats,
                trouble: None,
            })
        }
        Ok(Committed::Unchanged) => Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker,
            files: None,
            skipped,
            stats,
            trouble: None,
        }),
        // Released or lost: the next holder resumes from the last save.
        Err(StorageError::JobCancelled { .. }) => Ok(Done {
            save: Save::Unchanged,
            file: None,
            marker: None,
            files: None,
            skipped,
            stats,
            trouble: None,
        }),
        Err(error @ StorageError::Conflict { .. }) => Err(format!(
            "saving its checkpoint lost to another holder of the job: {error}"
        )),
        Err(error) => {
            if let AfterStoreError::Fail(reason) = after_store_error(&error) {
                return Err(reason);
            }
            tracing::warn!(job_key = %key, %error, "the checkpoint could not be saved; trying again later");
            Ok(later(skipped, Some((kind_of(&error), error.to_string()))))
        }
    }
}

/// The save's roots, every SQLite database in the checkpoint directory
/// standing in as a consistent copy ([`crate::sqlite_version`]), on the
/// blocking pool.
async fn consistent_databases(
    context: &SaveContext,
) -> Result<(CheckpointFiles, crate::sqlite_version::Copies), String> {
    let (roots, scratch) = (context.roots.clone(), context.scratch.clone());
    tokio::task::spawn_blocking(move || {
        crate::sqlite_version::with_consistent_databases(&roots, &scratch)
    })
    .await
    .map_err(|e| format!("the backup of a SQLite database ended: {e}"))?
    .map_err(|e| e.to_string())
}

/// The marker rule ([`at_marker`]) for the version `staged` read: the
/// directory's files, each with its change time, against the marker read
/// with them. The checkpoint file (`SPOT_WORKER_CHECKPOINT`) is a version
/// of its own (renamed whole) and is not weighed; a live database's copy
/// (one of `databases`) is weighed by when it was made and the last commit
/// it holds ([`database_copy_changed`]), not by its file's times alone.
fn marker_rule(
    staged: &spot_worker_storage::files::Staged,
    marker: &Marker,
    databases: &std::collections::BTreeMap<String, std::time::SystemTime>,
) -> AtMarker {
    let versions = staged.versions();
    let read = versions
        .iter()
        .find(|(path, _)| *path == marker.listed)
        .map(|(_, meta)| MarkerStamp::of(meta));
    let others = versions
        .iter()
        .filter(|(path, _)| *path != marker.listed && path != "file")
        .map(|(path, meta)| {
            let changed = match (read, databases.get(path)) {
                (Some(marker), Some(as_of)) => {
                    database_copy_changed(meta, Some(*as_of), marker.changed())
                }
                _ => crate::settle::changed(meta),
            };
            (path.as_str(), changed)
        });
    at_marker(read, marker.saved, others)
}

/// What saving the version `staged` read blocks: what writing it cost the
/// program ([`save_cost`](crate::save_cost::save_cost): the span of the
/// files it wrote whole, never the age of a file written in place), and
/// the upload if awaited. A write that cannot be measured makes the
/// upload's own time the cost, as if the program had waited for it, said
/// once per runner in the log.
async fn blocking(staged: &spot_worker_storage::files::Staged, context: &SaveContext) -> Blocking {
    let versions = staged.versions().to_vec();
    let saved = context.saved_files.clone();
    let roots = context.paths.clone();
    let saved_file = context.saved_file;
    // Reads the first bytes of new files (is it a database?): off the
    // runtime's threads.
    let files = tokio::task::spawn_blocking(move || {
        let mut files = crate::version_files::version_files(&versions, &saved, &roots);
        // The file restored at the delivery's start counts as saved.
        for ((path, meta), file) in versions.iter().zip(files.iter_mut()) {
            file.saved_before |= path == "file" && saved_file == Some(FileVersion::of(meta));
        }
        files
    })
    .await;
    let program_started = std::time::SystemTime::now()
        .checked_sub(context.ran_for)
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    // The runner holds none of the program's writes (yet): nothing to add.
    let held = Duration::ZERO;
    let Ok(files) = files else {
        // The runtime is shutting down: the upload stands for the write.
        return Blocking::CALL;
    };
    match crate::save_cost::save_cost(&files, program_started, held) {
        Ok(written_before) => Blocking {
            written_before,
            awaited: context.awaited,
        },
        Err(why) => {
            unmeasured_once(why);
            Blocking::CALL
        }
    }
}

/// When the version `staged` read was written, on the monotonic clock
/// (`clocks`: the wall clock and the monotonic one, read together): what
/// saving it keeps of the program's work ([`written_at`]), however it is
/// uploaded, in chunks or whole. The checkpoint file's modification time
/// if there is one (the contract's version: the program renames it over
/// the path once its state is complete). A checkpoint directory alone has
/// no such mark of a complete version (the program writes its files one
/// by one, and nothing says which was last), so its newest modification
/// time among the files read stands for it: nothing in the version is
/// younger.
///
/// A version new since the stop signal (`written_after`) was written
/// after it, whatever its modification time says: a file system stamps
/// times from a clock that ticks only every few milliseconds, and a
/// program that saves on the signal may well do so within the tick.
/// `None` for a time the clock cannot tell: the save then keeps the work
/// up to its call.
fn version_written_at(
    staged: &spot_worker_storage::files::Staged,
    written_after: Option<Instant>,
    (wall_now, now): (std::time::SystemTime, Instant),
) -> Option<Instant> {
    let modified = version_modified(
        staged
            .versions()
            .iter()
            .map(|(path, meta)| (path.as_str(), meta.modified().ok())),
    )?;
    let mapped = written_at(modified, wall_now, now)?;
    Some(written_after.map_or(mapped, |after| mapped.max(after)))
}

/// Says once per runner and reason why a program's checkpoint writes are
/// not measured: the cost the interval and the ledger use is then the
/// upload's time.
fn unmeasured_once(why: Unmeasured) {
    static SAID: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let slot = match why {
        Unmeasured::NoBirthTime => 0,
        Unmeasured::TimesOutOfOrder => 1,
    };
    if !SAID[slot].swap(true, Ordering::Relaxed) {
        tracing::warn!(reason = %why, "how long the program takes to write its checkpoint file is not measured; the upload's time stands for it (docs/checkpoint-interval.md)");
    }
}
