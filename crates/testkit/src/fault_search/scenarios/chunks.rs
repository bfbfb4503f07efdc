//! Two holders of one job saving its checkpoint files through real
//! [`JobCheckpoint`] handles (stage, commit, the clean-up beside), each
//! delivery resuming from what is stored, while their leases run out,
//! they stop at any point and the stores lose answers. Checked after every
//! step: (a) every chunk the stored manifest names exists, and (e) no
//! restore of the job's checkpoint fails (a failed restore is counted as
//! a handler failure, towards poison).
//!
//! With [`Restores::Racing`], a delivery reads the job's checkpoint in one
//! step and restores its files in a later one, so the other holder's
//! commits and clean-up can run in between (issue 37 item 2).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_storage::files::{CheckpointFiles, Staged, TransferLimits};
use spot_worker_storage::{
    Blocking, CheckpointStore, InMemoryCheckpointStore, JobCheckpoint, StorageError,
};
use tokio_util::sync::CancellationToken;

use crate::fault_search::{FaultPlan, Faulty, ManifestChunksExist, manifest_chunks_exist};

/// The job both holders run.
const JOB: &str = "job-1";
/// The files of its checkpoint, each over the inline limit (one chunk
/// each), so a save sends or reuses several chunks.
const FILES: [&str; 3] = ["a", "b", "c"];
/// Each file's size: over `files::INLINE_MAX`, under `MIN_CHUNK`.
const FILE_BYTES: usize = 50 * 1024;
/// Steps one run takes.
const STEPS: usize = 40;

/// Whether a delivery reads its checkpoint and restores from it at once,
/// or with other steps in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restores {
    /// Read and restore in one step.
    AtOnce,
    /// Read in one step, restore in a later one.
    Racing,
}

/// One holder of the job: its current delivery, if it runs.
struct Holder {
    name: &'static str,
    delivery: Option<Delivery>,
}

struct Delivery {
    handle: JobCheckpoint,
    lease: CancellationToken,
    dir: tempfile::TempDir,
    restored: bool,
    staged: Option<Staged>,
}

