//! Two holders of one job writing its large results at once, each
//! through its delivery's [`FencedResults`] over the in-memory result
//! store, which stages blocks the way blob storage does (uncommitted
//! blocks belong to the blob; a commit names its list of ids). Every store
//! call may fail before it applies or lose its answer, a hold runs out at
//! a random time (the fence closes mid-upload), a holder stops between
//! any two calls and a later delivery writes again. Checked after every
//! step: (c) a stored result is entirely one writer's bytes; and (e) no
//! write ends in an error that would count as a failure (a conflict is
//! the duplicate's settlement; transient errors and a closed fence
//! release the job).

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_storage::{
    BlockResults, CancellationToken, FencedResults, InMemoryResultStore, PutOutcome, ResultStore,
    StorageError,
};

use crate::fault_search::{FaultPlan, Faulty};

/// The job both holders run.
const JOB: &str = "job-1";
/// The results each delivery writes.
const RESULTS: [&str; 2] = ["job-1/out-1.bin", "job-1/out-2.bin"];
/// The store's block size: small, so a result is several blocks.
const BLOCK: u64 = 16;
/// Each result's size: four whole blocks and a short one.
const RESULT_BYTES: usize = 4 * BLOCK as usize + 5;
/// Deliveries each holder gets at most.
const DELIVERIES: u64 = 8;

/// Runs the scenario for `plan`'s seed.
pub async fn run(plan: FaultPlan) {
    let memory = InMemoryResultStore::new("results").with_block_size(BLOCK);
    let store: Arc<dyn ResultStore> =
        Arc::new(BlockResults(Faulty::new(memory.clone(), &plan, "results")));
    let checked = memory.clone();
    plan.check(move || {
        RESULTS
            .iter()
            .try_for_each(|name| one_writer(&checked, name))
    });
    let holders = ["A", "B"].map(|name| {
        let (plan, store) = (plan.clone(), Arc::clone(&store));
        tokio::spawn(async move { holder(&plan, &store, name).await })
    });
    for holder in holders {
        if let Err(error) = holder.await {
            plan.broken(format!("a holder panicked: {error}"));
        }
    }
    plan.after_step();
}

/// Invariant (c): `name`, if stored, is one writer's bytes, whole: every
/// writer writes one byte value throughout, so a mixture shows as two.
fn one_writer(memory: &InMemoryResultStore, name: &str) -> Result<(), String> {
    let Some(stored) = memory.stored(name) else {
        return Ok(());
    };
    let first = stored.first().copied();
    if stored.len() != RESULT_BYTES || stored.iter().any(|&byte| Some(byte) != first) {
        let mut values: Vec<u8> = stored.clone();
        values.dedup();
        return Err(format!(
            "(c) the stored result {name} is a mixture: {} bytes, values in order {values:?}",
            stored.len()
        ));
    }
    Ok(())
}

/// One holder: deliveries until its results are settled, each writing
/// every result not settled yet.
async fn holder(plan: &FaultPlan, store: &Arc<dyn ResultStore>, name: &'static str) {
    let mut settled = [false; RESULTS.len()];
    for delivery in 0..DELIVERIES {
        if settled.iter().all(|&done| done) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(plan.pick(0..2_000))).await;
        plan.note(format!("{name}: delivery {delivery} writes its results"));
        let fence = CancellationToken::new();
        let results = FencedResults::new(Arc::clone(store), JOB, fence.clone());
        // Its hold runs out at a random time (the fence closes).
        if plan.chance(30) {
            let after = Duration::from_millis(plan.pick(0..3_000));
            let (plan, fence) = (plan.clone(), fence.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                plan.note(format!("{name}: its hold runs out"));
                fence.cancel();
            });
        }
        // The process stops at any point: the delivery is cut off.
        let stop_after = plan
            .chance(20)
            .then(|| Duration::from_millis(plan.pick(0..3_000)));
        let writes = write_all(plan, &results, name, delivery, &mut settled);
        match stop_after {
            None => writes.await,
            Some(after) => {
                if tokio::time::timeout(after, writes).await.is_err() {
                    plan.note(format!("{name}: stops mid-delivery after {after:?}"));
                }
            }
        }
        fence.cancel();
    }
}

/// Writes each result not settled yet; a delivery ends at its first
/// error (the job is released and delivered again).
async fn write_all(
    plan: &FaultPlan,
    results: &FencedResults,
    name: &str,
    delivery: u64,
    settled: &mut [bool; RESULTS.len()],
) {
    for (index, result) in RESULTS.iter().enumerate() {
        if settled[index] {
            continue;
        }
        // Each writer's bytes are one value of its own: its name, its
        // delivery and the result.
        let value = (u8::from(name == "B") << 7) | ((delivery as u8) << 2) | index as u8;
        let written = put(results, result, value).await;
        match written {
            Ok(outcome) => {
                plan.note(format!("{name}: {result} {outcome:?}"));
                settled[index] = true;
            }
            Err(StorageError::Conflict { .. }) => {
                // The duplicate's settlement: another writer's is stored.
                plan.note(format!("{name}: {result} settled as a duplicate"));
                settled[index] = true;
            }
            Err(error) if error.is_transient() || is_fenced(&error) => {
                plan.note(format!("{name}: {result} failed ({error}); released"));
                return;
            }
            Err(error) => {
                plan.broken(format!(
                    "(e) {name}'s write of {result} failed and would count as a failure: {error}"
                ));
                return;
            }
        }
    }
}

fn is_fenced(error: &StorageError) -> bool {
    matches!(error, StorageError::JobCancelled { .. })
}

/// `put_new_file` of a result of `value` bytes, from an unnamed file.
async fn put(results: &FencedResults, name: &str, value: u8) -> Result<PutOutcome, StorageError> {
    let body = vec![value; RESULT_BYTES];
    let file = tempfile::tempfile().and_then(|mut file| file.write_all(&body).map(|()| file));
    let file = file.map_err(|error| StorageError::InvalidArgument(format!("no file: {error}")))?;
    results.put_new_file(name, file, RESULT_BYTES as u64).await
}