/// Runs the scenario for `plan`'s seed.
pub async fn run(plan: FaultPlan, restores: Restores) {
    let memory = InMemoryCheckpointStore::new();
    let store: Arc<dyn CheckpointStore> =
        Arc::new(Faulty::new(memory.clone(), &plan, "checkpoints"));
    let checked = ManifestChunksExist::new(memory.clone(), JOB);
    plan.check(move || checked.check());
    let mut holders = [
        Holder {
            name: "A",
            delivery: None,
        },
        Holder {
            name: "B",
            delivery: None,
        },
    ];
    for _ in 0..STEPS {
        let holder = &mut holders[plan.pick(0..2) as usize];
        let action = plan.pick(0..100);
        // A process stops at any point: this step is cut off after a
        // random time (its calls may be delayed past it).
        let stop_after = plan
            .chance(10)
            .then(|| Duration::from_millis(plan.pick(0..20_000)));
        let step = step(&plan, &store, &memory, holder, action, restores);
        match stop_after {
            None => step.await,
            Some(after) => {
                if tokio::time::timeout(after, step).await.is_err() {
                    plan.note(format!("{} stops mid-step after {after:?}", holder.name));
                    holder.delivery = None;
                }
            }
        }
        // What the step spawned beside (chunk clean-up) runs now.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Every clean-up still under way ends (the longest delay is a minute).
    tokio::time::sleep(Duration::from_secs(600)).await;
    plan.after_step();
}

async fn step(
    plan: &FaultPlan,
    store: &Arc<dyn CheckpointStore>,
    memory: &InMemoryCheckpointStore,
    holder: &mut Holder,
    action: u64,
    restores: Restores,
) {
    let name = holder.name;
    let Some(delivery) = holder.delivery.as_mut() else {
        plan.note(format!("{name}: a new delivery reads the checkpoint"));
        holder.delivery = deliver(plan, store, name).await;
        if restores == Restores::AtOnce
            && let Some(delivery) = holder.delivery.as_mut()
            && !restore(plan, memory, name, delivery, restores).await
        {
            holder.delivery = None;
        }
        return;
    };
    if !delivery.restored {
        if !restore(plan, memory, name, delivery, restores).await {
            holder.delivery = None;
        }
        return;
    }
    match action {
        0..10 => {
            plan.note(format!("{name}: its lease runs out"));
            delivery.lease.cancel();
        }
        10..15 => {
            plan.note(format!("{name}: the delivery ends"));
            holder.delivery = None;
        }
        15..45 => {
            let file = FILES[plan.pick(0..FILES.len() as u64) as usize];
            let value = plan.pick(0..4) as u8;
            plan.note(format!("{name}: the job writes {file} = {value}"));
            write_file(delivery.dir.path(), file, value);
        }
        45..65 => {
            plan.note(format!("{name}: stages its files"));
            let roots = CheckpointFiles::dir(delivery.dir.path());
            match delivery.handle.stage_files(&roots, u64::MAX).await {
                Ok(staged) => delivery.staged = Some(staged),
                Err(error) => plan.note(format!("{name}: staging failed: {error}")),
            }
        }
        65..85 => {
            let Some(staged) = delivery.staged.take() else {
                return;
            };
            plan.note(format!("{name}: commits what it staged"));
            let committed = delivery
                .handle
                .commit_files(staged, Blocking::CALL, None)
                .await;
            end_if_fenced(plan, holder, committed.err());
        }
        _ => {
            plan.note(format!("{name}: saves its files"));
            // One save at a time, as every caller has it: a staging held
            // is abandoned. (Committing a staging older than a later
            // commit points the checkpoint back at chunks that commit
            // cleaned up; no caller does it, the API does not refuse it.)
            delivery.staged = None;
            let roots = CheckpointFiles::dir(delivery.dir.path());
            let saved = delivery.handle.save_files(&roots).await;
            let error = saved.err().map(|error| error.to_string());
            if let Some(error) = &error {
                plan.note(format!("{name}: the save failed: {error}"));
            }
        }
    }
}

/// A new delivery of the job: its handle on the stored checkpoint.
async fn deliver(
    plan: &FaultPlan,
    store: &Arc<dyn CheckpointStore>,
    name: &str,
) -> Option<Delivery> {
    let lease = CancellationToken::new();
    let handle = match JobCheckpoint::load(Arc::clone(store), JOB).await {
        // One transfer at a time: with several, which uploads are under
        // way when one fails depends on the blocking threads that read the
        // files, and a seed would not replay exactly.
        Ok(handle) => handle
            .fenced_by(lease.clone())
            .with_transfer_limits(TransferLimits::with_concurrency(1)),
        Err(error) => {
            plan.note(format!("{name}: the read failed ({error}); released"));
            return None;
        }
    };
    let dir = match scratch_dir() {
        Ok(dir) => dir,
        Err(error) => {
            plan.broken(format!("no temporary directory: {error}"));
            return None;
        }
    };
    // Its files are written when the restore finds nothing stored: a
    // restore replaces them, and nothing reads them before it.
    Some(Delivery {
        handle,
        lease,
        dir,
        restored: false,
        staged: None,
    })
}

/// Restores the delivery's files from the checkpoint its handle read.
/// A transient failure releases the job (no failure counted); any other
/// is counted as a handler failure, which (e) forbids.
///
/// Returns whether the delivery goes on.
async fn restore(
    plan: &FaultPlan,
    memory: &InMemoryCheckpointStore,
    name: &str,
    delivery: &mut Delivery,
    restores: Restores,
) -> bool {
    let fresh = match scratch_dir() {
        Ok(dir) => dir,
        Err(error) => {
            plan.broken(format!("no temporary directory: {error}"));
            return false;
        }
    };
    let roots = CheckpointFiles::dir(fresh.path());
    match delivery.handle.restore_files(&roots).await {
        Ok(Some(_)) => {
            plan.note(format!("{name}: restored the job's files"));
            delivery.dir = fresh;
            delivery.restored = true;
        }
        Ok(None) => {
            plan.note(format!("{name}: nothing to restore"));
            // The job starts from scratch.
            for file in FILES {
                write_file(delivery.dir.path(), file, 0);
            }
            delivery.restored = true;
        }
        Err(error) if error.is_transient() => {
            plan.note(format!("{name}: the restore failed ({error}); retried"));
            if restores == Restores::AtOnce {
                // The handler gives up; the job is released and read anew.
                return false;
            }
        }
        Err(error) => {
            // The job's stored checkpoint may be whole (then this is a
            // race the reader lost), or broken (then (a) says so too).
            let stored = manifest_chunks_exist(memory, JOB).map_or(
                "the stored checkpoint is broken",
                |()| "the stored checkpoint is whole",
            );
            plan.broken(format!(
                "(e) {name}'s restore failed and would count as a failure ({stored}): {error}"
            ));
            return false;
        }
    }
    true
}

/// A fenced save means the delivery is over (another holder won, or the
/// lease ran out): the holder drops it, as a handler returns.
fn end_if_fenced(plan: &FaultPlan, holder: &mut Holder, error: Option<StorageError>) {
    let Some(error) = error else {
        return;
    };
    plan.note(format!("{}: the commit failed: {error}", holder.name));
    if matches!(
        error,
        StorageError::Conflict { .. } | StorageError::JobCancelled { .. }
    ) {
        holder.delivery = None;
    }
}

/// A directory of the job's files: in memory (`/dev/shm`) where there is
/// one, since creating files on a busy disk is most of a seed's time
/// there (thousands of seeds create tens of thousands of files).
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new()
            .prefix("spot-worker-fault-search")
            .tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::tempdir()
}

/// Writes `file` with content made from `value` alone, so both holders
/// writing one value make the same chunk.
fn write_file(dir: &Path, file: &str, value: u8) {
    // A write that fails leaves the old content: the save sends that.
    let _ = std::fs::write(dir.join(file), content(file, value));
}

/// The content of `file` at `value`: made once per process (every seed
/// writes the same few), since building it unoptimised was a tenth of a
/// seed's time.
fn content(file: &str, value: u8) -> &'static [u8] {
    use std::sync::OnceLock;
    const VALUES: usize = 4;
    static CONTENTS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let contents = CONTENTS.get_or_init(|| {
        FILES
            .iter()
            .flat_map(|file| (0..VALUES as u8).map(move |value| make(file, value)))
            .collect()
    });
    let at =
        FILES.iter().position(|f| *f == file).unwrap_or(0) * VALUES + usize::from(value) % VALUES;
    &contents[at]
}

fn make(file: &str, value: u8) -> Vec<u8> {
    let seed = file.as_bytes()[0].wrapping_mul(31).wrapping_add(value);
    let pattern: Vec<u8> = (0..251u8).map(|i| seed.wrapping_add(i)).collect();
    let mut content = Vec::with_capacity(FILE_BYTES);
    while content.len() < FILE_BYTES {
        let take = pattern.len().min(FILE_BYTES - content.len());
        content.extend_from_slice(&pattern[..take]);
    }
    content
}
